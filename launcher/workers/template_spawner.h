// TemplateSpawner: warm starts of Python workers (--preload, and
// --recovery=inprocess).
//
// One template interpreter per node (worker_lib/python/ctrun_template.py)
// imports the preloaded modules once; each Python worker is then forked from
// it, with its own environment, argv, working directory, stdout and stderr,
// and runs its script as `__main__`, as `python -u SCRIPT` would. The worker
// is the template's grandchild, reparented to the agent (a child
// subreaper): the worker group reaps, signals and contains it as any
// worker. What differs from a cold start is in docs/recovery.md.
//
// A start waits for the template's imports (one import and N forks beat N
// imports side by side), but the starts of one batch together at most
// TemplateConfig::wait_ms, since the agent's loop, heartbeats included,
// waits with them: a start that finds the template still importing then is
// cold, and later ones are warm once it is ready (said once). A start is cold
// (ExecSpawner) when the command is not the Python one the template runs, when
// the worker is bound to CPUs
// (--numa_binding), and for good once the template refused to fork
// (threads, a CUDA context, a failed import), took more than
// kReadyWithinMs to import or stopped answering: said once.
//
// Used by the agent's loop only; not thread-safe.
#ifndef CTRUN_LAUNCHER_WORKERS_TEMPLATE_SPAWNER_H_
#define CTRUN_LAUNCHER_WORKERS_TEMPLATE_SPAWNER_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "launcher/workers/worker_process.h"

namespace ctrun {

struct TemplateConfig {
  // The worker's interpreter and its flags, as the worker command starts
  // with them (python, -u): only such commands are forked.
  std::vector<std::string> python;
  std::string script;                // ctrun_template.py
  std::vector<std::string> modules;  // to import once
  // A module that is not installed is skipped (the default preload, torch
  // when it is there), instead of turning warm starts off.
  bool optional = false;
  EnvMap env;  // the template's environment
  // How long one batch of starts may wait for the imports (at most
  // kReadyWithinMs), and one start for the template's answer (at most
  // kAnswerWithinMs): the agent's loop, heartbeats included, waits with
  // them, so the agent sets it well inside the heartbeat timeout.
  int wait_ms = 30000;
  // Says a line (once per cause) when warm starts are off.
  std::function<void(const std::string&)> say;
};

class TemplateSpawner final : public Spawner {
 public:
  // How long the template may take to answer a start before it is given up
  // (or TemplateConfig::wait_ms, when less).
  static constexpr int kAnswerWithinMs = 5000;
  // How long the template may take to import before warm starts end.
  static constexpr int kReadyWithinMs = 30000;

  // Starts the template at once; it imports while the node joins.
  explicit TemplateSpawner(TemplateConfig config);
  ~TemplateSpawner() override;
  TemplateSpawner(const TemplateSpawner&) = delete;
  TemplateSpawner& operator=(const TemplateSpawner&) = delete;

  absl::StatusOr<SpawnedProcess> Spawn(const std::vector<std::string>& argv,
                                       const EnvMap& env,
                                       const SpawnOptions& options) override;
  pid_t helper() const override { return pid_; }

  // Starts so far that were forked from the template.
  int warm_starts() const { return warm_starts_; }

 private:
  enum class State { kImporting, kReady, kOff };
  // Whether the template is ready, waiting for its imports if need be.
  bool Ready();
  // Warm starts end for good; `why` is said once.
  void TurnOff(const std::string& why);
  absl::StatusOr<SpawnedProcess> Fork(const std::vector<std::string>& argv,
                                      const EnvMap& env,
                                      const SpawnOptions& options);

  const TemplateConfig config_;
  ExecSpawner exec_;
  State state_ = State::kImporting;
  absl::Time started_ = absl::Now();
  // Until when the current batch of starts may wait for the imports.
  absl::Time wait_until_ = absl::InfinitePast();
  bool said_importing_ = false;
  int socket_ = -1;
  pid_t pid_ = -1;
  int warm_starts_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_TEMPLATE_SPAWNER_H_
