#include "rendezvous/client/client.h"

#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "rendezvous/client/client_stream.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/grpc_status.h"
#include "rendezvous/rpc/user_file.h"

namespace ctrun {

// What copies of a Connection share: the channel to the endpoints given,
// and the one to the leader a standby named, made alike. Both are made at
// first use: making credentials starts gRPC (its threads among others),
// which an agent that only talks to a rendezvous in its own process never
// needs.
struct Connection::Route {
  std::string target;
  std::optional<std::string> tls_roots;  // PEM; none: plain text
  grpc::ChannelArguments args;

  absl::Mutex mu;
  std::shared_ptr<grpc::ChannelCredentials> credentials ABSL_GUARDED_BY(mu);
  std::shared_ptr<grpc::Channel> listed ABSL_GUARDED_BY(mu);
  std::string leader ABSL_GUARDED_BY(mu);
  std::shared_ptr<grpc::Channel> to_leader ABSL_GUARDED_BY(mu);

  std::shared_ptr<grpc::Channel> ChannelLocked(const std::string& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!credentials) {
      if (tls_roots) {
        grpc::SslCredentialsOptions ssl;
        ssl.pem_root_certs = *tls_roots;
        credentials = grpc::SslCredentials(ssl);
      } else {
        credentials = grpc::InsecureChannelCredentials();
      }
    }
    return grpc::CreateCustomChannel(to, credentials, args);
  }
};

absl::StatusOr<Connection> Connection::Open(const ConnectionOptions& options) {
  auto endpoints = ParseEndpointList(options.endpoint);
  if (!endpoints.ok()) return endpoints.status();
  for (const Endpoint& e : *endpoints) {
    if (e.port == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint '", e.ToString(), "' needs a port other than 0"));
    }
  }
  auto target = ChannelTarget(*endpoints);
  if (!target.ok()) return target.status();
  std::optional<std::string> tls_roots;
  grpc::ChannelArguments args;
  if (!options.tls_ca_file.empty()) {
    auto pem = ReadUserFile(options.tls_ca_file, "TLS CA file", kMaxPemBytes);
    if (!pem.ok()) return pem.status();
    tls_roots = *std::move(pem);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  if (options.own_tcp_connection) {
    static std::atomic<int> next_channel{0};
    args.SetInt("ctrun.channel_id", next_channel++);
  }
  // Fail fast and retry in the agent, rather than queueing calls for long.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);

  Connection c;
  c.endpoint_ = JoinEndpoints(*endpoints);
  c.token_ = options.token;
  if (options.munge && options.token.empty()) {
    // Fails here, with munge's reason, rather than on every call.
    auto probe =
        MungeEncode(options.munge->socket, MungePayload(options.munge->job_id));
    if (!probe.ok()) return probe.status();
    c.munge_ = options.munge;
  }
  c.local_ = options.local;
  c.route_ = std::make_shared<Route>();
  c.route_->target = *std::move(target);
  c.route_->tls_roots = std::move(tls_roots);
  c.route_->args = args;
  return c;
}

Connection::Target Connection::target() const {
  absl::MutexLock lock(&route_->mu);
  if (route_->to_leader) return {route_->to_leader, true};
  if (!route_->listed) route_->listed = route_->ChannelLocked(route_->target);
  return {route_->listed, false};
}

std::string Connection::leader() const {
  absl::MutexLock lock(&route_->mu);
  return route_->leader;
}

Connection::Heard Connection::Follow(const grpc::ClientContext& context,
                                     const absl::Status& status) const {
  if (!absl::IsUnavailable(status)) return Heard::kNothing;
  const auto& trailers = context.GetServerTrailingMetadata();
  auto hint = trailers.find(kLeaderMetadataKey);
  absl::MutexLock lock(&route_->mu);
  if (hint == trailers.end() || hint->second.empty()) {
    // The leader went away, or stepped down, or a standby knows no leader
    // yet: ask the list again, where a standby names its successor.
    route_->leader.clear();
    route_->to_leader.reset();
    return hint == trailers.end() ? Heard::kGone : Heard::kNoLeader;
  }
  const std::string leader(hint->second.data(), hint->second.size());
  if (leader != route_->leader) {
    route_->leader = leader;
    route_->to_leader = route_->ChannelLocked(leader);
  }
  return Heard::kLeader;
}

void Connection::Prepare(grpc::ClientContext* context,
                         absl::Duration timeout) const {
  if (!token_.empty()) {
    context->AddMetadata(kAuthMetadataKey, BearerValue(token_));
  } else if (munge_) {
    // Without one the service answers UNAUTHENTICATED, which says why.
    if (auto credential =
            MungeEncode(munge_->socket, MungePayload(munge_->job_id));
        credential.ok()) {
      context->AddMetadata(kAuthMetadataKey, MungeValue(*credential));
    }
  }
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
}

// --- StoreClient ------------------------------------------------------------

// The stream behind a StoreClient: requests out, responses matched to their
// waiting callers by id.
class StoreClient::Pipe final
    : public ClientStream<v1::StoreRequest, v1::StoreResponse> {
 public:
  struct Slot {
    absl::Notification done;
    absl::StatusOr<v1::StoreResponse> result;
  };

  // `on_leader`: opened on the leader's channel (Connection::Target).
  Pipe(Connection connection, bool on_leader)
      : connection_(std::move(connection)), on_leader_(on_leader) {}

  void Register(uint64_t id, std::shared_ptr<Slot> slot) {
    absl::MutexLock lock(&mu_);
    pending_[id] = std::move(slot);
  }
  void Abandon(uint64_t id) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
  }
  bool open() {
    absl::MutexLock lock(&mu_);
    return !finished_;
  }
  // Whether a standby refused the stream (naming the leader, or during an
  // election): none of its requests was done.
  bool refused_by_standby() const {
    absl::MutexLock lock(&mu_);
    return heard_ == Connection::Heard::kLeader ||
           heard_ == Connection::Heard::kNoLeader;
  }
  // Whether the stream ended so that the next one may fare better: a
  // standby refused it, or the leader it went to is unreachable.
  bool rerouted() const {
    absl::MutexLock lock(&mu_);
    return heard_ == Connection::Heard::kLeader ||
           heard_ == Connection::Heard::kNoLeader ||
           (on_leader_ && heard_ == Connection::Heard::kGone);
  }

 private:
  void OnMessage(const v1::StoreResponse& response) override {
    std::shared_ptr<Slot> slot;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(response.id());
      if (it == pending_.end()) return;  // its caller gave up
      slot = std::move(it->second);
      pending_.erase(it);
    }
    if (response.code() != 0) {
      slot->result = absl::Status(
          static_cast<absl::StatusCode>(response.code()), response.message());
    } else {
      slot->result = response;
    }
    slot->done.Notify();
  }

  void OnFinished(const absl::Status& status) override {
    const Connection::Heard heard = connection_.Follow(context(), status);
    absl::flat_hash_map<uint64_t, std::shared_ptr<Slot>> pending;
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      heard_ = heard;
      pending.swap(pending_);
    }
    const absl::Status why =
        status.ok() ? absl::UnavailableError("the store stream closed")
                    : status;
    for (auto& [id, slot] : pending) {
      slot->result = why;
      slot->done.Notify();
    }
  }

  const Connection connection_;
  const bool on_leader_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Slot>> pending_
      ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  Connection::Heard heard_ ABSL_GUARDED_BY(mu_) = Connection::Heard::kNothing;
};

