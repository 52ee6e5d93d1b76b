// AgentPolicy: what one node's agent decides, as a pure state machine.
//
// Inputs are the rendezvous session's messages and its end, the workers'
// start and exits, signals, and the passage of time (Tick); each appends the
// agent's decisions to `AgentEffects`, in the order they are to be carried
// out. The policy does no I/O, owns no thread and reads no clock: every
// input carries `now`, a monotonic time. The agent's loop (agent.h) applies
// the effects; tests read them directly.
//
// Not thread-safe: the owner serialises all calls.
//
// Two things describe a node at any moment:
// - its phase, what it does with its workers:
//     kJoining   no workers; waits in a round for an assignment
//     kRunning   workers run (some may have exited 0 already)
//     kCollecting  a worker of the job hung: evidence (stacks, last output)
//                is collected from the live workers, for at most
//                --hang_evidence_timeout, before they are stopped
//     kStopping  workers were asked to stop; what follows is decided
//     kWaiting   no live workers, this round's outcome reported; waits for
//                the rendezvous to say what is next (restart, job end)
//     kDone      the exit code is decided; nothing more happens
// - its link, how it stands with the rendezvous:
//     kConnecting  a fresh join was sent, no answer yet (join timeout)
//     kOpen        the rendezvous answered on this session
//     kResuming    the session broke while the node held an assignment of a
//                  service that keeps state: its workers keep running while
//                  it resumes with its incarnation (reconnect timeout)
//     kRetrying    the session broke while joining: it joins again
//                  (reconnect timeout)
//     kClosed      no session: the node exits once its workers stop, or
//                  joins afresh (a rendezvous that came back without it)
//
// The transitions, row by row, are in agent_policy.cc; the rules:
// - An assignment starts the workers. A worker failure stops the others and
//   is reported; all workers succeeding is reported; the rendezvous then
//   decides (RestartRequired, JobFinished, JobFailed).
// - A restart stops the workers (SIGTERM, SIGKILL after the shutdown
//   timeout, abandoned 10 s later) and rejoins the newest round asked for.
// - A handled signal stops the workers with that signal, for good: the
//   agent exits 128 + signal. A second one SIGKILLs them. SIGUSR1/SIGUSR2
//   are forwarded. A signal that the parent delivered to the workers itself
//   (a Slurm step) is not sent again.
// - Coordinated stops (agent_policy_stop.cc, --preemption_grace): SIGTERM,
//   SIGUSR1 or SIGUSR2 while workers run and call the stop check asks the
//   rendezvous for one (StopVote.asked) instead. Told to hold (StopAt), the
//   node reads the board often and says once every live worker holds in
//   its check (StopVote.held, with the most heartbeats among them); told
//   the step, it posts it. The workers then end by themselves (exit 0: the
//   job finishes). Without an end within the grace, or on the signal
//   again, the signal acts as without a stop, the board saying so first
//   (the workers' check holds back a preemption signal delivered to them
//   until then). A new round asks again once its workers call the check.
//   A job that finishes after a stop on SIGUSR1 inside Slurm is requeued
//   by group rank 0's node (Slurm's --signal=USR1@T before the limit).
// - Job control: SIGTSTP (Ctrl-Z), or the worker in ctrun's process group
//   stopping on the terminal while ctrun is in the background, stops the
//   workers and the agent together; once the agent is continued, so are
//   they, and a heartbeat goes out at once. A rendezvous elsewhere may
//   have declared the node lost meanwhile (heartbeat_timeout): the node
//   then rejoins as after any loss.
// - Workers asked to stop are never asked again by a later decision (a
//   second SIGTERM can cut short the handler that saves their state); the
//   strongest ending wins: signal, job failure, job end, lost rendezvous.
// - Reports are sent only on an open link; a resumed session hears the last
//   one again (one sent while the service was away may be lost).
// - Health gate (config.health_gate): each fresh join and each rejoin after
//   stopped workers waits for the health check (CheckHealth). A node that
//   fails says why and joins or rejoins with Join/Rejoin.unhealthy: the
//   rendezvous refuses it and quarantines its host (--quarantine_seconds),
//   and the agent ends as for any refusal.
// - Progress (progress_monitor.h): while workers run, the board is read
//   every ProgressMonitor::kPollEvery (ReadProgress, answered by
//   OnProgressRead) and what was learned is reported every kReportEvery. A
//   hung worker is a failure (report FAILED with `hung`), and its node
//   collects evidence before stopping; every other node does on the
//   rendezvous's restart or failure with `collect_evidence`/`hung`. The
//   hang is reported once the stacks are read (hang_culprit.h): when they
//   show the rank that stopped first waiting in a collective and another
//   rank here outside any, that other rank is named instead. A
//   decision to stop that comes while evidence is collected waits for it,
//   but for a handled signal, which cuts it short.
// - torchrun's file timers (file_timers.h): an expired one kills its
//   process with the timer's signal; a worker that dies of it is a failure
//   whose cause names the scope. The agent is not signalled (torchrun's is).
// - A spare (--spares) says so once. When its program parks in
//   wait_for_slot, it starts its workers at once, without a rank; they
//   take the world of the slot it is given (HandOver), with
//   --recovery_timeout to do so, and one that exited meanwhile starts
//   then. A parked worker's end is no failure.
// - In-process recovery (--recovery=inprocess): a worker failure is
//   reported as always, but the live workers are told that their round
//   ends (EndRound) instead of being stopped. A restart, a lost or a new
//   node, keeps them (unless one of them does not recover in process: its
//   slot on the board says; then this node restarts the old way): the node
//   rejoins with its workers running, hands the kept ones the new world
//   (HandOver), starts processes only for the local ranks that have none,
//   and gives each kept worker --recovery_timeout to take the new world;
//   one that does not is killed and started again, and its end is no
//   failure.
// - A job of several ranks whose workers formed no process group within
//   --process_group_check of their start (nothing listens on MASTER_PORT
//   on group rank 0's node, no worker there uses ctrun's store or
//   recovers in process) is said once, by that node; nothing stops.
// - Events (Record, docs/events.md): the assignment, each worker's start
//   and exit, a hang, a restart asked for, the job's end and the agent's
//   exit, as they are decided.
#ifndef CTRUN_LAUNCHER_POLICY_AGENT_POLICY_H_
#define CTRUN_LAUNCHER_POLICY_AGENT_POLICY_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ctrun/v1/event.pb.h"
#include "ctrun/v1/rendezvous.pb.h"
#include "launcher/options/launch_options.h"
#include "launcher/policy/failure_report.h"
#include "launcher/policy/file_timers.h"
#include "launcher/policy/hang_culprit.h"
#include "launcher/policy/job_recap.h"
#include "launcher/policy/progress_monitor.h"

