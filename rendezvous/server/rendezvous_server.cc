#include "rendezvous/server/rendezvous_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ctrun/v1/admin.grpc.pb.h"
#include "ctrun/v1/rendezvous.grpc.pb.h"
#include "ctrun/v1/store.grpc.pb.h"
#include "rendezvous/core/store_request.h"
#include "rendezvous/durable/durable_state.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/rpc/user_file.h"
#include "rendezvous/server/server_stream.h"

namespace ctrun {

namespace {

class SessionReactor;
class StorePipe;

// Where a session's messages go: its gRPC stream, or an agent of this
// process (LocalSessionSink). Enqueue and EnqueueFinish may be called under
// the service mutex (which fixes the order of messages); Flush without it.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  // Queues a message; dropped once the session is finishing.
  virtual void Enqueue(v1::ServerMessage message) = 0;
  // Ends the session with `status` once the queue is delivered. The first
  // status wins.
  virtual void EnqueueFinish(const absl::Status& status) = 0;
  // Delivers what is queued.
  virtual void Flush() = 0;
  // The service shuts down: ends the session if gRPC does not.
  virtual void EndAtShutdown() {}
};

// A store request parked in a job's store, as its stream tracks it.
struct Parked {
  v1::StoreScope scope;
  KvStore::WaiterId waiter;
};

// What a caller's credentials let it reach: every job, or one (a job
// token, auth.h).
struct Access {
  std::optional<std::string> job;
  bool Allows(const std::string& job_id) const {
    return !job || *job == job_id;
  }
  absl::Status Refusal(const std::string& job_id) const {
    return absl::PermissionDeniedError(absl::StrCat(
        "this token is for job '", *job, "', not job '", job_id, "'"));
  }
};

// What to do once the service mutex is released.
struct Delivery {
  std::vector<std::shared_ptr<SessionSink>> flush;
  std::vector<KvStore::Fired> fired;
  std::vector<std::pair<std::shared_ptr<StorePipe>, v1::StoreResponse>> replies;
  // Stores dropped enough to give memory back to the system.
  bool trim = false;
};

// A store request waiting for its turn.
struct QueuedStoreRequest {
  std::shared_ptr<StorePipe> pipe;
  v1::StoreRequest request;
};

// Store mutations applied but not yet committed: their stores are staging
// (kv_store.h) and their answers wait for the journal's commit.
struct StoreBatch {
  std::set<KvStore*> staging;
  std::vector<std::pair<std::shared_ptr<StorePipe>, v1::StoreResponse>> answers;
  // Over the whole batch: the streams whose changes were answered, and the
  // time spent committing them.
  absl::flat_hash_set<const StorePipe*> answered;
  absl::Duration committing;
};

}  // namespace

class RendezvousServer::Impl : public LocalRendezvous {
 public:
  explicit Impl(ServerOptions options)
      : options_(std::move(options)), core_(options_.limits) {}

  absl::Status Start();
  void Shutdown();
  const Endpoint& endpoint() const { return bound_; }

  // What the call may reach; UNAUTHENTICATED or PERMISSION_DENIED (and a
  // log line) unless it carries the token, a job token or an acceptable
  // munge credential.
  // `read_only` calls (the Admin service's) also take a munge credential
  // made for reading status only.
  absl::StatusOr<Access> Authorize(grpc::CallbackServerContext* ctx,
                                   const char* method,
                                   bool read_only = false) const;
  // OK for a credential of this service's uid for its job or, when
  // `read_only`, for reading status (MungePayload("")).
  absl::Status CheckMunge(const std::string& credential, bool read_only) const;
  // Whether requests may be served now (ServerOptions::may_serve).
  bool Serving() const { return !options_.may_serve || options_.may_serve(); }
  static absl::Status SteppingDown() {
    return absl::UnavailableError(
        "this ctrund is stepping down (its etcd lease may have lapsed); "
        "another replica takes over");
  }

  // Sessions.
  std::shared_ptr<SessionReactor> NewSession(grpc::CallbackServerContext* ctx);
  std::shared_ptr<LocalSession> OpenSession(Handlers handlers) override;
  void OnSessionMessage(SessionId id, const Access& access,
                        const v1::AgentMessage& message);
  void OnSessionClosed(SessionId id);
  void OnSessionDone(SessionId id);

  // Store streams. Answers `request` on `pipe`, now or, for a wait, when
  // it ends. Requests are applied in the order they come, in batches, so
  // that the mutations of concurrent requests share one commit: by the
  // caller that finds no batch running, or, when a commit waits on other
  // machines (etcd), by a thread of their own (CommitLoop).
  void ExecuteStore(const std::shared_ptr<StorePipe>& pipe,
                    const v1::StoreRequest& request);
  // Whether store requests are timed (only for the metrics).
  bool CountsStore() const { return options_.metrics != nullptr; }
  // Counts one store request answered (StorePipe::Reply).
  void CountStoreOperation(std::string_view kind, absl::Duration latency,
                           absl::StatusCode code) {
    if (options_.metrics) {
      options_.metrics->StoreOperation(kind, latency, code);
    }
  }
  // Drops the parked requests of a stream that ended.
  void CancelWaits(const absl::flat_hash_map<uint64_t, Parked>& parked);

