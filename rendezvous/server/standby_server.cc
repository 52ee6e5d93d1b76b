#include "rendezvous/server/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rendezvous/rpc/grpc_status.h"

namespace ctrun {

// Every method of every service lands here, as a generic call: the
// standby needs no message, so it reads none and finishes at once.
class StandbyServer::Service final : public grpc::CallbackGenericService {
 public:
  explicit Service(StandbyOptions options) : options_(std::move(options)) {}

  // The address it listens on, port included, once bound.
  void set_self(const Endpoint& bound) {
    absl::MutexLock lock(&mu_);
    self_ = bound.ToString();
  }

 private:
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refusal(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    std::string self;
    {
      absl::MutexLock lock(&mu_);
      self = self_.empty() ? options_.listen.ToString() : self_;
    }
    std::optional<std::string> leader = options_.leader();
    if (!leader) {
      // Named empty: a standby, with nobody to name yet. A client retries
      // its request within its time rather than giving up at once.
      context->AddTrailingMetadata(kLeaderMetadataKey, "");
      return new Refusal(grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("the ctrund replica at ", self,
                       " stands by and no replica leads right now (an "
                       "election is under way); try again in a moment")));
    }
    context->AddTrailingMetadata(kLeaderMetadataKey, *leader);
    return new Refusal(
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat("the ctrund replica at ", self,
                                  " stands by; the leader is ", *leader)));
  }

  const StandbyOptions options_;
  absl::Mutex mu_;
  std::string self_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    StandbyOptions options) {
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<StandbyServer> standby(new StandbyServer());
  const Endpoint listen = options.listen;
  standby->service_ = std::make_unique<Service>(std::move(options));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen.ToString(), *credentials, &port);
  SetListenerArguments(&builder);
  builder.RegisterCallbackGenericService(standby->service_.get());
  standby->server_ = builder.BuildAndStart();
  if (standby->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen.ToString(),
                     " (address in use, or not an address of this machine)"));
  }
  standby->bound_ = listen;
  standby->bound_.port = port;
  standby->service_->set_self(standby->bound_);
  return standby;
}

StandbyServer::~StandbyServer() { Shutdown(); }

void StandbyServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
}

}  // namespace ctrun