namespace ctrun {

// The agent's decisions. Each is carried out by the loop, in order.
namespace agent_effect {
// "ctrun: LINE" on stderr.
struct Say {
  std::string line;
};
// TEXT verbatim on stderr (the failure summary).
struct Print {
  std::string text;
};
// Replaces the current session (if any) by a new one: a fresh join (with a
// new incarnation) when `resume_round` is empty, else a resume of this
// node's incarnation in that round.
struct OpenSession {
  std::optional<int64_t> resume_round;
  // A fresh join of a node that failed its health check: why (Join.
  // unhealthy).
  std::string unhealthy{};
};
// Ends the current session at once (the node is lost to the rendezvous).
struct CancelSession {};
// A message on the current session.
struct Send {
  v1::AgentMessage message;
};
// A Rejoin for `round` on the current session, with a master port candidate
// found free by the loop.
struct SendRejoin {
  int64_t round;
  std::string unhealthy{};  // as OpenSession's
};
// Runs the node's health check (--health_check, NVML) before a join or a
// rejoin; the loop answers with OnHealthChecked.
struct CheckHealth {};
// Starts one worker per local rank, or only those at `local_ranks` beside
// the live ones (in-process recovery); the loop answers with
// OnWorkersStarted.
struct StartWorkers {
  v1::Assignment assignment;
  std::vector<int> local_ranks;  // empty: every local rank
};
// In-process recovery: tells every live worker that `round` ends (its world
// file), so that ctrun.resilient releases it from what it is doing.
struct EndRound {
  int64_t round;
};
// A spare whose program parks in wait_for_slot: starts every local rank's
// worker without a rank; the loop answers with OnWorkersStarted.
struct ParkWorkers {};
// In-process recovery, or a spare's parked workers: hands the live workers
// at `local_ranks` the world of `assignment`.
struct HandOver {
  v1::Assignment assignment;
  std::vector<int> local_ranks;
};
// `signal` to the live worker at `local_rank` (its process group).
struct SignalWorker {
  int local_rank;
  int signal;
};
// `signal` to every live worker's process group.
struct SignalWorkers {
  int signal;
};
// The live workers did not die of SIGKILL: stop waiting for them.
struct AbandonWorkers {};
// No worker is alive any more: end what they left behind and emit the rest
// of their output, before anything said about them.
struct CollectWorkers {};
// Job control: the agent stops itself (SIGSTOP) and carries on with the
// next effect once it is continued (SIGCONT, the shell's `fg` or `bg`).
struct SuspendAgent {};
// A quick call to the rendezvous that does not wait for it to be up, to
// learn why it does not answer; the loop answers with OnProbeResult.
struct ProbeRendezvous {};
// Reads every worker's slot of the progress board; the loop answers with
// OnProgressRead.
struct ReadProgress {};
// Whether the job's process group formed, as group rank 0's node sees it:
// anything listening on `port` (MASTER_PORT), and the board; the loop
// answers with OnProcessGroupChecked.
struct CheckProcessGroup {
  int port;
};
// Collects the live workers' stacks and last output into `dir` (under the
// run directory) by `deadline`; `focus` is the local rank that hung here,
// or -1. The loop answers with OnEvidenceCollected when done early.
struct CollectEvidence {
  std::string dir;
  int focus = -1;
  absl::Time deadline;
};
// Ends evidence collection (what is not done by now is not waited for),
// says where it is, and continues the workers it stopped (gdb). The loop
// answers with OnStacksRead, always.
struct EndEvidence {};
// `signal` to process `pid` for file timer `scope`, if it is a worker or in
// a worker's process group; the edge says which it did. For a worker, the
// policy has said it already (its evidence is taken first).
struct KillTimedOut {
  pid_t pid;
  int signal;
  std::string scope;
};
// A coordinated stop as the workers' stop check (ctrun.should_stop()) is to
// see it on the board: kIdle none asked; kHold wait; kAt true from `step`
// heartbeats on; kFallback the preemption signal acts as without a stop.
enum class StopState { kIdle, kHold, kAt, kFallback };
struct PostStop {
  StopState state;
  int64_t step = 0;
  std::string reason{};
};
// Asks Slurm to requeue job `job_id` (slurm_requeue.h) and says how it
// went.
struct RequeueSlurmJob {
  std::string job_id;
};
// The agent exits with `code`.
struct Exit {
  int code;
};
// A line of the event log (--event_log). The loop stamps time and source,
// and names the job and the node where the policy could not.
struct Record {
  v1::Event event;
};
}  // namespace agent_effect

using AgentEffect = std::variant<
    agent_effect::Say, agent_effect::Print, agent_effect::OpenSession,
    agent_effect::CancelSession, agent_effect::Send, agent_effect::SendRejoin,
    agent_effect::CheckHealth, agent_effect::StartWorkers,
    agent_effect::ParkWorkers, agent_effect::EndRound, agent_effect::HandOver,
    agent_effect::SignalWorker, agent_effect::SignalWorkers,
    agent_effect::AbandonWorkers, agent_effect::CollectWorkers,
    agent_effect::SuspendAgent, agent_effect::ProbeRendezvous,
    agent_effect::ReadProgress, agent_effect::CheckProcessGroup,
    agent_effect::CollectEvidence, agent_effect::EndEvidence,
    agent_effect::KillTimedOut, agent_effect::PostStop,
    agent_effect::RequeueSlurmJob, agent_effect::Exit, agent_effect::Record>;
using AgentEffects = std::vector<AgentEffect>;

// "SIGTERM", or "signal N" for a number with no name.
std::string SignalName(int signal);

struct AgentPolicyConfig {
  LaunchOptions options;
  std::string hostname;  // for failure records
  std::string endpoint;  // the rendezvous, as messages name it
  // The agent's environment sets OMP_NUM_THREADS (else workers get 1, said
  // once).
  bool omp_threads_set = false;
  // The worker command parks in wait_for_slot (ParksForSlot): a spare
  // starts its workers while it waits, and hands them its slot's world.
  bool parks = false;
  // The node has a health check to pass (--health_check, or NVML's GPUs)
  // before each fresh join and each rejoin.
  bool health_gate = false;
};

// How one worker's start went (OnWorkersStarted), by local rank.
struct WorkerStart {
  int local_rank = 0;
  pid_t pid = -1;  // -1: it could not be started, see `error`
  std::string error_file;
  std::string error;
  absl::Time wall_time;  // of a failed start, for the failure summary
  bool warm = false;     // forked from the template (--preload)
};

// A worker's exit as the loop reaped it.
struct WorkerExit {
  int local_rank = 0;
  int exit_code = 0;     // 0 when killed
  int signal = 0;        // the signal that killed it, or 0
  absl::Time wall_time;  // for the failure summary
  // It stopped on SIGTTIN/SIGTTOU (`signal`) trying to use the terminal,
  // which would hang the job for good; the worker group ended it.
  bool stopped_on_terminal = false;
  // Its largest resident set, its waited-for children included (wait4's
  // ru_maxrss). Started with vfork, a worker's count begins at the agent's
  // own (some 9 MiB): below that it reads high.
  uint64_t peak_rss_bytes = 0;
  // For its failure's class (classify_failure.h): its error file's message
  // and its last output lines, as the agent read them when it was reaped.
  std::string error_message{};
  std::vector<std::string> last_lines{};
  // Killed by SIGKILL while the kernel counted an OOM kill in the agent's
  // memory cgroup since the workers started.
  bool oom_killed = false;
  // Some worker of this node signalled a step (a heartbeat, an outermost
  // section's end) in this attempt.
  bool attempt_stepped = false;
};

class AgentPolicy {
 public:
  enum class Phase {
    kJoining,
    kRunning,
    kCollecting,
    kStopping,
    kWaiting,
    kDone
  };
  enum class Link { kConnecting, kOpen, kResuming, kRetrying, kClosed };

