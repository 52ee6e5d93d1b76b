// Clients of the rendezvous service: the connection, the job's store, the
// admin views and the agent's session stream.
//
// Every RPC carries a deadline and returns absl::Status / StatusOr with the
// server's code unchanged (grpc_status.h); transport failures are
// UNAVAILABLE or DEADLINE_EXCEEDED.
#ifndef CTRUN_RENDEZVOUS_CLIENT_CLIENT_H_
#define CTRUN_RENDEZVOUS_CLIENT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ctrun/v1/admin.grpc.pb.h"
#include "ctrun/v1/rendezvous.grpc.pb.h"
#include "ctrun/v1/store.grpc.pb.h"
#include "rendezvous/rpc/local_rendezvous.h"
#include "rendezvous/rpc/munge.h"

namespace ctrun {

struct ConnectionOptions {
  // HOST:PORT, or HOST:PORT,HOST:PORT,... for the replicas of a ctrund on
  // etcd: calls go to the first that accepts connections; a standby among
  // them names the leader, and calls go there (Connection::Follow).
  std::string endpoint;
  std::string token;  // sent with every call when non-empty
  // When set (and no token), every call carries a fresh munge credential
  // for the job.
  std::optional<MungeAuth> munge;
  // When set, the channel speaks TLS and trusts these PEM roots.
  std::string tls_ca_file;
  // Overrides the name checked against the server's certificate.
  std::string tls_server_name;
  // Gives this connection its own TCP connection even when another one to
  // the same endpoint exists in the process (gRPC shares them otherwise).
  bool own_tcp_connection = false;
  // When set, the rendezvous at `endpoint` is this one, served in this
  // process: sessions (SessionStream) reach it without a transport. It
  // must outlive the connection's sessions. Other calls still go over
  // `endpoint`.
  LocalRendezvous* local = nullptr;
};

// A channel plus the credentials to put on each call. Cheap to copy; safe
// to share between threads. Copies share what Follow learns.
class Connection {
 public:
  // INVALID_ARGUMENT for a malformed endpoint or unreadable CA file;
  // NOT_FOUND for a host of an endpoint list that does not resolve;
  // UNAVAILABLE when munge is asked for and does not work here. Does not
  // connect: the first call does.
  static absl::StatusOr<Connection> Open(const ConnectionOptions& options);

  // Adds the token or a munge credential and, unless `timeout` is infinite,
  // a deadline.
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

  // Where calls go now: to the leader a standby named, or else to the
  // endpoints given. Take it for each call (or stream), not once.
  struct Target {
    std::shared_ptr<grpc::Channel> channel;
    // Whether it is the leader's: a call there must not wait for the
    // channel to connect (gRPC's wait-for-ready), for a leader that went
    // away fails it at once and calls return to the endpoints given, where
    // its successor is.
    bool leader = false;
  };
  Target target() const;
  std::shared_ptr<grpc::Channel> channel() const { return target().channel; }

  // What a call's end says of where calls go.
  enum class Heard {
    kNothing,  // it did not end UNAVAILABLE
    // A standby refused it, naming the leader (kLeaderMetadataKey): calls
    // go there from now on. Nothing of it was done; send it again at once.
    kLeader,
    // A standby refused it while no replica leads (an empty name): nothing
    // of it was done; send it again to the endpoints given, a little later.
    kNoLeader,
    // UNAVAILABLE without a name: the leader went away or stepped down, or
    // the endpoints are unreachable. Calls go to the endpoints given.
    kGone,
  };
  // Learns from a call that ended with `status` (context being the call's).
  Heard Follow(const grpc::ClientContext& context,
               const absl::Status& status) const;

  // The leader calls go to, or "" while they go to the endpoints given.
  std::string leader() const;

  const std::string& endpoint() const { return endpoint_; }
  // ConnectionOptions::local.
  LocalRendezvous* local() const { return local_; }

