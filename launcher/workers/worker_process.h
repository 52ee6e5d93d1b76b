// Starting one worker process.
#ifndef CTRUN_LAUNCHER_WORKERS_WORKER_PROCESS_H_
#define CTRUN_LAUNCHER_WORKERS_WORKER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/command_line.h"
#include "launcher/policy/numa_binding.h"

namespace ctrun {

struct SpawnOptions {
  // In a process group of its own (the default), or in ctrun's: the group
  // that owns the terminal, so that the worker can read it (worker_group.h).
  bool own_group = true;
  // Each of stdout/stderr on a pseudo-terminal instead of a pipe, so that
  // the worker sees a terminal (isatty) and its libraries behave as on one:
  // line buffering, colours, progress bars. Raw mode: what the worker
  // writes reaches ctrun byte for byte (no "\n" to "\r\n"). The terminal's
  // size is `window_from`'s, when that is a terminal.
  bool tty_stdout = false;
  bool tty_stderr = false;
  int window_from = -1;
  // Set before exec (--numa_binding): the CPUs it may run on, and the NUMA
  // node its memory is preferred on. Null: inherited from ctrun.
  const Binding* binding = nullptr;
};

struct SpawnedProcess {
  pid_t pid = -1;  // its process group id too, with SpawnOptions::own_group
  // Read ends (a pipe's, or a pseudo-terminal's master), non-blocking,
  // close-on-exec. A master reads EIO instead of end-of-file once the
  // worker and all it started have closed it.
  int stdout_fd = -1;
  int stderr_fd = -1;
  bool warm = false;  // forked from a template that had its imports done
};

// Starts `argv` with exactly `env`, with a parent-death signal (SIGKILL),
// an empty signal mask and default dispositions, stdin inherited and
// stdout/stderr on pipes or pseudo-terminals (`options`). An exec that
// fails is reported here (FAILED_PRECONDITION naming the program and the
// errno), not as a worker exit.
absl::StatusOr<SpawnedProcess> SpawnWorker(const std::vector<std::string>& argv,
                                           const EnvMap& env,
                                           const SpawnOptions& options = {});

// Marks every descriptor above stderr that this process inherited
// close-on-exec, so that none reaches a worker (or anything else it
// starts): torchrun's workers get stdin, stdout and stderr only, not a
// wrapper's lock or a CI runner's pipe. Call it first thing in main; what
// ctrun hands a worker on purpose (its output, the template's socket) it
// hands on explicitly.
void KeepDescriptorsFromWorkers();

// A worker's stdout or stderr channel, as SpawnWorker makes it: fds[0] the
// read end (ctrun's, close-on-exec), fds[1] the worker's; a pipe, or with
// `terminal` a pseudo-terminal in raw mode sized as `window_from`.
absl::Status OpenWorkerOutput(int fds[2], bool terminal, int window_from);

// How a WorkerGroup brings a worker process into being, with SpawnWorker's
// contract: by exec (ExecSpawner), or by forking a template interpreter
// that already imported the worker's libraries (template_spawner.h).
class Spawner {
 public:
  virtual ~Spawner() = default;
  virtual absl::StatusOr<SpawnedProcess> Spawn(
      const std::vector<std::string>& argv, const EnvMap& env,
      const SpawnOptions& options) = 0;
  // A child of the agent's that the spawner keeps (the template), which
  // the group must not end as a stray; -1 when none.
  virtual pid_t helper() const { return -1; }
};

// SpawnWorker, as a Spawner.
class ExecSpawner final : public Spawner {
 public:
  absl::StatusOr<SpawnedProcess> Spawn(const std::vector<std::string>& argv,
                                       const EnvMap& env,
                                       const SpawnOptions& options) override {
    return SpawnWorker(argv, env, options);
  }
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_WORKER_PROCESS_H_