  // How long a worker that ignores SIGKILL (stuck in the kernel) may hold
  // up the agent before it is abandoned.
  static constexpr absl::Duration kGiveUpAfterKill = absl::Seconds(10);
  // Progress of a collecting round is printed only after this long; then
  // on each change, at most this often, and this often without one.
  static constexpr absl::Duration kProgressQuietFor = absl::Seconds(2);
  static constexpr absl::Duration kProgressEvery = absl::Seconds(5);
  static constexpr absl::Duration kProgressRepeat = absl::Seconds(30);
  // A broken session is opened again after this (never in a tight loop).
  static constexpr absl::Duration kReopenDelay = absl::Milliseconds(100);
  // A rendezvous silent this long after a join is probed, then again this
  // often: a TLS mismatch fails at once instead of after the join timeout.
  static constexpr absl::Duration kProbeAfter = absl::Seconds(2);
  static constexpr absl::Duration kProbeEvery = absl::Seconds(3);
  // A rendezvous that cannot be reached is said at the first probe that
  // fails to connect, then this often while it stays so.
  static constexpr absl::Duration kUnreachableEvery = absl::Seconds(30);
  // An in-process round is said recovered once every worker formed its
  // communicator again and stepped (a heartbeat or an outermost section's
  // end); where no worker sends progress signals, only that the group
  // formed; where some have not stepped within --recovery_timeout of the
  // group forming, which ones (round_not_recovered).