  bool WaitUntilIdle(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return core_.num_jobs() == 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
  }

  std::vector<v1::JobStatus> ListJobs(const Access& access) {
    absl::MutexLock lock(&mu_);
    if (access.job) {
      auto job = core_.DescribeJob(*access.job, MonotonicNow());
      if (!job.ok()) return {};
      return {*std::move(job)};
    }
    return core_.ListJobs(MonotonicNow());
  }
  // For the service's own token only: hosts are not one job's business.
  std::vector<v1::QuarantinedNode> ListQuarantined(const Access& access) {
    if (access.job) return {};
    absl::MutexLock lock(&mu_);
    return core_.ListQuarantined(MonotonicNow());
  }
  absl::StatusOr<v1::JobStatus> DescribeJob(const Access& access,
                                            const std::string& id) {
    if (!access.Allows(id)) return access.Refusal(id);
    absl::MutexLock lock(&mu_);
    return core_.DescribeJob(id, MonotonicNow());
  }

 private:
  void WakeTimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(Delivery& delivery);
  Delivery StageLocked(Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The event log's lines and the metrics' counts of `effects`.
  void RecordEffectsLocked(const Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ServiceMetrics::Holding HoldingLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogEffectsLocked(const Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();
  // The gRPC server's settings and services.
  void Configure(grpc::ServerBuilder* builder);
  // ServerOptions::start_grpc_on_first_connection: accepts connections on
  // `listeners_` and hands each to gRPC, starting it at the first.
  void AcceptLoop();
  void HandOver(int fd);
  // Restores the jobs of the state directory (if any) into the core.
  absl::Status RestoreLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals what `effects` changed; no-op without a state directory.
  void JournalJobsLocked(const Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeCompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `queued` and delivers the answers; what committing cost.
  StoreBatch RunStoreBatch(std::vector<QueuedStoreRequest>& queued);
  // Applies a batch of store requests in order.
  StoreBatch RunStoreBatchLocked(std::vector<QueuedStoreRequest>& queued,
                                 Delivery* delivery)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one request; a mutation joins `batch` (and `*fired` is for a
  // read's waiters satisfied at once).
  void ApplyStoreLocked(QueuedStoreRequest& queued, StoreBatch* batch,
                        Delivery* delivery) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The store's committing thread, when a commit waits on other machines.
  void CommitLoop();
  // Commits the batch's mutations, or refuses them all when the journal
  // cannot, and queues their answers.
  void CommitLocked(StoreBatch* batch, Delivery* delivery)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether enough store memory was freed since the last trim to give it
  // back to the system.
  bool WantsTrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Start.
  const ServerOptions options_;
  Endpoint bound_;
  // Made in Start, or at the first connection by the accepting thread
  // (which then owns it until Shutdown has joined it).
  std::unique_ptr<grpc::Server> server_;
  std::vector<int> listeners_;
  int wake_acceptor_ = -1;  // an eventfd
  std::thread acceptor_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::thread timer_;

  mutable absl::Mutex mu_;
  RendezvousCore core_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, std::shared_ptr<SessionSink>> sessions_
      ABSL_GUARDED_BY(mu_);
  SessionId next_session_ ABSL_GUARDED_BY(mu_) = 1;
  // The time the timer thread sleeps until, and whether it must look again.
  absl::Time timer_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool timer_wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<DurableState> durable_ ABSL_GUARDED_BY(mu_);
  // The most store bytes held since memory was last given back.
  size_t store_bytes_peak_ ABSL_GUARDED_BY(mu_) = 0;

  // Store requests not yet applied, and whether a thread is applying them.
  absl::Mutex queue_mu_;
  std::vector<QueuedStoreRequest> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool applying_ ABSL_GUARDED_BY(queue_mu_) = false;
  // When commits go over the network: the committing thread, whether it
  // is to end, and the streams answered by its last commit that have not
  // sent again.
  std::thread committer_;
  bool committer_stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  absl::flat_hash_set<const StorePipe*> awaited_ ABSL_GUARDED_BY(queue_mu_);
};

namespace {

using Impl = RendezvousServer::Impl;

// One agent's session. Messages are queued under the Impl mutex (so that
// their order is the core's order) and written after it is released.
class SessionReactor final
    : public ServerStream<v1::AgentMessage, v1::ServerMessage>,
      public SessionSink {
  using Stream = ServerStream<v1::AgentMessage, v1::ServerMessage>;

 public:
  SessionReactor(Impl* impl, SessionId id) : impl_(impl), id_(id) {}
  void set_access(Access access) { access_ = std::move(access); }

  void Enqueue(v1::ServerMessage message) override {
    Stream::Enqueue(std::move(message));
  }
  void EnqueueFinish(const absl::Status& status) override {
    Stream::EnqueueFinish(status);
  }
  void Flush() override { Stream::Flush(); }

 private:
  void OnMessage(const v1::AgentMessage& message) override {
    impl_->OnSessionMessage(id_, access_, message);
  }
  // Half-closed or broken: either way the node has left; the core decides
  // what that means for its job.
  void OnPeerGone() override { impl_->OnSessionClosed(id_); }
  void OnStreamDone() override { impl_->OnSessionDone(id_); }

  Impl* const impl_;
  const SessionId id_;
  Access access_;  // set before the first message
};

// A session of an agent in this process (LocalRendezvous): its messages
// are handed to the agent's handlers in order, on the thread that flushes,
// one thread at a time.
class LocalSessionSink final
    : public SessionSink,
      public LocalSession,
      public std::enable_shared_from_this<LocalSessionSink> {
 public:
  LocalSessionSink(Impl* impl, LocalRendezvous::Handlers handlers)
      : impl_(impl), handlers_(std::move(handlers)) {}
  void set_id(SessionId id) { id_ = id; }

  void Enqueue(v1::ServerMessage message) override {
    absl::MutexLock lock(&mu_);
    if (!finish_) out_.push_back(std::move(message));
  }
  void EnqueueFinish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (!finish_) finish_ = status;
  }
  void Flush() override {
    // The agent may drop its last reference from within its handlers.
    const std::shared_ptr<LocalSessionSink> self = shared_from_this();
    {
      absl::MutexLock lock(&mu_);
      // The thread flushing already delivers what was queued meanwhile.
      if (flushing_ || done_) return;
      flushing_ = true;
    }
    while (true) {
      std::deque<v1::ServerMessage> batch;
      bool finish = false;
      absl::Status status;
      {
        absl::MutexLock lock(&mu_);
        if (out_.empty()) {
          flushing_ = false;
          if (!finish_) return;
          done_ = finish = true;
          status = *finish_;
        } else {
          batch.swap(out_);
        }
      }
      if (finish) {
        // As gRPC's OnDone: the service forgets the session, then the
        // agent learns its end.
        impl_->OnSessionDone(id_);
        if (handlers_.on_done) handlers_.on_done(status);
        return;
      }
      for (const v1::ServerMessage& message : batch) {
        if (handlers_.on_message) handlers_.on_message(message);
      }
    }
  }
  void EndAtShutdown() override {
    EnqueueFinish(absl::UnavailableError("the rendezvous shut down"));
    Flush();
  }

  void Send(const v1::AgentMessage& message) override {
    {
      absl::MutexLock lock(&mu_);
      if (left_ || finish_) return;
    }
    // The hosting agent speaks with the service's own credentials.
    impl_->OnSessionMessage(id_, Access{}, message);
  }
  void Leave() override {
    {
      absl::MutexLock lock(&mu_);
      if (left_) return;
      left_ = true;
    }
    // As a half-close or a broken stream: the node has left.
    impl_->OnSessionClosed(id_);
    EnqueueFinish(absl::OkStatus());
    Flush();
  }

 private:
  Impl* const impl_;
  const LocalRendezvous::Handlers handlers_;
  SessionId id_ = 0;  // set before it is shared

  absl::Mutex mu_;
  std::deque<v1::ServerMessage> out_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> finish_ ABSL_GUARDED_BY(mu_);
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
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

// A client's store stream. Requests are answered in any order; waiting
// ones are parked in the job's store and tracked here, so that they can be
// cancelled when the stream ends.
class StorePipe final
    : public ServerStream<v1::StoreRequest, v1::StoreResponse>,
      public std::enable_shared_from_this<StorePipe> {
 public:
  explicit StorePipe(Impl* impl) : impl_(impl) {}
  void set_access(Access access) { access_ = std::move(access); }
  const Access& access() const { return access_; }

  // Sends one response.
  void Reply(v1::StoreResponse response) {
    std::optional<Started> started;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = started_.find(response.id()); it != started_.end()) {
        started = it->second;
        started_.erase(it);
      }
    }
    if (started) {
      impl_->CountStoreOperation(
          started->kind, MonotonicNow() - started->at,
          static_cast<absl::StatusCode>(response.code()));
    }
    Enqueue(std::move(response));
    Flush();
  }
  void Track(uint64_t request_id, const v1::StoreScope& scope,
             KvStore::WaiterId waiter) {
    absl::MutexLock lock(&mu_);
    parked_[request_id] = {scope, waiter};
  }
  void Untrack(uint64_t request_id) {
    absl::MutexLock lock(&mu_);
    parked_.erase(request_id);
  }

 private:
  void OnMessage(const v1::StoreRequest& request) override {
    // The descriptor lookup and the map are the hot path's: none without
    // metrics.
    if (const auto* op =
            impl_->CountsStore()
                ? request.GetDescriptor()->FindFieldByNumber(request.op_case())
                : nullptr) {
      absl::MutexLock lock(&mu_);
      started_[request.id()] = {op->name(), MonotonicNow()};
    }
    impl_->ExecuteStore(shared_from_this(), request);
  }
  void OnPeerGone() override {
    absl::flat_hash_map<uint64_t, Parked> parked;
    {
      absl::MutexLock lock(&mu_);
      parked.swap(parked_);
    }
    impl_->CancelWaits(parked);
  }

  Impl* const impl_;
  Access access_;  // set before the first request
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Parked> parked_ ABSL_GUARDED_BY(mu_);
  // Requests not answered yet: their kind, and when they came.
  struct Started {
    std::string kind;
    absl::Time at;
  };
  absl::flat_hash_map<uint64_t, Started> started_ ABSL_GUARDED_BY(mu_);
};

class StoreService final : public v1::Store::CallbackService {
 public:
  explicit StoreService(Impl* impl) : impl_(impl) {}

  grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* Pipe(
      grpc::CallbackServerContext* ctx) override {
    auto pipe = std::make_shared<StorePipe>(impl_);
    if (auto access = impl_->Authorize(ctx, "Store"); !access.ok()) {
      pipe->Refuse(pipe, access.status());
    } else {
      pipe->set_access(*std::move(access));
      pipe->Begin(pipe);
    }
    return pipe.get();
  }

 private:
  Impl* const impl_;
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                               const absl::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

class AdminService final : public v1::Admin::CallbackService {
 public:
  explicit AdminService(Impl* impl) : impl_(impl) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsResponse* resp) override {
    auto access = impl_->Authorize(ctx, "ListJobs", /*read_only=*/true);
    if (!access.ok()) return Done(ctx, access.status());
    for (auto& job : impl_->ListJobs(*access)) {
      *resp->add_jobs() = std::move(job);
    }
    for (auto& node : impl_->ListQuarantined(*access)) {
      *resp->add_quarantined() = std::move(node);
    }
    return Done(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* DescribeJob(grpc::CallbackServerContext* ctx,
                                        const v1::DescribeJobRequest* req,
                                        v1::JobStatus* resp) override {
    auto access = impl_->Authorize(ctx, "DescribeJob", /*read_only=*/true);
    if (!access.ok()) return Done(ctx, access.status());
    auto job = impl_->DescribeJob(*access, req->job_id());
    if (job.ok()) *resp = std::move(*job);
    return Done(ctx, job.status());
  }

 private:
  Impl* const impl_;
};

}  // namespace

absl::Status Impl::Start() {
  if (options_.token.empty() && !options_.munge &&
      !ResolvesToLoopbackOnly(options_.listen.host)) {
    return absl::FailedPreconditionError(
        absl::StrCat("listening on ", options_.listen.ToString(),
                     " reaches beyond loopback, so a token is required "
                     "(ctrund --token-file FILE)"));
  }
  bool group_commits = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto s = RestoreLocked(); !s.ok()) return s;
    group_commits = durable_ && durable_->CommitsOverNetwork();
  }

  services_.push_back(std::make_unique<RendezvousService>(this));
  services_.push_back(std::make_unique<StoreService>(this));
  services_.push_back(std::make_unique<AdminService>(this));
  bound_ = options_.listen;
  if (options_.start_grpc_on_first_connection && !options_.tls) {
    auto listeners = ListenOn(options_.listen);
    if (!listeners.ok()) return listeners.status();
    listeners_ = std::move(listeners->fds);
    bound_.port = listeners->port;
    wake_acceptor_ = eventfd(0, EFD_CLOEXEC);
    if (wake_acceptor_ < 0) {
      for (int fd : listeners_) close(fd);
      listeners_.clear();
      return absl::InternalError(
          absl::StrCat("eventfd: ", std::strerror(errno)));
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
  } else {
    auto credentials = MakeServerCredentials(options_.tls);
    if (!credentials.ok()) return credentials.status();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options_.listen.ToString(), *credentials, &port);
    Configure(&builder);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", options_.listen.ToString(),
                       " (address in use, or not an address of this machine)"));
    }
    bound_.port = port;
  }
  if (options_.metrics) {
    options_.metrics->SetHolding([this] {
      absl::MutexLock lock(&mu_);
      return HoldingLocked();
    });
  }
  timer_ = std::thread([this] { TimerLoop(); });
  if (group_commits) {
    absl::MutexLock lock(&queue_mu_);
    applying_ = true;  // by the committer, for good
    committer_ = std::thread([this] { CommitLoop(); });
  }
  return absl::OkStatus();
}

