#include "rendezvous/rendezvous_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ctrun/v1/admin.grpc.pb.h"
#include "ctrun/v1/rendezvous.grpc.pb.h"
#include "ctrun/v1/store.grpc.pb.h"
#include "rendezvous/auth.h"
#include "rendezvous/grpc_status.h"

namespace ctrun {

absl::Time MonotonicNow() {
  return absl::UnixEpoch() +
         absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

namespace {

class SessionReactor;

// What to do once the service mutex is released.
struct Delivery {
  std::vector<std::shared_ptr<SessionReactor>> flush;
  std::vector<KvStore::Fired> fired;
};

}  // namespace

class RendezvousServer::Impl {
 public:
  explicit Impl(ServerOptions options)
      : options_(std::move(options)), core_(options_.limits) {}

  absl::Status Start();
  void Shutdown();
  const Endpoint& endpoint() const { return bound_; }

  // UNAUTHENTICATED (and a log line) unless the call carries the token.
  absl::Status Authorize(grpc::CallbackServerContext* ctx,
                         const char* method) const;

  // Sessions.
  std::shared_ptr<SessionReactor> NewSession(grpc::CallbackServerContext* ctx);
  void OnSessionMessage(SessionId id, const v1::AgentMessage& message);
  void OnSessionClosed(SessionId id);
  void OnSessionDone(SessionId id);

  // Runs `op` on the scope's store under the mutex, then its completions.
  template <typename Op>
  absl::Status WithStore(const v1::StoreScope& scope, Op op) {
    Delivery delivery;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      auto store = core_.Store(scope);
      status = store.ok() ? op(**store, &delivery.fired) : store.status();
      WakeTimerLocked();
    }
    Deliver(delivery);
    return status;
  }

  absl::StatusOr<std::vector<v1::JobStatus>> ListJobs() {
    absl::MutexLock lock(&mu_);
    return core_.ListJobs(MonotonicNow());
  }
  absl::StatusOr<v1::JobStatus> DescribeJob(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return core_.DescribeJob(id, MonotonicNow());
  }

  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  RendezvousCore& core() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return core_; }
  void WakeTimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(Delivery& delivery);