  explicit AgentPolicy(AgentPolicyConfig config);
  // The line that ends the job on this node (job_recap.h), once it exits.
  std::string Recap(int exit_code, absl::Time now) const {
    return recap_.Line(exit_code, now);
  }

  // Opens the first session.
  void Start(absl::Time now, AgentEffects* effects);
  void OnMessage(const v1::ServerMessage& message, absl::Time now,
                 AgentEffects* effects);
  // The current session ended with `status` (never after CancelSession's
  // session: the loop drops that one's end); `redirected`: a standby
  // replica refused it, naming the leader the next session goes to.
  void OnSessionEnd(const absl::Status& status, bool redirected, absl::Time now,
                    AgentEffects* effects);
  // The answer to StartWorkers, one entry per local rank.
  void OnWorkersStarted(const std::vector<WorkerStart>& started, absl::Time now,
                        AgentEffects* effects);
  void OnWorkerExit(const WorkerExit& exit, absl::Time now,
                    AgentEffects* effects);
  // A handled signal; `from_parent`: sent by ctrun's parent process.
  void OnSignal(int signal, bool from_parent, absl::Time now,
                AgentEffects* effects);
  // While a stop holds, the board is read this often.
  static constexpr absl::Duration kHoldPollEvery = absl::Milliseconds(5);
  // The worker in ctrun's process group stopped on the terminal while
  // ctrun was in the background (WorkerGroup::TakeTerminalStop).
  void OnTerminalStop(absl::Time now, AgentEffects* effects);
  // The answer to CheckHealth: empty when the node is healthy, else one
  // line saying why not.
  void OnHealthChecked(const std::string& problem, absl::Time now,
                       AgentEffects* effects);
  // The answer to ProbeRendezvous.
  void OnProbeResult(const absl::Status& status, absl::Time now,
                     AgentEffects* effects);
  // The answer to ReadProgress: samples[i] for local rank i. `wall_now` is
  // `now` on the wall clock, for failure records.
  void OnProgressRead(const std::vector<ProgressSample>& samples,
                      absl::Time now, absl::Time wall_now,
                      AgentEffects* effects);
  // The answer to CheckProcessGroup: something listens on MASTER_PORT here;
  // the board's samples, by local rank.
  void OnProcessGroupChecked(bool listening,
                             const std::vector<ProgressSample>& samples,
                             absl::Time now, AgentEffects* effects);
  // The evidence asked for by CollectEvidence is complete.
  void OnEvidenceCollected(absl::Time now, AgentEffects* effects);
  // The answer to EndEvidence: where each worker's stacks show its main
  // thread (none read when there were none). A hang declared here is
  // reported to the rendezvous only now, naming the rank the others wait
  // for when the stacks tell it.
  void OnStacksRead(const std::vector<RankReading>& readings,
                    AgentEffects* effects);
  // A line a worker wrote to torchrun's file-timer FIFO.
  void OnTimerRequest(absl::string_view line, absl::Time now,
                      absl::Time wall_now, AgentEffects* effects);
  // Applies everything due at `now`.
  void Tick(absl::Time now, AgentEffects* effects);
  // When Tick next has something to do; InfiniteFuture when nothing is due.
  absl::Time NextDeadline() const;

