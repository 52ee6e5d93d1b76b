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

// The variables that say where a worker stands in `assignment`'s world:
// its ranks, the world's sizes, the master, the restart count and the
// store's round. In-process recovery hands exactly these to a kept worker.
EnvMap WorldVariables(const LaunchOptions& options,
                      const v1::Assignment& assignment, int local_rank);

// The world file (CTRUN_WORLD_FILE) through which the agent hands a kept
// worker a new round under --recovery=inprocess. Text, one KEY=VALUE per
// line; the agent replaces it whole (rename), so a reader sees one version:
//   CTRUN_ROUND=N            the round the file is about
//   CTRUN_ROUND_STATE=ending round N ends: leave what you are doing
//                    =ready  round N's world follows (WorldVariables)
// ctrun's Python module (ctrun.resilient) and worker_lib read it.
inline constexpr char kWorldRound[] = "CTRUN_ROUND";
inline constexpr char kWorldState[] = "CTRUN_ROUND_STATE";
std::string WorldFileText(const LaunchOptions& options,
                          const v1::Assignment& assignment, int local_rank);
std::string RoundEndingText(int64_t round);

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