void Impl::Configure(grpc::ServerBuilder* builder) {
  const size_t max_message =
      options_.max_message_bytes > 0
          ? options_.max_message_bytes
          : 2 * options_.limits.store.max_value_bytes + (64 << 10);
  builder->SetMaxReceiveMessageSize(static_cast<int>(max_message));
  SetListenerArguments(builder);
  for (auto& service : services_) builder->RegisterService(service.get());
}

void Impl::AcceptLoop() {
  std::vector<pollfd> polled;
  for (int fd : listeners_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_acceptor_, POLLIN, 0});
  bool told_out_of_room = false;
  while (true) {
    if (poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("the rendezvous stops accepting connections: poll: {}",
                    std::strerror(errno));
      return;
    }
    if (polled.back().revents != 0) return;  // Shutdown
    int out_of_room = 0;  // why accept failed, when for lack of room
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      int fd;
      while ((fd = accept4(polled[i].fd, nullptr, nullptr,
                           SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        HandOver(fd);
      }
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        out_of_room = errno;
      }
    }
    if (out_of_room == 0) {
      told_out_of_room = false;
      continue;
    }
    // The connection stays queued and the listener readable: polling again
    // at once would spin. Try again a little later (or stop at Shutdown).
    if (!told_out_of_room) {
      spdlog::warn(
          "the rendezvous cannot accept more connections ({}); trying "
          "again every 100 ms",
          std::strerror(out_of_room));
      told_out_of_room = true;
    }
    pollfd wake{wake_acceptor_, POLLIN, 0};
    if (poll(&wake, 1, 100) > 0) return;
  }
}

