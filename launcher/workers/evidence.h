// EvidenceCollector: what an agent keeps of its workers when a hang is
// declared, before they are stopped (AgentPolicy's CollectEvidence).
//
// Into one folder per incident (run directory/hang_round_N/), for each live
// worker: rankR.output.txt, its last lines of output; rankR.python.txt,
// every thread's Python stack, when the worker registered faulthandler
// through ctrun's module (the agent sends it the signal its slot names,
// never a signal it did not register); and rankR.native.txt, every
// thread's native stack from `gdb -batch`, when gdb is installed. Python
// stacks come first (gdb stops the process while it reads it); then one gdb
// per worker, all at once.
//
// Driven by the agent's loop: Step() at NextDue(), OnChildExit() for the
// agent's children that the worker group reaped. No thread of its own.
#ifndef CTRUN_LAUNCHER_WORKERS_EVIDENCE_H_
#define CTRUN_LAUNCHER_WORKERS_EVIDENCE_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "launcher/workers/agent_board.h"

namespace ctrun {

// gdb's path on PATH; empty when it is not installed.
std::string FindGdb();

class EvidenceCollector {
 public:
  struct Target {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    StackDump python;
    std::string stacks_file;  // where the worker appends its Python stacks
    std::vector<std::string> last_lines;
  };

  // How long Python stacks may take before gdb goes ahead without them.
  static constexpr absl::Duration kPythonWait = absl::Seconds(2);

  // Starts collecting into `dir` (created) by `deadline`; `gdb`: its path,
  // or empty when it is not installed.
  EvidenceCollector(std::string dir, std::vector<Target> targets,
                    std::string gdb, absl::Time now, absl::Time deadline);
  // Ends what still runs (Finish).
  ~EvidenceCollector();
  EvidenceCollector(const EvidenceCollector&) = delete;
  EvidenceCollector& operator=(const EvidenceCollector&) = delete;

  // Moves on at `now`; true once everything is in.
  bool Step(absl::Time now);
  // A child of the agent exited.
  void OnChildExit(pid_t pid);
  absl::Time NextDue() const {
    return stage_ == Stage::kDone ? absl::InfiniteFuture() : next_step_;
  }
  bool done() const { return stage_ == Stage::kDone; }

  // Ends it: gdb still reading a worker is killed (the worker continued),
  // what came is kept. Returns one line for the operator: where, and what.
  std::string Finish();

  const std::string& dir() const { return dir_; }
  const std::vector<Target>& targets() const { return targets_; }

 private:
  enum class Stage { kPython, kNative, kDone };
  struct Python {
    off_t from = 0;  // the stacks file's size before the signal
    off_t seen = -1;
    int still = 0;  // steps it has not grown
    bool done = false;
  };

  void StartNative();
  void SavePython();

  const std::string dir_;
  std::vector<Target> targets_;
  const std::string gdb_;
  const absl::Time deadline_;
  Stage stage_ = Stage::kPython;
  absl::Time python_until_;
  absl::Time next_step_;
  std::vector<Python> python_;
  std::vector<pid_t> gdbs_;  // -1 once exited
  int python_saved_ = 0;
  int native_started_ = 0;
  int native_done_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_EVIDENCE_H_
