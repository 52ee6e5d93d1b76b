// Watchdog: a small process that ends everything the agent started when the
// agent dies, however it dies (kill -9 included).
//
// Each worker dies with the agent through its parent-death signal, but its
// own children do not; the watchdog knows every worker's process group and
// SIGKILLs them all when its pipe from the agent closes, which the kernel
// does on the agent's death. Descendants that left their worker's group
// (setsid, a double fork) are found by the containment mark in their
// environment (env::kContainmentMark) and SIGKILLed too; only one that
// also cleared its environment escapes.
#ifndef CTRUN_LAUNCHER_WORKERS_WATCHDOG_H_
#define CTRUN_LAUNCHER_WORKERS_WATCHDOG_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace ctrun {

class Watchdog {
 public:
  // Forks the watchdog. Must run before the agent starts any thread.
  // `mark`: the kContainmentMark value the agent gives its workers.
  // `temporary_dir` (optional): a run directory to remove after the agent,
  // however it ended, unless it holds something (RemoveUnlessKept).
  static absl::StatusOr<Watchdog> Start(const std::string& mark,
                                        const std::string& temporary_dir = "");

  Watchdog(Watchdog&& other) noexcept;
  Watchdog& operator=(Watchdog&&) = delete;
  // Closes the pipe, so the watchdog ends what is still tracked, and waits
  // for it: when ctrun exits, nothing it started is left, not even this.
  ~Watchdog();

  void Track(pid_t pgid);
  void Untrack(pid_t pgid);
  // The agent ended every process it started, strays included: unless a
  // group is tracked after this, the watchdog skips its sweep for marked
  // processes (it reads every process's environment on the machine).
  void AllEnded();
  pid_t pid() const { return pid_; }

 private:
  Watchdog(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void Send(int32_t record);

  pid_t pid_ = -1;
  int fd_ = -1;
};

// The folder of a run directory where the agent keeps what it works with
// (the progress board, its Python module, the file-timer FIFO): nothing in
// it is worth keeping.
inline constexpr char kAgentFolder[] = ".ctrun";

// Removes `dir` unless a file in it has something to say (an error file, a
// log: any non-empty file outside kAgentFolder); returns whether it was
// kept.
bool RemoveUnlessKept(const std::string& dir);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_WATCHDOG_H_