void Impl::HandOver(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  if (server_ == nullptr) {
    grpc::ServerBuilder builder;
    Configure(&builder);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      spdlog::error(
          "cannot start the rendezvous' gRPC server; connection "
          "refused");
      close(fd);
      return;
    }
  }
  grpc::AddInsecureChannelFromFd(server_.get(), fd);  // it owns fd now
}

void Impl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (options_.metrics) options_.metrics->SetHolding(nullptr);
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_acceptor_, &one, sizeof one);
    acceptor_.join();
  }
  for (int fd : listeners_) close(fd);
  listeners_.clear();
  if (wake_acceptor_ >= 0) close(wake_acceptor_);
  wake_acceptor_ = -1;
  if (server_) {
    // Open sessions never end by themselves: cancel them right away.
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  std::vector<std::shared_ptr<SessionSink>> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, sink] : sessions_) open.push_back(sink);
  }
  for (const auto& sink : open) sink->EndAtShutdown();
  if (timer_.joinable()) timer_.join();
  if (committer_.joinable()) {
    {
      absl::MutexLock lock(&queue_mu_);
      committer_stopping_ = true;
    }
    committer_.join();
  }
}

absl::StatusOr<Access> Impl::Authorize(grpc::CallbackServerContext* ctx,
                                       const char* method,
                                       bool read_only) const {
  if (!Serving()) return SteppingDown();
  if (options_.token.empty() && !options_.munge) return Access{};
  const auto& metadata = ctx->client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  const bool present = it != metadata.end();
  const absl::string_view value =
      present ? absl::string_view(it->second.data(), it->second.size())
              : absl::string_view();
  if (!options_.token.empty() && present) {
    if (BearerMatches(value, options_.token)) return Access{};
    if (auto job = JobAdmittedBy(value, options_.token)) return Access{job};
  }
  absl::Status refused;
  if (auto credential = MungeCredentialIn(value);
      options_.munge && credential) {
    refused = CheckMunge(*credential, read_only);
    if (refused.ok()) return Access{};
  } else if (!present) {
    refused = absl::UnauthenticatedError(
        options_.token.empty()
            ? "missing munge credential (this rendezvous authenticates "
              "with munge)"
            : "missing rendezvous token (give the token file the service "
              "was started with)");
  } else {
    refused = absl::UnauthenticatedError(options_.token.empty()
                                             ? "expected a munge credential"
                                             : "wrong rendezvous token");
  }
  spdlog::warn("refused {} from {}: {}", method, ctx->peer(),
               std::string(refused.message()));
  if (options_.metrics) options_.metrics->Refusal(method, refused.code());
  return refused;
}

