// SessionProbe: an in-process agent session for integration tests that
// records what the server sends and can heartbeat on its own thread.
#ifndef CTRUN_TESTS_SUPPORT_SESSION_PROBE_H_
#define CTRUN_TESTS_SUPPORT_SESSION_PROBE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "rendezvous/client/client.h"

namespace ctrun::testing {

struct JoinSpec {
  std::string job = "job";
  std::string host = "host";
  int min_nodes = 1;
  int max_nodes = 1;
  int local_world_size = 1;
  int64_t heartbeat_timeout_ms = 60'000;
  int64_t last_call_timeout_ms = 0;
  uint64_t incarnation = 0;  // 0: derived from the host name and a counter
};
v1::Join MakeJoin(const JoinSpec& spec);

class SessionProbe {
 public:
  // Joins; with a non-zero `heartbeat_every`, heartbeats on a thread.
  SessionProbe(const Connection& connection, const v1::Join& join,
               absl::Duration heartbeat_every = absl::ZeroDuration());
  ~SessionProbe();

  using Predicate = std::function<bool(const v1::ServerMessage&)>;
  // The next message (after those already returned) that matches, skipping
  // others; nullopt after `timeout`.
  std::optional<v1::ServerMessage> Next(const Predicate& matches,
                                        absl::Duration timeout);
  std::optional<v1::Assignment> NextAssignment(absl::Duration timeout);
  std::optional<v1::RestartRequired> NextRestart(absl::Duration timeout);
  std::optional<absl::Status> WaitDone(absl::Duration timeout);

  void Rejoin(int64_t round);
  void Report(int64_t round, v1::WorkerReport::State state);
  SessionStream& stream() { return *stream_; }

 private:
  absl::Mutex mu_;
  std::vector<v1::ServerMessage> received_ ABSL_GUARDED_BY(mu_);
  size_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<SessionStream> stream_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_SESSION_PROBE_H_