StoreClient::StoreClient(Connection connection, std::string job_id,
                         int64_t round, absl::Duration rpc_timeout)
    : connection_(std::move(connection)),
      job_id_(std::move(job_id)),
      rpc_timeout_(rpc_timeout),
      round_(round) {}

StoreClient::~StoreClient() = default;  // the pipe's deleter ends it

void StoreClient::set_round(int64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
}

std::shared_ptr<StoreClient::Pipe> StoreClient::OpenPipe() {
  if (pipe_ && pipe_->open()) return pipe_;
  // A pipe that is no longer open is finishing; it is freed here, on this
  // thread, once gRPC is done with it (client_stream.h says why). Callers
  // still holding it keep it alive and destroy it likewise.
  if (pipe_) pipe_->Wait().IgnoreError();
  const Connection::Target target = connection_.target();
  auto pipe =
      std::shared_ptr<Pipe>(new Pipe(connection_, target.leader), [](Pipe* p) {
        p->Cancel();
        p->Wait().IgnoreError();
        delete p;
      });
  connection_.Prepare(&pipe->context(), absl::InfiniteDuration());
  // While the service restarts (ctrund --state-dir), requests wait for it
  // to be back, each within its own deadline, instead of failing at once.
  pipe->context().set_wait_for_ready(!target.leader);
  v1::Store::NewStub(target.channel)
      ->async()
      ->Pipe(&pipe->context(), pipe.get());
  pipe->Begin();
  pipe_ = pipe;
  return pipe;
}