 private:
  Delivery StageLocked(Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogEffectsLocked(const Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  // Constant after Start.
  const ServerOptions options_;
  Endpoint bound_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::thread timer_;

  mutable absl::Mutex mu_;
  RendezvousCore core_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, std::shared_ptr<SessionReactor>> sessions_
      ABSL_GUARDED_BY(mu_);
  SessionId next_session_ ABSL_GUARDED_BY(mu_) = 1;
  // The time the timer thread sleeps until, and whether it must look again.
  absl::Time timer_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool timer_wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Jobs whose failure was logged, so that N agents make one line.
  absl::flat_hash_set<std::string> logged_failures_ ABSL_GUARDED_BY(mu_);
};

namespace {

using Impl = RendezvousServer::Impl;

// One agent's session stream. Owned by itself (self_) from creation until
// gRPC calls OnDone, and shared with the Impl's session map so that messages
// can be queued to it. Messages are queued under the Impl mutex (so their
// order is the core's order) and written one at a time after it is released.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  SessionReactor(Impl* impl, SessionId id) : impl_(impl), id_(id) {}

  void Begin(std::shared_ptr<SessionReactor> self) {
    self_ = std::move(self);
    StartRead(&in_);
  }

  // Refuses the stream before reading anything.
  void Refuse(std::shared_ptr<SessionReactor> self, const absl::Status& why) {
    self_ = std::move(self);
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    Finish(ToGrpcStatus(why));
  }

  void Enqueue(v1::ServerMessage message) {
    absl::MutexLock lock(&mu_);
    if (broken_ || finish_) return;
    out_.push_back(std::move(message));
  }
  void EnqueueFinish(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (!finish_) finish_ = ToGrpcStatus(status);
  }

  // Starts the next write, or the finish once everything is written.
  void Flush() {
    const v1::ServerMessage* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (!out_.empty() && !broken_) {
        writing_ = true;
        next = &out_.front();  // deque elements stay put on push_back
      } else if (finish_) {
        finished_ = true;
        finish = *finish_;
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(*finish);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent half-closed or the stream broke: either way the node has
      // left. The core decides what that means for its job.
      impl_->OnSessionClosed(id_);
      EnqueueFinish(absl::OkStatus());
      Flush();
      return;
    }
    impl_->OnSessionMessage(id_, in_);
    {
      absl::MutexLock lock(&mu_);
      if (finish_ || finished_) return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      out_.pop_front();
      if (!ok) {
        broken_ = true;
        out_.clear();
      }
    }
    Flush();
  }

  void OnDone() override {
    impl_->OnSessionDone(id_);
    // Last use of `this`: the map's reference is gone, so this may free it.
    std::shared_ptr<SessionReactor> self = std::move(self_);
  }

 private:
  Impl* const impl_;
  const SessionId id_;
  v1::AgentMessage in_;  // only touched by the read chain
  std::shared_ptr<SessionReactor> self_;

  absl::Mutex mu_;
  std::deque<v1::ServerMessage> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(Impl* impl) : impl_(impl) {}

  grpc::ServerBidiReactor<v1::AgentMessage, v1::ServerMessage>* Session(
      grpc::CallbackServerContext* ctx) override {
    auto reactor = impl_->NewSession(ctx);
    return reactor.get();
  }

 private:
  Impl* const impl_;
};

// A store call that may wait. Whoever removes its waiter from the store
// (under the Impl mutex) finishes it: the store's callback when the keys
// arrive, the deadline passes or the round ends; or OnCancel.
class ParkedCall final : public grpc::ServerUnaryReactor {
 public:
  ParkedCall(Impl* impl, v1::StoreScope scope)
      : impl_(impl), scope_(std::move(scope)) {}

  // Called under the Impl mutex once the waiter is parked. False when the
  // call was cancelled before: the caller then cancels the waiter itself.
  bool Attach(KvStore::WaiterId id) {
    if (cancelled_) return false;
    waiter_ = id;
    return true;
  }

  void OnCancel() override {
    bool cancelled = false;
    {
      absl::MutexLock lock(&impl_->mu());
      cancelled_ = true;
      auto store = impl_->core().Store(scope_);
      cancelled = waiter_ != 0 && store.ok() && (*store)->Cancel(waiter_);
    }
    if (cancelled) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  Impl* const impl_;
  const v1::StoreScope scope_;
  // Guarded by the Impl mutex.
  KvStore::WaiterId waiter_ = 0;
  bool cancelled_ = false;
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                               const absl::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

class StoreService final : public v1::Store::CallbackService {
 public:
  explicit StoreService(Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx,
                                const v1::SetRequest* req,
                                v1::SetResponse*) override {
    return Run(ctx, "Set", req->scope(), [&](KvStore& s, auto* fired) {
      return s.Set(req->key(), req->value(), fired);
    });
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx,
                                const v1::GetRequest* req,
                                v1::GetResponse* resp) override {
    return Park(ctx, "Get", req->scope(), {req->key()},
                req->wait_timeout_ms(), [resp](KvStore::Values values) {
                  resp->set_value(std::move(values.front()));
                });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx,
                                const v1::AddRequest* req,
                                v1::AddResponse* resp) override {
    return Run(ctx, "Add", req->scope(), [&](KvStore& s, auto* fired) {
      auto value = s.Add(req->key(), req->delta(), fired);
      if (value.ok()) resp->set_value(*value);
      return value.status();
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const v1::CompareSetRequest* req,
                                       v1::CompareSetResponse* resp) override {
    return Run(ctx, "CompareSet", req->scope(), [&](KvStore& s, auto* fired) {
      auto r = s.CompareSet(req->key(), req->expected(), req->desired(), fired);
      if (!r.ok()) return r.status();
      resp->set_swapped(r->swapped);
      resp->set_value(std::move(r->value));
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const v1::DeleteRequest* req,
                                   v1::DeleteResponse* resp) override {
    return Run(ctx, "Delete", req->scope(), [&](KvStore& s, auto*) {
      auto deleted = s.Delete(req->key());
      if (deleted.ok()) resp->set_deleted(*deleted);
      return deleted.status();
    });
  }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const v1::CheckRequest* req,
                                  v1::CheckResponse* resp) override {
    return Run(ctx, "Check", req->scope(), [&](KvStore& s, auto*) {
      auto all = s.Check({req->keys().begin(), req->keys().end()});
      if (all.ok()) resp->set_all_set(*all);
      return all.status();
    });
  }

  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx,
                                    const v1::NumKeysRequest* req,
                                    v1::NumKeysResponse* resp) override {
    return Run(ctx, "NumKeys", req->scope(), [&](KvStore& s, auto*) {
      resp->set_num_keys(s.NumKeys());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx,
                                     const v1::MultiGetRequest* req,
                                     v1::MultiGetResponse* resp) override {
    return Park(ctx, "MultiGet", req->scope(),
                {req->keys().begin(), req->keys().end()},
                req->wait_timeout_ms(), [resp](KvStore::Values values) {
                  for (auto& v : values) resp->add_values(std::move(v));
                });
  }

  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const v1::MultiSetRequest* req,
                                     v1::MultiSetResponse*) override {
    return Run(ctx, "MultiSet", req->scope(), [&](KvStore& s, auto* fired) {
      std::vector<std::pair<std::string, std::string>> kvs;
      kvs.reserve(req->entries_size());
      for (const auto& e : req->entries()) kvs.emplace_back(e.key(), e.value());
      return s.MultiSet(std::move(kvs), fired);
    });
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const v1::WaitRequest* req,
                                 v1::WaitResponse*) override {
    if (req->timeout_ms() <= 0) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "wait timeout_ms must be > 0, got ",
                           req->timeout_ms())));
    }
    return Park(ctx, "Wait", req->scope(),
                {req->keys().begin(), req->keys().end()}, req->timeout_ms(),
                [](KvStore::Values) {});
  }

 private:
  template <typename Op>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx,
                                const char* method,
                                const v1::StoreScope& scope, Op op) {
    if (auto s = impl_->Authorize(ctx, method); !s.ok()) return Done(ctx, s);
    return Done(ctx, impl_->WithStore(scope, op));
  }

  // Answers at once when the keys are set or the call does not wait;
  // otherwise parks the call until they are.
  template <typename Fill>
  grpc::ServerUnaryReactor* Park(grpc::CallbackServerContext* ctx,
                                 const char* method,
                                 const v1::StoreScope& scope,
                                 std::vector<std::string> keys,
                                 int64_t wait_ms, Fill fill) {
    if (auto s = impl_->Authorize(ctx, method); !s.ok()) return Done(ctx, s);
    if (wait_ms < 0) {
      return Done(ctx, absl::InvalidArgumentError(absl::StrCat(
                           "wait timeout of ", wait_ms, " ms must be >= 0")));
    }
    if (wait_ms == 0) {
      return Done(ctx, impl_->WithStore(scope, [&](KvStore& s, auto*) {
        auto values = s.MultiGet(keys);
        if (values.ok()) fill(std::move(*values));
        return values.status();
      }));
    }
    auto* call = new ParkedCall(impl_, scope);
    const absl::Time deadline = MonotonicNow() + absl::Milliseconds(wait_ms);
    auto callback = [call, fill](absl::StatusOr<KvStore::Values> result) {
      if (result.ok()) fill(std::move(*result));
      call->Finish(ToGrpcStatus(result.status()));
    };
    const absl::Status parked = impl_->WithStore(
        scope, [&](KvStore& s, std::vector<KvStore::Fired>* fired) {
          auto id =
              s.Park(std::move(keys), deadline, std::move(callback), fired);
          if (!id.ok()) return id.status();
          if (*id != 0 && !call->Attach(*id)) {
            s.Cancel(*id);
            return absl::CancelledError("the call was cancelled");
          }
          return absl::OkStatus();
        });
    if (!parked.ok()) call->Finish(ToGrpcStatus(parked));
    return call;
  }

  Impl* const impl_;
};

class AdminService final : public v1::Admin::CallbackService {
 public:
  explicit AdminService(Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsResponse* resp) override {
    if (auto s = impl_->Authorize(ctx, "ListJobs"); !s.ok()) {
      return Done(ctx, s);
    }
    auto jobs = impl_->ListJobs();
    for (auto& job : *jobs) *resp->add_jobs() = std::move(job);
    return Done(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* DescribeJob(grpc::CallbackServerContext* ctx,
                                        const v1::DescribeJobRequest* req,
                                        v1::JobStatus* resp) override {
    if (auto s = impl_->Authorize(ctx, "DescribeJob"); !s.ok()) {
      return Done(ctx, s);
    }
    auto job = impl_->DescribeJob(req->job_id());
    if (job.ok()) *resp = std::move(*job);
    return Done(ctx, job.status());
  }

 private:
  Impl* const impl_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const std::optional<TlsServerFiles>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  auto cert = ReadFile(tls->cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(tls->key_file, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      tls->client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls->client_ca_file.empty()) {
    auto ca = ReadFile(tls->client_ca_file, "TLS client CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::Status Impl::Start() {
  if (options_.token.empty() && !IsLoopbackHost(options_.listen.host)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", options_.listen.ToString(),
        " reaches beyond loopback, so a token is required "
        "(ctrund --token-file FILE)"));
  }
  auto credentials = MakeCredentials(options_.tls);
  if (!credentials.ok()) return credentials.status();

  const size_t max_message =
      options_.max_message_bytes > 0
          ? options_.max_message_bytes
          : 2 * options_.limits.store.max_value_bytes + (64 << 10);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen.ToString(), *credentials, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  // A dead peer's connection is noticed by TCP itself; these pings find
  // connections that vanished without a reset (a partitioned host).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             5'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  services_.push_back(std::make_unique<RendezvousService>(this));
  services_.push_back(std::make_unique<StoreService>(this));
  services_.push_back(std::make_unique<AdminService>(this));
  for (auto& service : services_) builder.RegisterService(service.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options_.listen.ToString(),
        " (address in use, or not an address of this machine)"));
  }
  bound_ = options_.listen;
  bound_.port = port;
  timer_ = std::thread([this] { TimerLoop(); });
  return absl::OkStatus();
}

void Impl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (server_) {
    // Open sessions never end by themselves: cancel them right away.
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  if (timer_.joinable()) timer_.join();
}

absl::Status Impl::Authorize(grpc::CallbackServerContext* ctx,
                             const char* method) const {
  if (options_.token.empty()) return absl::OkStatus();
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  const bool present = it != metadata.end();
  if (present && BearerMatches(absl::string_view(it->second.data(),
                                                it->second.size()),
                               options_.token)) {
    return absl::OkStatus();
  }
  spdlog::warn("refused {} from {}: {} token", method, ctx->peer(),
               present ? "wrong" : "missing");
  return absl::UnauthenticatedError(
      present ? "wrong rendezvous token"
              : "missing rendezvous token (give the token file the service "
                "was started with)");
}

std::shared_ptr<SessionReactor> Impl::NewSession(
    grpc::CallbackServerContext* ctx) {
  SessionId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_session_++;
  }
  auto reactor = std::make_shared<SessionReactor>(this, id);
  if (auto s = Authorize(ctx, "Session"); !s.ok()) {
    reactor->Refuse(reactor, s);
    return reactor;
  }
  {
    absl::MutexLock lock(&mu_);
    sessions_.emplace(id, reactor);
  }
  reactor->Begin(reactor);
  return reactor;
}

void Impl::OnSessionMessage(SessionId id, const v1::AgentMessage& message) {
  Delivery delivery;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    core_.OnMessage(id, message, MonotonicNow(), &effects);
    delivery = StageLocked(effects);
  }
  Deliver(delivery);
}

void Impl::OnSessionClosed(SessionId id) {
  Delivery delivery;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    core_.OnSessionClosed(id, MonotonicNow(), &effects);
    delivery = StageLocked(effects);
  }
  Deliver(delivery);
}