  Phase phase() const { return phase_; }
  Link link() const { return link_; }
  // The current assignment's round, or -1 before the first.
  int64_t round() const { return assignment_ ? assignment_->round() : -1; }
  int live_workers() const;
  // Where local rank `local_rank` writes its error file; empty before it
  // started.
  std::string ErrorFileOf(int local_rank) const;
  // Whether a handled signal decided the exit.
  bool stopped_by_signal() const { return ending_ == Ending::kSignal; }
  const ProgressMonitor& monitor() const { return monitor_; }

 private:
  // Why the agent will exit, weakest first: a stronger one replaces a
  // weaker one.
  enum class Ending { kNone, kLost, kJobFinished, kJobFailed, kSignal };
  // What follows once the workers have stopped, when no ending is decided.
  enum class Next { kWait, kRejoin, kJoinAfresh };

  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool alive = false;
    std::string error_file;
    // The file timer that ctrun killed it for, and with which signal.
    std::string timer_scope;
    int timer_signal = 0;
    absl::Time started;
    // In-process recovery: its slot says it recovers in process, and the
    // last round whose world it took.
    bool resilient = false;
    int64_t round_left = -1;
    // It kept its process into this round; it was forked warm.
    bool kept = false;
    bool warm = false;
    // A new process of an in-process round (a replacement): it recovers in
    // process once its script reaches ctrun.resilient, and until then takes
    // a newer round's world as it forms its group (the `ctrun` module).
    bool replacement = false;
    // Killed for not taking the new world in time: its end is no failure,
    // and it is started again.
    bool restarting = false;
  };