absl::Status Impl::CheckMunge(const std::string& credential,
                              bool read_only) const {
  auto id = MungeDecode(options_.munge->socket, credential);
  if (!id.ok()) {
    // The caller's failure or munged's, but never a way in.
    return absl::UnauthenticatedError(id.status().message());
  }
  if (id->uid != getuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("munge credential of uid ", id->uid,
                     "; this rendezvous serves uid ", getuid()));
  }
  if (read_only && id->payload == MungePayload("")) return absl::OkStatus();
  if (id->payload != MungePayload(options_.munge->job_id)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "munge credential for another job; this rendezvous serves job '",
        options_.munge->job_id, "'"));
  }
  return absl::OkStatus();
}

std::shared_ptr<SessionReactor> Impl::NewSession(
    grpc::CallbackServerContext* ctx) {
  SessionId id;
  {
    absl::MutexLock lock(&mu_);
    id = next_session_++;
  }
  auto reactor = std::make_shared<SessionReactor>(this, id);
  auto access = Authorize(ctx, "Session");
  if (!access.ok()) {
    reactor->Refuse(reactor, access.status());
    return reactor;
  }
  const auto reach = access->job ? RendezvousCore::Reach::kOneJob
                                 : RendezvousCore::Reach::kService;
  reactor->set_access(*std::move(access));
  {
    absl::MutexLock lock(&mu_);
    sessions_.emplace(id, reactor);
    core_.OnSessionOpened(id, MonotonicNow(), reach);
    WakeTimerLocked();
  }
  reactor->Begin(reactor);
  return reactor;
}

std::shared_ptr<LocalSession> Impl::OpenSession(Handlers handlers) {
  auto sink = std::make_shared<LocalSessionSink>(this, std::move(handlers));
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      const SessionId id = next_session_++;
      sink->set_id(id);
      sessions_.emplace(id, sink);
      core_.OnSessionOpened(id, MonotonicNow(),
                            RendezvousCore::Reach::kService);
      WakeTimerLocked();
      return sink;
    }
  }
  sink->EndAtShutdown();
  return sink;
}

