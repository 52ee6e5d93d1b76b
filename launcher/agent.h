// Agent: one node's side of a job, as a thin loop around AgentPolicy
// (agent_policy.h, the decisions) and WorkerGroup (worker_group.h, the
// processes).
//
// One thread runs everything from one epoll loop: worker exits (SIGCHLD
// through a signalfd, so at once, without polling), signals, worker output
// (a bounded read per wakeup), and messages from the rendezvous session
// (handed over by gRPC's threads through an eventfd). The console is
// written by its own threads (console.h), so neither a worker that prints
// without pause nor a console that stops reading delays a heartbeat or a
// signal.
#ifndef CTRUN_LAUNCHER_AGENT_H_
#define CTRUN_LAUNCHER_AGENT_H_

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launcher/hw/nvml.h"
#include "launcher/policy/agent_policy.h"
#include "launcher/policy/gpu_watch.h"
#include "launcher/workers/agent_board.h"
#include "launcher/workers/console.h"
#include "launcher/workers/evidence.h"
#include "launcher/workers/health_check.h"
#include "launcher/workers/template_spawner.h"
#include "launcher/workers/worker_group.h"
#include "rendezvous/client/client.h"
#include "rendezvous/ops/event_log.h"

namespace ctrun {

struct AgentConfig {
  WorkerGroupConfig workers;  // options, command, environment, logs
  Connection connection;      // to the rendezvous
  // When set, the agent's events go there (--event_log).
  std::shared_ptr<EventLog> event_log;
};

// The signals the agent takes through its signalfd: SIGCHLD, SIGUSR1,
// SIGUSR2 and `handled`. They must be blocked in every thread, so block
// them before any thread starts.
sigset_t AgentSignals(const std::vector<int>& handled);

class Agent {
 public:
  // Writes to `out` and `err` (not owned).
  Agent(AgentConfig config, Console* out, Console* err);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end and returns ctrun's exit code: 0 when every
  // worker succeeded; the root-cause worker's code (128 + signal when
  // killed) when the job failed; 128 + signal when a handled signal stopped
  // it; 1 when the rendezvous was lost.
  int Run();

  // Whether Run ended because of a handled signal (SIGTERM, ...).
  bool stopped_by_signal() const { return stopped_by_signal_; }

  class Inbox;

 private:
  absl::Status Setup();
  // Waits for events until `deadline` and feeds them to the policy.
  void Poll(absl::Time deadline);
  void OnSignals();
  void DrainInbox();
  // Reads torchrun's file-timer FIFO and hands its whole lines over.
  void ReadTimerRequests();
  // Sets up what workers report progress with: ctrun's Python module, the
  // progress board, and torchrun's file-timer FIFO when asked for.
  absl::Status SetupProgress(WorkerGroupConfig& group);
  // Plans each worker's --numa_binding, and says what it is.
  absl::Status SetupBinding(WorkerGroupConfig& group);
  // Starts the template interpreter of warm starts when asked for
  // (--preload, or --recovery=inprocess) and the workers run Python.
  void SetupTemplate(WorkerGroupConfig& group);
  void StartEvidence(const agent_effect::CollectEvidence& collect);
  void EndEvidence();
  // Ends the evidence, says where it is and shows the hung worker's last
  // lines and stack; returns what each worker's stacks say of its main
  // thread.
  std::vector<RankReading> FinishEvidence();
  void KillTimedOut(const agent_effect::KillTimedOut& k);
  // Reads every GPU through NVML and hands what this node's workers hold
  // to the GPU watch.
  void ReadGpus();
  // One line per rank of the last round: wall time, peak RSS, GPU usage.
  void ReportUsage();
  // Carries out `effects` in order, with what they lead to.
  void Apply(AgentEffects effects);
  void Apply(const AgentEffect& effect);
  void OpenSession(std::optional<int64_t> resume_round,
                   const std::string& unhealthy);
  // Starts the health check; its verdict comes through the inbox.
  void CheckHealth();
  void Probe();
  v1::AgentMessage MakeRejoin(int64_t round,
                              const std::string& unhealthy) const;

  // Constant after construction.
  const AgentConfig config_;
  Console* const out_;
  Console* const err_;

  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  std::shared_ptr<Inbox> inbox_;  // shared with gRPC's callbacks

  AgentPolicy policy_;
  std::unique_ptr<TemplateSpawner> template_;  // outlives workers_
  std::unique_ptr<WorkerGroup> workers_;
  // The run directory's kAgentFolder: the board, the module, the FIFO.
  std::string agent_dir_;
  std::unique_ptr<ProgressBoard> board_;
  int timer_fd_ = -1;
  std::string timer_partial_;
  std::unique_ptr<EvidenceCollector> evidence_;
  int evidence_focus_ = -1;
  std::unique_ptr<Nvml> nvml_;           // null without NVIDIA's driver
  std::unique_ptr<GpuWatch> gpu_watch_;  // with nvml_
  // The health check under way, if any; ended before nvml_, which it reads.
  std::unique_ptr<HealthCheck> health_;
  // The current round's workers, by local rank, for ReportUsage.
  struct RankRun {
    int rank = 0;
    absl::Time started;
    std::optional<WorkerExit> exit;
  };
  std::vector<RankRun> rank_runs_;
  // The OOM kills of this agent's memory cgroup when workers last started.
  std::optional<uint64_t> oom_kills_;
  std::unique_ptr<SessionStream> session_;
  // Which session the inbox's items belong to; bumped by every open and
  // cancel, so that a replaced session's last words are dropped.
  uint64_t session_generation_ = 0;
  uint64_t incarnation_ = 0;
  // The MASTER_PORT of the last assignment, offered again while free.
  int master_port_ = 0;
  std::optional<int> exit_code_;
  bool stopped_by_signal_ = false;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_AGENT_H_