  // Appends an event of the current round (if any) to `effects`.
  v1::Event& Record(const char* what, AgentEffects* effects) const;
  void OnAssignment(const v1::Assignment& assignment, absl::Time now,
                    AgentEffects* effects);
  // JobFailed's root cause as a record of another node's failure.
  static WorkerFailureRecord RootCause(const v1::JobFailed& failed);
  // The record of worker `w`'s failed `exit`, with the class its facts
  // give it.
  WorkerFailureRecord ExitFailure(const Worker& w, const WorkerExit& exit,
                                  const std::string& cause) const;
  void OnRestartRequired(const v1::RestartRequired& restart, absl::Time now,
                         AgentEffects* effects);
  void OnResumed(const v1::Resumed& resumed, AgentEffects* effects);
  // Coordinated stops (agent_policy_stop.cc). AskToStop: a preemption
  // signal asks the job for one; false when none can be asked (the signal
  // then acts as always). OnStopAt: the rendezvous's hold or step.
  // TrackStop: the board's samples while workers run (who calls the check,
  // who holds). TickStop: the hold's polls and the grace.
  bool AskToStop(int signal, absl::Time now, AgentEffects* effects);
  void SendStopAsk(AgentEffects* effects);
  void OnStopAt(const v1::StopAt& stop, absl::Time now, AgentEffects* effects);
  void SendHeld(int64_t step, AgentEffects* effects);
  // The job finished: after a stop on SIGUSR1 in Slurm, group rank 0's
  // node asks for a requeue.
  void RequeueAfterStop(AgentEffects* effects) const;
  void TrackStop(const std::vector<ProgressSample>& samples,
                 AgentEffects* effects);
  void TickStop(absl::Time now, AgentEffects* effects);
  // What a handled signal does without a coordinated stop; `delivered`:
  // the workers had it from the parent already.
  void ActOnSignal(int signal, bool delivered, absl::Time now,
                   AgentEffects* effects);
  void OnProgress(const v1::Progress& progress, absl::Time now,
                  AgentEffects* effects);
  void PrintProgress(absl::Time now, AgentEffects* effects);
  // When the joining node next says how the round stands.
  absl::Time ProgressDue() const {
    return phase_ == Phase::kJoining && link_ == Link::kOpen && progress_
               ? progress_due_
               : absl::InfiniteFuture();
  }
  void OnWorkerFailure(const WorkerFailureRecord& failure, absl::Time now,
                       AgentEffects* effects);
  // A worker of this node hung: the root cause, the report, the evidence.
  // `why`, when given, is the first worker's cause instead of its silence.
  void OnHang(const std::vector<SilentWorker>& silent, absl::Time now,
              absl::Time wall_now, AgentEffects* effects,
              const std::string& why = "");
  // Collects evidence from the live workers before they are stopped; a
  // no-op unless workers run.
  void StartEvidence(int focus, absl::Time now, AgentEffects* effects);
  // A file timer of `w` expired: a failure like a hang, its evidence first.
  void OnTimerExpired(Worker& w, const FileTimers::Expired& x, absl::Time now,
                      AgentEffects* effects);
  // Evidence is in (or its time is up): the workers stop as decided.
  void EndEvidence(absl::Time now, AgentEffects* effects);
  // The expired file timers' kills, then every worker stopped.
  void StopAfterEvidence(absl::Time now, AgentEffects* effects);
  // Ends the collecting phase without deciding what follows.
  void LeaveCollecting(AgentEffects* effects);
  // Stops the job with the agent, and continues it with the agent.
  // `workers_told`: the workers had the stop signal already.
  void Suspend(bool workers_told, absl::Time now, AgentEffects* effects);

  // Decides to exit for `ending` (unless a stronger ending is decided)
  // once the workers have stopped.
  void End(Ending ending, absl::Time now, AgentEffects* effects);
  // Asks the live workers to stop with `signal` (unless `send` is false or
  // they were asked already) and arms the SIGKILL deadline; moves on at once
  // when none is alive.
  void StopWorkers(int signal, bool send, absl::Time now,
                   AgentEffects* effects);
  // Every worker is gone: exit, rejoin, join afresh or wait.
  void OnStopped(absl::Time now, AgentEffects* effects);
  int ExitCode(AgentEffects* effects) const;

  // Tick's parts, in its order. TickLink: the join and reconnect
  // deadlines and the probe; false when the agent ended. TickProgress: the
  // board's poll and the progress report. TickFileTimers: torchrun's
  // expired timers. TickSession: reopening the session, heartbeats.
  // TickStopping: SIGKILL after the shutdown timeout, then giving up.
  bool TickLink(absl::Time now, AgentEffects* effects);
  void TickProgress(absl::Time now, AgentEffects* effects);
  void TickFileTimers(absl::Time now, AgentEffects* effects);
  void TickSession(absl::Time now, AgentEffects* effects);
  void TickStopping(absl::Time now, AgentEffects* effects);
  void TickRecovery(absl::Time now, AgentEffects* effects);
  void TickProcessGroup(absl::Time now, AgentEffects* effects);

