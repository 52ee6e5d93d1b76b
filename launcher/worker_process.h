// Starting one worker process.
#ifndef CTRUN_LAUNCHER_WORKER_PROCESS_H_
#define CTRUN_LAUNCHER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/command_line.h"

namespace ctrun {

struct SpawnedProcess {
  pid_t pid = -1;      // also its process group id
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec
  int stderr_fd = -1;
};

// Starts `argv` with exactly `env`, in its own process group, with a
// parent-death signal (SIGKILL), an empty signal mask and default
// dispositions, stdin inherited and stdout/stderr on pipes. An exec that
// fails is reported here (FAILED_PRECONDITION naming the program and the
// errno), not as a worker exit.
absl::StatusOr<SpawnedProcess> SpawnWorker(const std::vector<std::string>& argv,
                                           const EnvMap& env);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKER_PROCESS_H_