namespace {

// Whether doing `request` twice is the same as doing it once: then a
// request whose stream broke before its answer may be sent again.
bool Repeatable(const v1::StoreRequest& request) {
  switch (request.op_case()) {
    case v1::StoreRequest::kAdd:
    case v1::StoreRequest::kCompareSet:
    case v1::StoreRequest::kDelete:
      return false;
    default:
      return true;
  }
}

// Whether a stream ended because the service refused it, rather than
// because it or the connection went away.
bool RefusedStream(const absl::Status& status) {
  return !status.ok() && !absl::IsUnavailable(status) &&
         !absl::IsCancelled(status) && !absl::IsDeadlineExceeded(status);
}

}  // namespace

absl::StatusOr<v1::StoreResponse> StoreClient::Call(v1::StoreRequest request,
                                                    absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait + rpc_timeout_;
  // A request that could not even be queued (the stream had just broken)
  // is safe to send once more on a new stream; so is a repeatable one
  // whose stream broke before it was answered (the service restarted), and
  // any that a standby refused. Twice more at most; but between the
  // replicas of a ctrund on etcd (a standby sent the stream on, or the
  // leader it named went away) until the deadline, a little apart, as a
  // takeover lasts up to the lease.
  auto again = [deadline](int attempt, const Pipe& pipe) {
    if (!pipe.rerouted()) return attempt < 2;
    const absl::Duration pause =
        attempt == 0 ? absl::ZeroDuration() : absl::Milliseconds(100);
    if (absl::Now() + pause >= deadline) return false;
    absl::SleepFor(pause);
    return true;
  };
  for (int attempt = 0;; ++attempt) {
    auto slot = std::make_shared<Pipe::Slot>();
    std::shared_ptr<Pipe> pipe;
    {
      absl::MutexLock lock(&mu_);
      pipe = OpenPipe();
      request.set_id(next_id_++);
      request.mutable_scope()->set_job_id(job_id_);
      request.mutable_scope()->set_round(round_);
    }
    pipe->Register(request.id(), slot);
    if (!pipe->Send(request)) {
      pipe->Abandon(request.id());
      // The service may have refused the stream before the request was
      // queued (a wrong token): that is the answer, not an unreachable
      // store.
      if (auto ended = pipe->WaitFor(absl::Seconds(1));
          ended && RefusedStream(*ended)) {
        return *ended;
      }
      if (again(attempt, *pipe)) continue;
      return absl::UnavailableError(
          absl::StrCat("cannot reach the store at ", connection_.endpoint()));
    }
    if (!slot->done.WaitForNotificationWithDeadline(deadline)) {
      pipe->Abandon(request.id());
      return absl::DeadlineExceededError(
          absl::StrCat("no answer from the store at ", connection_.endpoint(),
                       " within ", absl::FormatDuration(wait + rpc_timeout_)));
    }
    if (absl::IsUnavailable(slot->result.status()) && !pipe->open() &&
        (Repeatable(request) || pipe->refused_by_standby()) &&
        again(attempt, *pipe)) {
      continue;
    }
    return std::move(slot->result);
  }
}

absl::Status StoreClient::Set(const std::string& key,
                              const std::string& value) {
  v1::StoreRequest req;
  req.mutable_set()->set_key(key);
  req.mutable_set()->set_value(value);
  return Call(std::move(req), absl::ZeroDuration()).status();
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key,
                                             absl::Duration wait) {
  v1::StoreRequest req;
  req.mutable_get()->set_key(key);
  req.mutable_get()->set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
  auto resp = Call(std::move(req), wait);
  if (!resp.ok()) return resp.status();
  return std::move(*resp->mutable_get()->mutable_value());
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key,
                                         int64_t delta) {
  v1::StoreRequest req;
  req.mutable_add()->set_key(key);
  req.mutable_add()->set_delta(delta);
  auto resp = Call(std::move(req), absl::ZeroDuration());
  if (!resp.ok()) return resp.status();
  return resp->add().value();
}

absl::StatusOr<StoreClient::CompareSetResult> StoreClient::CompareSet(
    const std::string& key, const std::string& expected,
    const std::string& desired) {
  v1::StoreRequest req;
  auto* cs = req.mutable_compare_set();
  cs->set_key(key);
  cs->set_expected(expected);
  cs->set_desired(desired);
  auto resp = Call(std::move(req), absl::ZeroDuration());
  if (!resp.ok()) return resp.status();
  return CompareSetResult{
      resp->compare_set().swapped(),
      std::move(*resp->mutable_compare_set()->mutable_value())};
}