void Impl::OnSessionDone(SessionId id) {
  // A session cancelled without a failed read (server shutdown) still
  // leaves its job.
  OnSessionClosed(id);
  absl::MutexLock lock(&mu_);
  sessions_.erase(id);
}

Delivery Impl::StageLocked(Effects& effects) {
  LogEffectsLocked(effects);
  Delivery delivery;
  auto reactor_of = [this](SessionId id) -> std::shared_ptr<SessionReactor> {
    auto it = sessions_.find(id);
    return it == sessions_.end() ? nullptr : it->second;
  };
  for (auto& [id, message] : effects.messages) {
    if (auto r = reactor_of(id)) {
      r->Enqueue(std::move(message));
      delivery.flush.push_back(std::move(r));
    }
  }
  for (auto& [id, status] : effects.finishes) {
    if (auto r = reactor_of(id)) {
      r->EnqueueFinish(status);
      delivery.flush.push_back(std::move(r));
    }
  }
  delivery.fired = std::move(effects.fired);
  WakeTimerLocked();
  return delivery;
}

void Impl::LogEffectsLocked(const Effects& effects) {
  for (const auto& [id, message] : effects.messages) {
    if (message.has_assignment() && message.assignment().group_rank() == 0) {
      const auto& a = message.assignment();
      spdlog::info(
          "job {} round {} closed: {} nodes, world size {}, master {}:{}, "
          "restarts {}/{}",
          a.job_id(), a.round(), a.group_world_size(), a.world_size(),
          a.master_addr(), a.master_port(), a.restart_count(),
          a.max_restarts());
    } else if (message.has_job_failed()) {
      // Every node gets the same reason; one line is enough.
      if (logged_failures_.insert(message.job_failed().reason()).second) {
        spdlog::error("job failed: {}", message.job_failed().reason());
      }
    }
  }
  for (const auto& [id, status] : effects.finishes) {
    spdlog::warn("session {} ended: {}", id, status.ToString());
  }
}