 private:
  struct Route;
  std::shared_ptr<Route> route_;
  LocalRendezvous* local_ = nullptr;
  std::string endpoint_;
  std::string token_;
  std::optional<MungeAuth> munge_;
};

// The store of one job and round, over one stream that carries the
// requests of every thread using this client (store.proto). The stream opens
// on first use and again after it broke. Thread-safe.
class StoreClient {
 public:
  StoreClient(Connection connection, std::string job_id, int64_t round,
              absl::Duration rpc_timeout = absl::Seconds(30));
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Moves to another round's scope (after a restart).
  void set_round(int64_t round);

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `wait` for the key (DEADLINE_EXCEEDED after); with a zero
  // wait a missing key is NOT_FOUND.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration wait = absl::ZeroDuration());
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  struct CompareSetResult {
    bool swapped;
    std::string value;
  };
  absl::StatusOr<CompareSetResult> CompareSet(const std::string& key,
                                              const std::string& expected,
                                              const std::string& desired);
  absl::StatusOr<bool> Delete(const std::string& key);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::StatusOr<int64_t> NumKeys();
  absl::StatusOr<std::vector<std::string>> MultiGet(
      const std::vector<std::string>& keys,
      absl::Duration wait = absl::ZeroDuration());
  absl::Status MultiSet(
      const std::vector<std::pair<std::string, std::string>>& entries);
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout);

  class Pipe;

 private:
  // Sends `request` with a fresh id and this client's scope; returns the
  // response, or its status when that is not OK. `wait` is how long the
  // server may hold the request, on top of the RPC timeout.
  absl::StatusOr<v1::StoreResponse> Call(v1::StoreRequest request,
                                         absl::Duration wait);
  // The open stream, opening a new one when there is none or it broke.
  std::shared_ptr<Pipe> OpenPipe() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Connection connection_;
  const std::string job_id_;
  const absl::Duration rpc_timeout_;
  absl::Mutex mu_;
  int64_t round_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<Pipe> pipe_ ABSL_GUARDED_BY(mu_);
};

class AdminClient {
 public:
  explicit AdminClient(Connection connection,
                       absl::Duration rpc_timeout = absl::Seconds(10));
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  absl::StatusOr<v1::JobStatus> DescribeJob(const std::string& job_id);

 private:
  // Calls `method` of a fresh stub; once more when a standby refused it
  // (the connection now goes to the leader).
  template <typename Response, typename Method>
  absl::StatusOr<Response> Call(Method method);

  const Connection connection_;
  const absl::Duration rpc_timeout_;
};

// An agent's session: the join, then messages both ways until the server
// ends it. Handlers run on gRPC's threads, one at a time per stream, and
// must not block; `on_done` runs last, exactly once, with `redirected` true
// when a standby refused the stream (Connection::Follow): nothing of it was
// done, and a stream opened now goes to the leader it named.
//
// Thread-safe. The destructor cancels the stream if it is still open and
// waits until it is done.
class SessionStream {
 public:
  struct Handlers {
    std::function<void(const v1::ServerMessage&)> on_message;
    std::function<void(const absl::Status&, bool redirected)> on_done;
  };

  // Opens the stream and sends `join` first. The stream waits for the
  // service to be reachable (gRPC's wait-for-ready); Cancel ends the wait.
  static std::unique_ptr<SessionStream> Start(const Connection& connection,
                                              const v1::Join& join,
                                              Handlers handlers);
  ~SessionStream();
  SessionStream(const SessionStream&) = delete;
  SessionStream& operator=(const SessionStream&) = delete;

  // Queues a message; dropped once the stream is closing or done.
  void Send(v1::AgentMessage message);
  // Half-closes after the queued messages: the server then ends the session
  // (the node leaves) with OK.
  void Close();
  // Ends the stream at once (the node is lost to the server).
  void Cancel();
  // Blocks until the stream is done; returns its final status.
  absl::Status Wait();
  // Like Wait, but gives up after `timeout` (returns nullopt).
  std::optional<absl::Status> WaitFor(absl::Duration timeout);

  // Over gRPC, or to a rendezvous in this process (ConnectionOptions::local).
  class Transport;

 private:
  explicit SessionStream(std::unique_ptr<Transport> transport);
  std::unique_ptr<Transport> transport_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CLIENT_CLIENT_H_
