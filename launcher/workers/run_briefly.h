// Running a short command from the agent (scontrol, a health check) with
// its output and a bound on its time.
#ifndef CTRUN_LAUNCHER_WORKERS_RUN_BRIEFLY_H_
#define CTRUN_LAUNCHER_WORKERS_RUN_BRIEFLY_H_

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ctrun {

// Runs `argv` (argv[0] a path, or a name looked up in PATH) with stdin from
// /dev/null, in a process group of its own, for at most `timeout`: its
// stdout and stderr together (its last 64 KiB). INTERNAL naming the
// command when it cannot start, exits non-zero (with its output), or runs
// longer (its process group is killed). `running`, when given, holds the
// command's pid (its process group) while it runs, for another thread to
// end it early. When another waiter reaped the command first, its output
// is returned as if it had exited 0.
absl::StatusOr<std::string> RunBriefly(const std::vector<std::string>& argv,
                                       absl::Duration timeout,
                                       std::atomic<pid_t>* running = nullptr);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_RUN_BRIEFLY_H_