void Impl::OnSessionMessage(SessionId id, const Access& access,
                            const v1::AgentMessage& message) {
  // Unanswered: the service is about to end every session.
  if (!Serving()) return;
  Delivery delivery;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    if (message.has_join() && !access.Allows(message.join().job_id())) {
      core_.OnSessionClosed(id, MonotonicNow(), &effects);
      effects.finishes.emplace_back(id,
                                    access.Refusal(message.join().job_id()));
    } else {
      core_.OnMessage(id, message, MonotonicNow(), &effects);
    }
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

absl::Status Impl::RestoreLocked() {
  if (!options_.state_log) return absl::OkStatus();
  DurableState::Options durable_options;
  durable_options.fsync = options_.fsync;
  durable_options.open_log = options_.state_log;
  const std::string& where = options_.state_where;
  std::map<std::string, JournaledJob> jobs;
  auto durable = DurableState::Open(std::move(durable_options), &jobs);
  if (!durable.ok()) return durable.status();
  const absl::Time now = MonotonicNow();
  size_t nodes = 0;
  for (const auto& [id, job] : jobs) {
    const std::vector<std::pair<std::string, std::string>> keys(
        job.keys.begin(), job.keys.end());
    if (auto s =
            core_.Restore(job.snapshot, keys, options_.reconnect_grace, now);
        !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot restore ", where, ": ", s.message()));
    }
    nodes += job.snapshot.members_size();
    spdlog::info("restored job {} at round {} ({}) with {} keys", id,
                 job.snapshot.round(),
                 v1::JobStatus::Phase_Name(job.snapshot.phase()),
                 job.keys.size());
  }
  durable_ = *std::move(durable);
  if (auto s = durable_->Rewrite(core_.Checkpoint()); !s.ok()) return s;
  spdlog::info("state in {}: {} jobs restored, {} nodes have {} to resume",
               where, jobs.size(), nodes,
               absl::FormatDuration(options_.reconnect_grace));
  return absl::OkStatus();
}

void Impl::JournalJobsLocked(const Effects& effects) {
  // A service that is stopping ends its sessions without the jobs ending:
  // the next one resumes them.
  if (!durable_ || stopping_) return;
  if (effects.changed_jobs.empty() && !durable_->HasUnsavedJobs()) return;
  const absl::Time start = MonotonicNow();
  absl::Cleanup count = [&] {
    if (options_.metrics) options_.metrics->LogWrite(MonotonicNow() - start);
  };
  durable_->SaveJobs(
      effects.changed_jobs,
      [this](const std::string& id)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return core_.SnapshotJob(id); });
  MaybeCompactLocked();
}

void Impl::MaybeCompactLocked() {
  durable_->MaybeCompact([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return core_.Checkpoint();
  });
}

bool Impl::WantsTrimLocked() {
  // glibc keeps freed memory in its arenas; a daemon whose jobs ended
  // should not keep their stores' share.
  constexpr size_t kTrimAfterBytes = size_t{64} << 20;
  const size_t now = core_.store_bytes();
  store_bytes_peak_ = std::max(store_bytes_peak_, now);
  if (store_bytes_peak_ - now < kTrimAfterBytes) return false;
  store_bytes_peak_ = now;
  return true;
}

