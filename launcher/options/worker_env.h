// The environment of one worker: torchrun's variables (DESIGN.md, "Worker
// environment") on top of the agent's own, plus ctrun's store variables.
#ifndef CTRUN_LAUNCHER_OPTIONS_WORKER_ENV_H_
#define CTRUN_LAUNCHER_OPTIONS_WORKER_ENV_H_

#include <optional>
#include <string>

#include "ctrun/v1/rendezvous.pb.h"
#include "launcher/options/command_line.h"
#include "launcher/options/launch_options.h"
#include "rendezvous/rpc/munge.h"

namespace ctrun {

// How workers reach the job's store (worker_lib).
struct StoreAccess {
  std::string endpoint;
  std::string token;
  std::optional<MungeAuth> munge;  // instead of a token
  std::string tls_ca;              // a file; empty without TLS
};

// `node_address`: where this node's workers listen for their peers.

// The full environment of the worker at `local_rank` in `assignment`.
// `agent_env` is inherited, but for the rendezvous token (workers get
// store.token, their job's own); OMP_NUM_THREADS=1 is added when several
// workers share the node and it is unset; the NCCL error-handling switches are
// set to 1 unless set.
EnvMap WorkerEnvironment(const LaunchOptions& options,
                         const v1::Assignment& assignment, int local_rank,
                         const EnvMap& agent_env, const StoreAccess& store,
                         const std::string& node_address,
                         const std::string& error_file);

// Where the node's workers report progress (progress_board.h), and what
// ctrun gives them for it.
struct ProgressPaths {
  std::string board;       // CTRUN_PROGRESS_FILE
  std::string python_dir;  // holds ctrun's `ctrun` module
  std::string timer_fifo;  // torchrun's file timers; empty: not served
  std::string run_dir;     // NCCL flight-recorder dumps go here
};

// Adds to `env` (a worker's) its progress slot, its stacks file, ctrun's
// Python module appended to PYTHONPATH, torchrun's TORCHELASTIC_TIMER_FILE
// when the timers are served, and, when hangs are watched, PyTorch's NCCL
// flight recorder pointed at the run directory (each unless already set).
void AddProgressEnvironment(const LaunchOptions& options,
                            const ProgressPaths& paths, int slot,
                            const std::string& stacks_file, EnvMap* env);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_WORKER_ENV_H_
