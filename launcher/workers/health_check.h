// HealthCheck: a node's health check (ctrun --health_check, and NVML's view
// of its GPUs), run off the agent's loop so that heartbeats go on while it
// runs.
#ifndef CTRUN_LAUNCHER_WORKERS_HEALTH_CHECK_H_
#define CTRUN_LAUNCHER_WORKERS_HEALTH_CHECK_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace ctrun {

// Runs `command` with /bin/sh -c for at most `timeout`: "" when it exits 0,
// else one line naming it and why ("exited 3: <its last line of output>",
// "did not end within 60s"). `running` as RunBriefly's.
std::string RunHealthCommand(const std::string& command, absl::Duration timeout,
                             std::atomic<pid_t>* running = nullptr);

class HealthCheck {
 public:
  static constexpr absl::Duration kTimeout = absl::Seconds(60);

  // On a thread of its own: `command` (none when empty), then `gpus` (none
  // when empty; its verdict, "" for healthy), then `done` with every
  // problem found ("" when none), "; "-separated.
  HealthCheck(std::string command, std::function<std::string()> gpus,
              std::function<void(std::string)> done);
  // Ends a command still running (its process group) and waits for the
  // thread; `done` may then not be called.
  ~HealthCheck();
  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

 private:
  std::atomic<pid_t> running_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_HEALTH_CHECK_H_