Delivery Impl::StageLocked(Effects& effects) {
  LogEffectsLocked(effects);
  RecordEffectsLocked(effects);
  JournalJobsLocked(effects);
  Delivery delivery;
  auto reactor_of = [this](SessionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                        mu_) -> std::shared_ptr<SessionSink> {
    auto it = sessions_.find(id);
    return it == sessions_.end() ? nullptr : it->second;
  };
  for (auto& [id, message] : effects.messages) {
    if (message.has_assignment() && durable_) {
      message.mutable_assignment()->set_resumable(true);
    }
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
  delivery.trim = WantsTrimLocked();
  WakeTimerLocked();
  return delivery;
}

void Impl::RecordEffectsLocked(const Effects& effects) {
  for (const v1::Event& event : effects.events) {
    if (options_.event_log) options_.event_log->Write("rendezvous", event);
    if (options_.metrics) options_.metrics->Count(event);
  }
  if (options_.metrics) {
    for (const auto& [id, status] : effects.finishes) {
      if (!status.ok()) options_.metrics->Refusal("Session", status.code());
    }
  }
}

ServiceMetrics::Holding Impl::HoldingLocked() const {
  ServiceMetrics::Holding h;
  for (const auto* name : {"collecting", "running", "finished", "failed"}) {
    h.jobs[name] = 0;
  }
  for (const auto* name : {"joined", "pending_rejoin", "active", "succeeded",
                           "waiting", "spare"}) {
    h.nodes[name] = 0;
  }
  int in_job = 0, resuming = 0;
  for (const v1::JobStatus& job : core_.ListJobs(MonotonicNow())) {
    ++h.jobs[absl::AsciiStrToLower(v1::JobStatus::Phase_Name(job.phase()))];
    for (const v1::NodeStatus& node : job.nodes()) {
      ++h.nodes[node.spare() ? std::string("spare")
                             : absl::AsciiStrToLower(
                                   v1::NodeStatus::State_Name(node.state()))];
      ++(node.resuming() ? resuming : in_job);
    }
  }
  h.sessions["in_job"] = in_job;
  h.sessions["resuming"] = resuming;
  h.sessions["not_joined"] =
      std::max(0, static_cast<int>(sessions_.size()) - in_job);
  h.store_bytes = static_cast<double>(core_.store_bytes());
  return h;
}

void Impl::LogEffectsLocked(const Effects& effects) {
  std::string last_failure;
  for (const auto& [id, message] : effects.messages) {
    if (message.has_assignment() && message.assignment().group_rank() == 0) {
      const auto& a = message.assignment();
      spdlog::info(
          "job {} round {} closed: {} nodes, world size {}, master {}:{}, "
          "restarts {}/{}",
          a.job_id(), a.round(), a.group_world_size(), a.world_size(),
          a.master_addr(), a.master_port(), a.restart_count(),
          a.max_restarts());
    } else if (message.has_resumed()) {
      spdlog::info("session {} resumed its node in round {}", id,
                   message.resumed().round());
    } else if (message.has_job_failed() &&
               message.job_failed().reason() != last_failure) {
      // Every node of the job gets the same reason in one batch; one line.
      last_failure = message.job_failed().reason();
      spdlog::error("job {} failed in round {}: {}",
                    message.job_failed().job_id(), message.job_failed().round(),
                    last_failure);
    }
  }
  for (const auto& [id, status] : effects.finishes) {
    spdlog::warn("session {} ended: {}", id, status.ToString());
  }
}

void Impl::ExecuteStore(const std::shared_ptr<StorePipe>& pipe,
                        const v1::StoreRequest& request) {
  if (!Serving()) {
    v1::StoreResponse response;
    response.set_id(request.id());
    response.set_code(static_cast<int32_t>(absl::StatusCode::kUnavailable));
    response.set_message(std::string(SteppingDown().message()));
    pipe->Reply(std::move(response));
    return;
  }
  if (!pipe->access().Allows(request.scope().job_id())) {
    spdlog::warn("refused a store request for job {}: the token is for {}",
                 request.scope().job_id(), *pipe->access().job);
    v1::StoreResponse response;
    response.set_id(request.id());
    response.set_code(
        static_cast<int32_t>(absl::StatusCode::kPermissionDenied));
    response.set_message(std::string(
        pipe->access().Refusal(request.scope().job_id()).message()));
    pipe->Reply(std::move(response));
    return;
  }
  {
    absl::MutexLock lock(&queue_mu_);
    queue_.push_back({pipe, request});
    awaited_.erase(pipe.get());
    if (applying_) return;  // that thread applies it
    applying_ = true;
  }
  while (true) {
    std::vector<QueuedStoreRequest> queued;
    {
      absl::MutexLock lock(&queue_mu_);
      if (queue_.empty()) {
        applying_ = false;
        return;
      }
      queued.swap(queue_);
    }
    RunStoreBatch(queued);
  }
}

// A thread of its own rather than a caller's: a stream's next request is
// read only once its callback returns, so a caller running batches would
// keep its own stream out of every batch after its first.
void Impl::CommitLoop() {
  while (true) {
    std::vector<QueuedStoreRequest> queued;
    {
      absl::MutexLock lock(&queue_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return !queue_.empty() || committer_stopping_;
      };
      queue_mu_.Await(absl::Condition(&ready));
      if (committer_stopping_) return;
      queued.swap(queue_);
    }
    const StoreBatch batch = RunStoreBatch(queued);
    // Group commit: the streams just answered usually send their next
    // change within a round trip. Run at once, the next batch would leave
    // them out, and blocking clients would settle into two groups taking
    // turns, each commit carrying half of them. So wait a little for them:
    // at most half of what the commit took, and 50 ms after a slow one,
    // which bounds what a client that does not come back costs the others.
    if (batch.answered.empty()) continue;
    const absl::Time until =
        absl::Now() + std::min(batch.committing / 2, absl::Milliseconds(50));
    absl::MutexLock lock(&queue_mu_);
    awaited_ = batch.answered;
    for (const auto& q : queue_) awaited_.erase(q.pipe.get());
    auto gathered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
      return awaited_.empty() || committer_stopping_;
    };
    queue_mu_.AwaitWithDeadline(absl::Condition(&gathered), until);
    awaited_.clear();
  }
}

StoreBatch Impl::RunStoreBatch(std::vector<QueuedStoreRequest>& queued) {
  Delivery delivery;
  StoreBatch batch;
  {
    absl::MutexLock lock(&mu_);
    batch = RunStoreBatchLocked(queued, &delivery);
  }
  Deliver(delivery);
  return batch;
}