absl::StatusOr<bool> StoreClient::Delete(const std::string& key) {
  v1::StoreRequest req;
  req.mutable_delete_()->set_key(key);
  auto resp = Call(std::move(req), absl::ZeroDuration());
  if (!resp.ok()) return resp.status();
  return resp->delete_().deleted();
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  v1::StoreRequest req;
  for (const auto& k : keys) req.mutable_check()->add_keys(k);
  auto resp = Call(std::move(req), absl::ZeroDuration());
  if (!resp.ok()) return resp.status();
  return resp->check().all_set();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  v1::StoreRequest req;
  req.mutable_num_keys();
  auto resp = Call(std::move(req), absl::ZeroDuration());
  if (!resp.ok()) return resp.status();
  return resp->num_keys().num_keys();
}

absl::StatusOr<std::vector<std::string>> StoreClient::MultiGet(
    const std::vector<std::string>& keys, absl::Duration wait) {
  v1::StoreRequest req;
  auto* mg = req.mutable_multi_get();
  for (const auto& k : keys) mg->add_keys(k);
  mg->set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
  auto resp = Call(std::move(req), wait);
  if (!resp.ok()) return resp.status();
  const auto& values = resp->multi_get().values();
  return std::vector<std::string>(values.begin(), values.end());
}

absl::Status StoreClient::MultiSet(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  v1::StoreRequest req;
  for (const auto& [k, v] : entries) {
    auto* e = req.mutable_multi_set()->add_entries();
    e->set_key(k);
    e->set_value(v);
  }
  return Call(std::move(req), absl::ZeroDuration()).status();
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys,
                               absl::Duration timeout) {
  v1::StoreRequest req;
  for (const auto& k : keys) req.mutable_wait()->add_keys(k);
  req.mutable_wait()->set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Call(std::move(req), timeout).status();
}

// --- AdminClient ------------------------------------------------------------

AdminClient::AdminClient(Connection connection, absl::Duration rpc_timeout)
    : connection_(std::move(connection)), rpc_timeout_(rpc_timeout) {}

template <typename Response, typename Method>
absl::StatusOr<Response> AdminClient::Call(Method method) {
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext context;
    connection_.Prepare(&context, rpc_timeout_);
    auto stub = v1::Admin::NewStub(connection_.channel());
    Response response;
    const absl::Status status =
        FromGrpcStatus(method(*stub, &context, &response));
    if (status.ok()) return response;
    if (connection_.Follow(context, status) == Connection::Heard::kLeader &&
        attempt == 0) {
      continue;
    }
    return status;
  }
}

absl::StatusOr<v1::ListJobsResponse> AdminClient::ListJobs() {
  return Call<v1::ListJobsResponse>([](v1::Admin::Stub& stub,
                                       grpc::ClientContext* context,
                                       v1::ListJobsResponse* response) {
    return stub.ListJobs(context, {}, response);
  });
}

absl::StatusOr<v1::JobStatus> AdminClient::DescribeJob(
    const std::string& job_id) {
  v1::DescribeJobRequest request;
  request.set_job_id(job_id);
  return Call<v1::JobStatus>([&request](v1::Admin::Stub& stub,
                                        grpc::ClientContext* context,
                                        v1::JobStatus* response) {
    return stub.DescribeJob(context, request, response);
  });
}

// --- SessionStream ----------------------------------------------------------

class SessionStream::Transport {
 public:
  virtual ~Transport() = default;
  virtual void Send(v1::AgentMessage message) = 0;
  virtual void Close() = 0;
  virtual void Cancel() = 0;
  virtual absl::Status Wait() = 0;
  virtual std::optional<absl::Status> WaitFor(absl::Duration timeout) = 0;
  virtual bool done() = 0;
};

