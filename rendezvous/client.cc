#include "rendezvous/client.h"

#include <atomic>
#include <deque>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "rendezvous/auth.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/grpc_status.h"

namespace ctrun {

absl::StatusOr<Connection> Connection::Open(const ConnectionOptions& options) {
  auto endpoint = ParseEndpoint(options.endpoint);
  if (!endpoint.ok()) return endpoint.status();
  if (endpoint->port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint '", options.endpoint, "' needs a port other than 0"));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (!options.tls_ca_file.empty()) {
    std::ifstream in(options.tls_ca_file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot read TLS CA file '", options.tls_ca_file, "'"));
    }
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    credentials = grpc::SslCredentials(ssl);
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
  c.endpoint_ = endpoint->ToString();
  c.token_ = options.token;
  c.channel_ = grpc::CreateCustomChannel(c.endpoint_, credentials, args);
  return c;
}

void Connection::Prepare(grpc::ClientContext* context,
                         absl::Duration timeout) const {
  if (!token_.empty()) context->AddMetadata(kAuthMetadataKey, BearerValue(token_));
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
}

// --- StoreClient ------------------------------------------------------------

StoreClient::StoreClient(Connection connection, std::string job_id,
                         int64_t round, absl::Duration rpc_timeout)
    : connection_(std::move(connection)),
      stub_(v1::Store::NewStub(connection_.channel())),
      job_id_(std::move(job_id)),
      rpc_timeout_(rpc_timeout),
      round_(round) {}

void StoreClient::set_round(int64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
}

v1::StoreScope StoreClient::Scope() const {
  v1::StoreScope scope;
  scope.set_job_id(job_id_);
  absl::MutexLock lock(&mu_);
  scope.set_round(round_);
  return scope;
}

namespace {

template <typename Request, typename Response>
absl::Status Invoke(const Connection& connection, v1::Store::Stub* stub,
                    grpc::Status (v1::Store::Stub::*rpc)(grpc::ClientContext*,
                                                         const Request&,
                                                         Response*),
                    const Request& request, Response* response,
                    absl::Duration timeout) {
  grpc::ClientContext context;
  connection.Prepare(&context, timeout);
  return FromGrpcStatus((stub->*rpc)(&context, request, response));
}

}  // namespace

absl::Status StoreClient::Set(const std::string& key,
                              const std::string& value) {
  v1::SetRequest req;
  *req.mutable_scope() = Scope();
  req.set_key(key);
  req.set_value(value);
  v1::SetResponse resp;
  return Invoke(connection_, stub_.get(), &v1::Store::Stub::Set, req, &resp,
                 rpc_timeout_);
}

absl::StatusOr<std::string> StoreClient::Get(const std::string& key,
                                             absl::Duration wait) {
  v1::GetRequest req;
  *req.mutable_scope() = Scope();
  req.set_key(key);
  req.set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
  v1::GetResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::Get, req, &resp,
                 wait + rpc_timeout_);
      !s.ok()) {
    return s;
  }
  return std::move(*resp.mutable_value());
}

absl::StatusOr<int64_t> StoreClient::Add(const std::string& key,
                                         int64_t delta) {
  v1::AddRequest req;
  *req.mutable_scope() = Scope();
  req.set_key(key);
  req.set_delta(delta);
  v1::AddResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::Add, req, &resp,
                 rpc_timeout_); !s.ok()) {
    return s;
  }
  return resp.value();
}

absl::StatusOr<StoreClient::CompareSetResult> StoreClient::CompareSet(
    const std::string& key, const std::string& expected,
    const std::string& desired) {
  v1::CompareSetRequest req;
  *req.mutable_scope() = Scope();
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  v1::CompareSetResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::CompareSet, req, &resp,
                 rpc_timeout_);
      !s.ok()) {
    return s;
  }
  return CompareSetResult{resp.swapped(), std::move(*resp.mutable_value())};
}