StoreBatch Impl::RunStoreBatchLocked(std::vector<QueuedStoreRequest>& queued,
                                     Delivery* delivery) {
  StoreBatch batch;
  for (auto& q : queued) {
    const bool mutation = IsStoreMutation(q.request);
    // A read sees only what is committed; a change that would not fit in
    // the log's next commit goes into one of its own.
    if (!mutation ||
        (durable_ && !durable_->HasRoomFor(q.request.ByteSizeLong()))) {
      CommitLocked(&batch, delivery);
    }
    ApplyStoreLocked(q, &batch, delivery);
    if (mutation && (!durable_ || durable_->CommitsEachChange())) {
      CommitLocked(&batch, delivery);
    }
  }
  CommitLocked(&batch, delivery);
  if (durable_) MaybeCompactLocked();
  delivery->trim = WantsTrimLocked();
  WakeTimerLocked();
  return batch;
}

void Impl::ApplyStoreLocked(QueuedStoreRequest& queued, StoreBatch* batch,
                            Delivery* delivery) {
  const v1::StoreRequest& request = queued.request;
  v1::StoreResponse response;
  response.set_id(request.id());
  auto store = core_.Store(request.scope());
  absl::Status status = store.status();
  std::optional<KvStore::WaiterId> parked;
  if (store.ok()) {
    KvStore& kv = **store;
    const bool mutation = IsStoreMutation(request);
    const KvStore::Mark mark = mutation ? kv.Stage() : 0;
    if (mutation) batch->staging.insert(&kv);
    const uint64_t id = request.id();
    auto answer_later = [pipe = queued.pipe, id](v1::StoreResponse later) {
      pipe->Untrack(id);
      pipe->Reply(std::move(later));
    };
    std::vector<KvStore::Change> changed;
    status =
        ApplyStoreRequest(kv, request, MonotonicNow(), std::move(answer_later),
                          &response, &parked, &delivery->fired, &changed);
    if (status.ok() && durable_ && !changed.empty()) {
      if (auto s = durable_->AppendStoreChange(request.scope(), changed);
          !s.ok()) {
        kv.RollbackTo(mark);
        spdlog::error("store change not saved: {}", std::string(s.message()));
        status = absl::UnavailableError(absl::StrCat(
            "the service could not save the change: ", s.message()));
      }
    }
    if (status.ok() && mutation) {
      batch->answers.emplace_back(queued.pipe, std::move(response));
      return;
    }
  }
  if (parked) {
    if (*parked != 0)
      queued.pipe->Track(request.id(), request.scope(), *parked);
    return;
  }
  if (!status.ok()) {
    response.Clear();
    response.set_id(request.id());
  }
  response.set_code(static_cast<int32_t>(status.code()));
  response.set_message(std::string(status.message()));
  delivery->replies.emplace_back(queued.pipe, std::move(response));
}

void Impl::CommitLocked(StoreBatch* batch, Delivery* delivery) {
  if (batch->staging.empty()) return;
  const absl::Time start = MonotonicNow();
  const absl::Status committed =
      durable_ ? durable_->Commit() : absl::OkStatus();
  const absl::Duration took = MonotonicNow() - start;
  batch->committing += took;
  if (durable_ && options_.metrics) options_.metrics->LogWrite(took);
  for (KvStore* store : batch->staging) {
    if (!committed.ok()) store->RollbackTo(0);
    store->Commit(&delivery->fired);
  }
  if (!committed.ok()) {
    spdlog::error("{} store changes not saved: {}", batch->answers.size(),
                  std::string(committed.message()));
  }
  for (auto& [pipe, response] : batch->answers) {
    if (!committed.ok()) {
      const uint64_t id = response.id();
      response.Clear();
      response.set_id(id);
      response.set_code(static_cast<int32_t>(absl::StatusCode::kUnavailable));
      response.set_message(absl::StrCat(
          "the service could not save the change: ", committed.message()));
    }
    batch->answered.insert(pipe.get());
    delivery->replies.emplace_back(std::move(pipe), std::move(response));
  }
  batch->staging.clear();
  batch->answers.clear();
}

void Impl::CancelWaits(const absl::flat_hash_map<uint64_t, Parked>& parked) {
  if (parked.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, p] : parked) {
    if (auto store = core_.Store(p.scope); store.ok()) {
      (*store)->Cancel(p.waiter);
    }
  }
}

void Impl::WakeTimerLocked() {
  if (core_.NextDeadline() < timer_deadline_) timer_wake_ = true;
}

void Impl::Deliver(Delivery& delivery) {
  for (auto& reactor : delivery.flush) reactor->Flush();
  for (auto& [pipe, response] : delivery.replies) {
    pipe->Reply(std::move(response));
  }
  for (auto& fired : delivery.fired) fired.callback(std::move(fired.result));
  if (delivery.trim) malloc_trim(0);
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
        absl::Now() +
        std::min(RendezvousCore::kTickAtLeastEvery, timer_deadline_ - now);
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

LocalRendezvous* RendezvousServer::local() { return impl_.get(); }

void RendezvousServer::Shutdown() { impl_->Shutdown(); }

bool RendezvousServer::WaitUntilIdle(absl::Duration timeout) {
  return impl_->WaitUntilIdle(timeout);
}

}  // namespace ctrun