namespace {

// The session over gRPC: hands messages to the handlers.
class GrpcSession final
    : public ClientStream<v1::AgentMessage, v1::ServerMessage>,
      public SessionStream::Transport {
  using Stream = ClientStream<v1::AgentMessage, v1::ServerMessage>;

 public:
  GrpcSession(Connection connection, SessionStream::Handlers handlers)
      : connection_(std::move(connection)), handlers_(std::move(handlers)) {}

  void Send(v1::AgentMessage message) override {
    Stream::Send(std::move(message));  // dropped when closing: documented
  }
  void Close() override { Stream::Close(); }
  void Cancel() override { Stream::Cancel(); }
  absl::Status Wait() override { return Stream::Wait(); }
  std::optional<absl::Status> WaitFor(absl::Duration timeout) override {
    return Stream::WaitFor(timeout);
  }
  bool done() override { return Stream::done(); }

 private:
  void OnMessage(const v1::ServerMessage& message) override {
    if (handlers_.on_message) handlers_.on_message(message);
  }
  void OnFinished(const absl::Status& status) override {
    // Before the agent opens another.
    const bool redirected =
        connection_.Follow(context(), status) == Connection::Heard::kLeader;
    if (handlers_.on_done) handlers_.on_done(status, redirected);
  }

  const Connection connection_;
  const SessionStream::Handlers handlers_;
};

// The session with a rendezvous in this process: the service handles each
// message as it is sent, and its answers come on the thread that caused
// them.
class LocalSessionTransport final : public SessionStream::Transport {
 public:
  explicit LocalSessionTransport(SessionStream::Handlers handlers)
      : handlers_(std::move(handlers)) {}

  void Open(LocalRendezvous& local, const v1::Join& join) {
    LocalRendezvous::Handlers h;
    h.on_message = [this](const v1::ServerMessage& message) {
      if (handlers_.on_message) handlers_.on_message(message);
    };
    h.on_done = [this](const absl::Status& status) { Finished(status); };
    session_ = local.OpenSession(std::move(h));
    v1::AgentMessage first;
    *first.mutable_join() = join;
    Send(std::move(first));
  }

  void Send(v1::AgentMessage message) override {
    {
      absl::MutexLock lock(&mu_);
      if (left_ || status_) return;  // dropped when closing: documented
    }
    session_->Send(message);
  }
  // Nothing is ever queued: a half-close leaves at once.
  void Close() override { Leave(false); }
  void Cancel() override { Leave(true); }
  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* s) { return s->has_value(); },
        &status_));
    return *status_;
  }
  std::optional<absl::Status> WaitFor(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::optional<absl::Status>* s) { return s->has_value(); },
            &status_),
        timeout);
    return status_;
  }
  bool done() override {
    absl::MutexLock lock(&mu_);
    return status_.has_value();
  }

 private:
  void Leave(bool cancel) {
    {
      absl::MutexLock lock(&mu_);
      if (left_ || status_) return;
      left_ = true;
      cancelled_ = cancel;
    }
    session_->Leave();
  }
  void Finished(absl::Status status) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    // What gRPC says of a stream its client cancelled.
    if (cancelled) status = absl::CancelledError("the session was cancelled");
    if (handlers_.on_done) handlers_.on_done(status, false);
    // Last: Wait returns, and this may be destroyed, once it is set.
    absl::MutexLock lock(&mu_);
    status_ = status;
  }

  const SessionStream::Handlers handlers_;
  std::shared_ptr<LocalSession> session_;  // set in Open, before any use
  absl::Mutex mu_;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

SessionStream::SessionStream(std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)) {}

std::unique_ptr<SessionStream> SessionStream::Start(
    const Connection& connection, const v1::Join& join, Handlers handlers) {
  if (LocalRendezvous* local = connection.local()) {
    auto session = std::make_unique<LocalSessionTransport>(std::move(handlers));
    session->Open(*local, join);
    return std::unique_ptr<SessionStream>(
        new SessionStream(std::move(session)));
  }
  auto reactor = std::make_unique<GrpcSession>(connection, std::move(handlers));
  connection.Prepare(&reactor->context(), absl::InfiniteDuration());
  // An agent may start before the node that hosts the rendezvous: the
  // session waits for the service to come up instead of failing at once.
  // The agent bounds the wait by its join timeout.
  const Connection::Target target = connection.target();
  reactor->context().set_wait_for_ready(!target.leader);
  auto stub = v1::Rendezvous::NewStub(target.channel);
  stub->async()->Session(&reactor->context(), reactor.get());
  v1::AgentMessage first;
  *first.mutable_join() = join;
  reactor->Send(std::move(first));
  reactor->Begin();
  return std::unique_ptr<SessionStream>(new SessionStream(std::move(reactor)));
}

SessionStream::~SessionStream() {
  if (!transport_->done()) transport_->Cancel();
  transport_->Wait().IgnoreError();
}

void SessionStream::Send(v1::AgentMessage message) {
  transport_->Send(std::move(message));
}
void SessionStream::Close() { transport_->Close(); }
void SessionStream::Cancel() { transport_->Cancel(); }
absl::Status SessionStream::Wait() { return transport_->Wait(); }
std::optional<absl::Status> SessionStream::WaitFor(absl::Duration timeout) {
  return transport_->WaitFor(timeout);
}

}  // namespace ctrun