absl::StatusOr<bool> StoreClient::Delete(const std::string& key) {
  v1::DeleteRequest req;
  *req.mutable_scope() = Scope();
  req.set_key(key);
  v1::DeleteResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::Delete, req, &resp,
                 rpc_timeout_); !s.ok()) {
    return s;
  }
  return resp.deleted();
}

absl::StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  v1::CheckRequest req;
  *req.mutable_scope() = Scope();
  for (const auto& k : keys) req.add_keys(k);
  v1::CheckResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::Check, req, &resp,
                 rpc_timeout_); !s.ok()) {
    return s;
  }
  return resp.all_set();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  v1::NumKeysRequest req;
  *req.mutable_scope() = Scope();
  v1::NumKeysResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::NumKeys, req, &resp,
                 rpc_timeout_); !s.ok()) {
    return s;
  }
  return resp.num_keys();
}

absl::StatusOr<std::vector<std::string>> StoreClient::MultiGet(
    const std::vector<std::string>& keys, absl::Duration wait) {
  v1::MultiGetRequest req;
  *req.mutable_scope() = Scope();
  for (const auto& k : keys) req.add_keys(k);
  req.set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
  v1::MultiGetResponse resp;
  if (auto s = Invoke(connection_, stub_.get(), &v1::Store::Stub::MultiGet, req, &resp,
                 wait + rpc_timeout_);
      !s.ok()) {
    return s;
  }
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

absl::Status StoreClient::MultiSet(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  v1::MultiSetRequest req;
  *req.mutable_scope() = Scope();
  for (const auto& [k, v] : entries) {
    auto* e = req.add_entries();
    e->set_key(k);
    e->set_value(v);
  }
  v1::MultiSetResponse resp;
  return Invoke(connection_, stub_.get(), &v1::Store::Stub::MultiSet, req, &resp,
                 rpc_timeout_);
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys,
                               absl::Duration timeout) {
  v1::WaitRequest req;
  *req.mutable_scope() = Scope();
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::WaitResponse resp;
  return Invoke(connection_, stub_.get(), &v1::Store::Stub::Wait, req, &resp,
                 timeout + rpc_timeout_);
}

// --- AdminClient ------------------------------------------------------------

AdminClient::AdminClient(Connection connection, absl::Duration rpc_timeout)
    : connection_(std::move(connection)),
      stub_(v1::Admin::NewStub(connection_.channel())),
      rpc_timeout_(rpc_timeout) {}

absl::StatusOr<v1::ListJobsResponse> AdminClient::ListJobs() {
  grpc::ClientContext context;
  connection_.Prepare(&context, rpc_timeout_);
  v1::ListJobsResponse resp;
  if (auto s = FromGrpcStatus(stub_->ListJobs(&context, {}, &resp)); !s.ok()) {
    return s;
  }
  return resp;
}

absl::StatusOr<v1::JobStatus> AdminClient::DescribeJob(
    const std::string& job_id) {
  grpc::ClientContext context;
  connection_.Prepare(&context, rpc_timeout_);
  v1::DescribeJobRequest req;
  req.set_job_id(job_id);
  v1::JobStatus resp;
  if (auto s = FromGrpcStatus(stub_->DescribeJob(&context, req, &resp));
      !s.ok()) {
    return s;
  }
  return resp;
}

// --- SessionStream ----------------------------------------------------------

// The gRPC reactor behind a SessionStream. It keeps itself alive until gRPC
// is done with it (self_), so that the SessionStream may go away first.
//
// Writes go one at a time from a queue. A hold keeps gRPC from finishing the
// stream while this side may still start a write; it is released once no
// write will start again (half-closed, or the stream broke).
class SessionStream::Reactor final
    : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  explicit Reactor(Handlers handlers) : handlers_(std::move(handlers)) {}

  void Begin(std::shared_ptr<Reactor> self, const Connection& connection,
             const v1::Join& join) {
    self_ = std::move(self);
    connection.Prepare(&context_, absl::InfiniteDuration());
    auto stub = v1::Rendezvous::NewStub(connection.channel());
    stub->async()->Session(&context_, this);
    AddHold();
    StartRead(&in_);
    v1::AgentMessage first;
    *first.mutable_join() = join;
    Send(std::move(first));
    StartCall();
  }

  void Send(v1::AgentMessage message) {
    const v1::AgentMessage* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || broken_) return;
      out_.push_back(std::move(message));
      next = NextWriteLocked();
    }
    if (next != nullptr) StartWrite(next);
  }

  void Close() {
    bool writes_done = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || broken_) return;
      closing_ = true;
      writes_done = WritesDoneDueLocked();
      release = ReleaseDueLocked();
    }
    if (writes_done) StartWritesDone();
    if (release) RemoveHold();
  }

  void Cancel() { context_.TryCancel(); }

  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* d) { return d->has_value(); },
        &done_));
    return *done_;
  }

  std::optional<absl::Status> WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](std::optional<absl::Status>* d) { return d->has_value(); },
            &done_),
        timeout);
    return done_;
  }

  bool done() {
    absl::MutexLock lock(&mu_);
    return done_.has_value();
  }

 private:
  // The message to write now, if none is in flight.
  const v1::AgentMessage* NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || out_.empty() || broken_) return nullptr;
    writing_ = true;
    return &out_.front();  // deque elements stay put on push_back
  }
  bool WritesDoneDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closing_ || writing_ || !out_.empty() || writes_done_ || broken_) {
      return false;
    }
    writes_done_ = true;
    return true;
  }
  bool ReleaseDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (hold_released_ || writing_) return false;
    if (!writes_done_ && !broken_) return false;
    hold_released_ = true;
    return true;
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (handlers_.on_message) handlers_.on_message(in_);
      StartRead(&in_);
      return;
    }
    bool release;
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
      release = ReleaseDueLocked();
    }
    if (release) RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    const v1::AgentMessage* next = nullptr;
    bool writes_done = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      out_.pop_front();
      if (!ok) {
        broken_ = true;
        out_.clear();
      }
      next = NextWriteLocked();
      if (next == nullptr) writes_done = WritesDoneDueLocked();
      release = ReleaseDueLocked();
    }
    if (next != nullptr) StartWrite(next);
    if (writes_done) StartWritesDone();
    if (release) RemoveHold();
  }

  void OnWritesDoneDone(bool) override {}

  void OnDone(const grpc::Status& status) override {
    const absl::Status result = FromGrpcStatus(status);
    if (handlers_.on_done) handlers_.on_done(result);
    std::shared_ptr<Reactor> self;
    {
      absl::MutexLock lock(&mu_);
      done_ = result;
      self = std::move(self_);
    }
    // `self` may be the last reference: nothing below touches members.
  }

  Handlers handlers_;
  grpc::ClientContext context_;
  v1::ServerMessage in_;
  std::shared_ptr<Reactor> self_;

  absl::Mutex mu_;
  std::deque<v1::AgentMessage> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

SessionStream::SessionStream(std::shared_ptr<Reactor> reactor)
    : reactor_(std::move(reactor)) {}

std::unique_ptr<SessionStream> SessionStream::Start(
    const Connection& connection, const v1::Join& join, Handlers handlers) {
  auto reactor = std::make_shared<Reactor>(std::move(handlers));
  reactor->Begin(reactor, connection, join);
  return std::unique_ptr<SessionStream>(new SessionStream(std::move(reactor)));
}

SessionStream::~SessionStream() {
  if (!reactor_->done()) {
    reactor_->Cancel();
    reactor_->Wait().IgnoreError();
  }
}

void SessionStream::Send(v1::AgentMessage message) {
  reactor_->Send(std::move(message));
}
void SessionStream::Close() { reactor_->Close(); }
void SessionStream::Cancel() { reactor_->Cancel(); }
absl::Status SessionStream::Wait() { return reactor_->Wait(); }
std::optional<absl::Status> SessionStream::WaitFor(absl::Duration timeout) {
  return reactor_->WaitFor(timeout);
}

}  // namespace ctrun