  // In-process recovery: whether the restart to `round` keeps this node's
  // live workers (all of them recover in process); says why not when not.
  bool KeepsWorkers(const v1::RestartRequired& restart,
                    AgentEffects* effects) const;
  // "rank 5" or "ranks 4,6" for these local ranks' global ranks; with
  // `listed`, "ranks [4,6]" whatever their number (for records).
  std::string Ranks(const std::vector<int>& local_ranks,
                    bool listed = false) const;
  // Tells the live workers that this round ends, once per round.
  void EndRoundOnce(absl::Time now, AgentEffects* effects);
  // Follows an in-process round until every worker formed its
  // communicator again (and stepped, when they signal), then says how
  // long each part took; past its deadline, names the ranks that have not
  // and ends the round as a hang does (their stacks, then a restart).
  void TrackRecovery(const std::vector<ProgressSample>& samples, absl::Time now,
                     absl::Time wall_now, AgentEffects* effects);
  // Kills a kept worker that cannot take the round's world (`why`), to
  // start it anew; the round's deadline leaves its new process the time
  // any start gets.
  void RestartUnreleased(Worker& w, const std::string& why, absl::Time now,
                         AgentEffects* effects);
  // The ranks of an in-process round that did not form the group or step
  // by its deadline, named with where they are.
  void RoundNotRecovered(const std::vector<int>& unformed,
                         const std::vector<int>& unstepped, absl::Time now,
                         absl::Time wall_now, AgentEffects* effects);
  // A spare's parked workers started (OnWorkersStarted while joining), and
  // the slot's world handed to those still alive; `fresh` start anew.
  void OnParked(const std::vector<WorkerStart>& started, absl::Time now,
                AgentEffects* effects);
  void Unpark(const v1::Assignment& a, const std::vector<int>& kept,
              const std::vector<int>& fresh, absl::Time now,
              AgentEffects* effects);
  // The workers of the new assignment run (those started, those kept).
  void WorkersUp(absl::Time now, AgentEffects* effects);
  bool inprocess() const {
    return config_.options.recovery == Recovery::kInProcess;
  }

  // The session broke; `why` for the operator. `redirected`: a standby
  // sent it to the leader, which is no news: at once and quietly.
  void Reconnect(Link link, const absl::Status& why, bool redirected,
                 absl::Time now, AgentEffects* effects);
  void OpenSession(std::optional<int64_t> resume_round, absl::Time now,
                   AgentEffects* effects);
  void CloseLink(AgentEffects* effects);
  void Report(AgentEffects* effects) const;
  void SendRejoinIfOwed(AgentEffects* effects);
  // A fresh join, or the owed rejoin, once the health check (if any) passed
  // or failed.
  void JoinFresh(absl::Time now, AgentEffects* effects);
  void Rejoin(int64_t round, AgentEffects* effects);

  // Constant after construction.
  const AgentPolicyConfig config_;

  Phase phase_ = Phase::kJoining;
  Link link_ = Link::kConnecting;
  Ending ending_ = Ending::kNone;
  Next next_ = Next::kWait;
  int64_t rejoin_round_ = -1;  // with Next::kRejoin
  // Set when the workers stopped for a rejoin that the link could not carry
  // yet; sent once it is open.
  std::optional<int64_t> owed_rejoin_;
  // What waits for the health check: a fresh join, or the rejoin of
  // rejoin_round_; why the last check failed ("" when it passed).
  enum class AfterHealth { kNothing, kJoin, kRejoin };
  AfterHealth after_health_ = AfterHealth::kNothing;
  std::string unhealthy_;
  int exit_signal_ = 0;      // with Ending::kSignal
  std::string job_failure_;  // with Ending::kJobFailed
  // The job's root cause as the rendezvous recorded it (JobFailed), which
  // every node names and exits with, its own failures after it.
  std::optional<WorkerFailureRecord> root_cause_;

