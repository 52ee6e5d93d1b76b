// StandbyServer: what a ctrund replica that does not lead (ctrund --etcd)
// serves on its --listen address. Every call, of any service, is answered
// at once with UNAVAILABLE naming the leader, and the leader's HOST:PORT
// in the trailing metadata (kLeaderMetadataKey), so that clients that
// reached a standby, or whose leader became one, move on without waiting
// out a timeout; `ctrund status --endpoint <standby>` says who leads.
//
// It checks no token: it serves nothing but the leader's address, which
// every client has in its endpoint list already.
//
// Thread-safe. Destruction shuts it down.
#ifndef CTRUN_RENDEZVOUS_SERVER_STANDBY_SERVER_H_
#define CTRUN_RENDEZVOUS_SERVER_STANDBY_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/server/listener.h"

namespace ctrun {

struct StandbyOptions {
  Endpoint listen;
  std::optional<TlsServerFiles> tls;  // as the leader's: clients are alike
  // The leader's HOST:PORT, or none while an election runs. Called on
  // every call, from gRPC's threads.
  std::function<std::optional<std::string>()> leader;
};

class StandbyServer {
 public:
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for
  // unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      StandbyOptions options);
  ~StandbyServer();
  StandbyServer(const StandbyServer&) = delete;
  StandbyServer& operator=(const StandbyServer&) = delete;

  const Endpoint& endpoint() const { return bound_; }

  // Ends every call and closes the port (for the serving one to take it).
  // Idempotent.
  void Shutdown();

 private:
  class Service;
  StandbyServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  Endpoint bound_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_SERVER_STANDBY_SERVER_H_