void Impl::WakeTimerLocked() {
  if (core_.NextDeadline() < timer_deadline_) timer_wake_ = true;
}

void Impl::Deliver(Delivery& delivery) {
  for (auto& reactor : delivery.flush) reactor->Flush();
  for (auto& fired : delivery.fired) fired.callback(std::move(fired.result));
}

void Impl::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = MonotonicNow();
    Effects effects;
    core_.Tick(now, &effects);
    Delivery delivery = StageLocked(effects);
    if (!delivery.flush.empty() || !delivery.fired.empty()) {
      mu_.Unlock();
      Deliver(delivery);
      mu_.Lock();
      continue;
    }
    timer_deadline_ = core_.NextDeadline();
    timer_wake_ = false;
    // The core's times are monotonic; absl waits on the wall clock.
    const absl::Time wall_deadline =
        timer_deadline_ == absl::InfiniteFuture()
            ? absl::Now() + absl::Seconds(1)
            : absl::Now() + (timer_deadline_ - now);
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return timer_wake_ || stopping_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), wall_deadline);
    timer_deadline_ = absl::InfiniteFuture();
  }
}

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RendezvousServer::~RendezvousServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    ServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (auto s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<RendezvousServer>(
      new RendezvousServer(std::move(impl)));
}

const Endpoint& RendezvousServer::endpoint() const { return impl_->endpoint(); }

void RendezvousServer::Shutdown() { impl_->Shutdown(); }

}  // namespace ctrun