  std::optional<v1::Assignment> assignment_;
  int64_t assignments_ = 0;  // ever received: 0 for a spare never admitted
  // This node was told it waits as a spare (said once, until assigned);
  // its workers were started parked (config_.parks).
  bool told_spare_ = false;
  bool parked_ = false;
  std::vector<Worker> workers_;
  // What this round's last report said: RUNNING, SUCCEEDED or FAILED.
  v1::WorkerReport::State report_ = v1::WorkerReport::RUNNING;
  // In-process recovery in this round: workers kept, and how long until
  // every worker formed its group again (0: not yet, or not in process).
  int32_t kept_workers_ = 0;
  double recovery_s_ = 0;
  std::vector<WorkerFailureRecord> failures_;  // this attempt, first first
  // The hang declared here whose stacks are being collected (an index into
  // failures_), and its report to the rendezvous, owed until they are read.
  std::optional<size_t> hang_record_;
  bool report_owed_ = false;
  bool omp_notice_given_ = false;
  // Restarts the service gave back (Assignment.restart_refunded), in order.
  std::vector<std::string> refunds_;
  // The job failed because a worker hung (JobFailed.hung).
  bool job_hung_ = false;
  bool job_no_progress_ = false;
  // A worker of this node signalled a step in some attempt.
  bool stepped_ever_ = false;

  ProgressMonitor monitor_;
  FileTimers timers_;
  int malformed_timer_requests_ = 0;
  // Expired timers' signals, sent when the evidence is in.
  std::vector<agent_effect::KillTimedOut> timer_kills_;
  // Wall clock minus the monotonic one, as last seen (for records made on
  // a tick).
  absl::Duration wall_offset_;

  // Deadlines; InfiniteFuture when not armed.
  absl::Time first_answer_deadline_ = absl::InfiniteFuture();
  absl::Time probe_at_ = absl::InfiniteFuture();
  // When the rendezvous out of reach may be said again.
  absl::Time unreachable_due_ = absl::InfinitePast();
  absl::Time reconnect_deadline_ = absl::InfiniteFuture();
  absl::Time reopen_at_ = absl::InfiniteFuture();
  std::optional<int64_t> reopen_round_;  // with reopen_at_
  absl::Time next_heartbeat_ = absl::InfiniteFuture();
  absl::Time kill_deadline_ = absl::InfiniteFuture();
  absl::Time give_up_deadline_ = absl::InfiniteFuture();
  absl::Time evidence_deadline_ = absl::InfiniteFuture();
  // When group rank 0's node checks that the job formed a process group
  // (--process_group_check); once checked, never again.
  absl::Time process_group_check_at_ = absl::InfiniteFuture();
  bool process_group_checked_ = false;
  // In-process recovery: when the kept workers must have taken the new
  // world; the round the live workers were last told ends.
  absl::Time recovery_deadline_ = absl::InfiniteFuture();
  int64_t ended_round_ = -1;
  absl::Time ended_at_;  // when ended_round_ ended here
  // The in-process round under way, until it is said.
  struct Recovering {
    absl::Time ended;              // the old round ended here
    std::vector<int> kept, fresh;  // local ranks
    // Every rank is to have stepped (or, without progress signals, formed
    // the group) by then: --recovery_timeout after the round's start.
    absl::Time deadline = absl::InfiniteFuture();
    // When every worker had formed its communicator again (their clock),
    // when that was seen, and each one's heartbeats then.
    absl::Time formed = absl::InfinitePast();
    absl::Time formed_seen;
    std::vector<uint64_t> beats, sections;
  };
  std::optional<Recovering> recovering_;
  JobRecap recap_;

  // A coordinated stop this node asked for: the signal, the round it was
  // asked in, when the signal acts as without it, and whether it did.
  struct Preemption {
    int signal = 0;
    std::string reason;
    int64_t round = -1;
    absl::Time deadline;
    bool fallen_back = false;
  };
  std::optional<Preemption> preemption_;
  // A live worker of this attempt calls the stop check (its slot says).
  bool stop_aware_ = false;
  // The round's stop: the rendezvous said hold, this node's held vote is
  // not sent yet, and the board is read again then; something other than
  // idle was posted this round.
  bool holding_ = false;
  absl::Time hold_poll_at_ = absl::InfiniteFuture();
  bool stop_posted_ = false;
  // The signal of the stop decided in this round (0: none).
  int stop_signal_ = 0;
  // The round's latest progress while joining, when it came, and when it
  // is next printed (InfiniteFuture: none came yet).
  std::optional<v1::Progress> progress_;
  absl::Time progress_at_;
  absl::Time progress_due_ = absl::InfiniteFuture();
  absl::Time progress_printed_ = absl::InfinitePast();
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_AGENT_POLICY_H_
