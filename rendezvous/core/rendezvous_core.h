// RendezvousCore: jobs, rounds, leases and each job's KV store, as a pure
// state machine.
//
// Inputs are the agents' session messages, the end of a session, and the
// passage of time (Tick); each input appends its decisions to `Effects`:
// messages to send on sessions, sessions to end with a status, and store
// callbacks to run. The core does no I/O, owns no thread and reads no clock:
// every input carries `now`, a monotonic time. The gRPC service applies the
// effects after releasing its lock; tests read them directly.
//
// Not thread-safe: the owner serialises all calls.
//
// Written as one file per concern: rendezvous_core.cc (messages in, the
// clock, the store), _join.cc (joins, resumes, rejoins, reports, nodes
// leaving), _rounds.cc (rounds opening and closing, jobs failing and
// finishing, progress), _status.cc (a job as seen from outside),
// _restore.cc (snapshots, checkpoints, restore); rendezvous_core_state.h
// is the state they share.
//
// Semantics (DESIGN.md, "Rendezvous semantics"):
// - A job is created by its first join and keeps its settings.
// - A round closes when max_nodes have joined; or when at least min_nodes
//   have joined and either the last-call window has passed or, in a round
//   after the first, every live node of the job has rejoined. Fewer than
//   min_nodes when the join timeout passes fails the job.
// - Group ranks: nodes with a rank hint first (by hint), then nodes of the
//   previous round in their previous order, then new nodes by hostname, pid
//   and incarnation. Global ranks are prefix sums of local world sizes.
// - Spares (JobSettings.spares): up to that many nodes beyond max_nodes
//   wait without a rank. A member lost while the job runs or collects
//   gives its group rank and rank hint to one of them (of its segment when
//   one is), which ranks in its place: every other node keeps its ranks
//   and the world its size.
// - A closed session loses its node at once; a node silent for
//   heartbeat_timeout is lost and its session ended with ABORTED.
// - A worker failure opens the next round and spends one restart; a lost node
//   or a waiting node (while below max_nodes) opens it for free. A failure
//   with no restart left fails the job after the failure settle time, unless
//   a node loss explains it; a loss right after a failure refunds the
//   failure's restart. All nodes succeeding finishes the job.
// - A hung worker (WorkerFailure.hung) counts as a failure; its round is
//   opened with WORKER_HUNG and collect_evidence, and a job it fails is
//   failed as hung.
// - Progress reports: the job keeps the longest silence reported per
//   section across rounds (assignments carry it, Learned tells its growth)
//   and names stragglers (straggler_watch.h) to group rank 0's node.
// - Coordinated stops (coordinated_stop.h): a node's preemption signal
//   makes the running round agree on one step at which every rank stops.
// - Health gate: a node that failed its health check (Join.unhealthy,
//   Rejoin.unhealthy) is refused or evicted with FAILED_PRECONDITION, and
//   its hostname is quarantined for the time it asked: joins from it to any
//   job are refused until then.
// - A job is forgotten when its last session ends.
// - Durability (ctrund --state-dir): the owner journals the jobs that each
//   input changed (Effects::changed_jobs, SnapshotJob) and the store's
//   mutations; after a restart, Restore brings the jobs back with their
//   nodes detached, and an agent's join with `resume` reattaches its node
//   without a new round. A node that does not come back within the grace
//   is lost like any other.
#ifndef CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_H_
#define CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/v1/admin.pb.h"
#include "ctrun/v1/event.pb.h"
#include "ctrun/v1/journal.pb.h"
#include "ctrun/v1/rendezvous.pb.h"
#include "ctrun/v1/store.pb.h"
#include "rendezvous/core/kv_store.h"

namespace ctrun {

// Chosen by the owner, unique for the core's lifetime, below
// kDetachedSessions: the core names restored nodes that have not
// reconnected yet from there up.
using SessionId = uint64_t;
inline constexpr SessionId kDetachedSessions = SessionId{1} << 63;

struct Effects {
  // In order per session.
  std::vector<std::pair<SessionId, v1::ServerMessage>> messages;
  // End these sessions with this status once their messages are sent.
  std::vector<std::pair<SessionId, absl::Status>> finishes;
  std::vector<KvStore::Fired> fired;
  // Jobs whose journaled state (SnapshotJob) changed, possibly repeated.
  std::vector<std::string> changed_jobs;
  // What happened, in order, for the event log and the metrics; the owner
  // stamps `time` and `source`.
  std::vector<v1::Event> events;
};

struct RendezvousLimits {
  size_t max_jobs = 10000;
  KvStoreLimits store;
  // Keys plus values in the stores of all jobs together.
  size_t max_store_bytes = size_t{1} << 30;
  // Collecting rounds tell their nodes how they stand at most this often,
  // and a job's telling sends at most progress_messages_per_second
  // messages: a round of N nodes hears every N / rate seconds once that is
  // longer. Otherwise thousands of waiting nodes, each told every second,
  // would take the service's time from the joins being counted (a fifth of
  // it at 16384 nodes). Agents show a change at most every 5 s, so up to
  // 5000 nodes nothing shown comes later.
  absl::Duration progress_interval = absl::Seconds(1);
  int progress_messages_per_second = 1000;
  // How long a worker failure may turn out to be a node loss's consequence
  // (peers of a dead node fail before its closed session is seen): a failure
  // with no restart left fails the job only after this, and a restart spent
  // on a failure is given back if a node of that round is lost within it.
  absl::Duration failure_settle_time = absl::Milliseconds(1500);
  // The same for a hang whose rank waited in a collective: the rank it
  // waited for may be hung on another node, whose report comes once that
  // node has read its workers' stacks (--hang_evidence_timeout, 10 s by
  // default). Such a report ends the wait at once.
  absl::Duration waiting_hang_settle_time = absl::Seconds(10);
  // A session whose first message has not come this long after it opened
  // is ended with DEADLINE_EXCEEDED: a client that never speaks holds
  // nothing for long.
  absl::Duration first_message_timeout = absl::Seconds(10);
};

class RendezvousCore {
 public:
  explicit RendezvousCore(RendezvousLimits limits = {});
  ~RendezvousCore();

  RendezvousCore(const RendezvousCore&) = delete;
  RendezvousCore& operator=(const RendezvousCore&) = delete;

  // Whom a session's credentials speak for: the whole service, or the one
  // job of a job token (which its workers hold too).
  enum class Reach { kService, kOneJob };
  // A session opened: its join must come within first_message_timeout.
  // A kOneJob session's failed health check quarantines its host for that
  // job only.
  void OnSessionOpened(SessionId session, absl::Time now,
                       Reach reach = Reach::kService);
  // A message from the agent on `session`. The first one must be a join;
  // a refused message ends the session (see rendezvous.proto for codes).
  void OnMessage(SessionId session, const v1::AgentMessage& message,
                 absl::Time now, Effects* effects);
  // The session's stream ended (closed by the agent or broken). Unknown or
  // already ended sessions are ignored.
  void OnSessionClosed(SessionId session, absl::Time now, Effects* effects);
  // Applies everything due at `now`: lease expiry, last calls, join
  // timeouts, progress, store wait deadlines. The owner ticks at least every
  // kTickAtLeastEvery; ticks further apart than kPausedAfter mean that the
  // service itself was stopped (SIGSTOP, a suspended machine, the job of an
  // agent that hosts it stopped with Ctrl-Z), and the nodes' silence while
  // it was is not held against their heartbeat_timeout.
  void Tick(absl::Time now, Effects* effects);
  static constexpr absl::Duration kTickAtLeastEvery = absl::Seconds(1);
  static constexpr absl::Duration kPausedAfter = absl::Seconds(3);
  // When Tick next has something to do; InfiniteFuture when nothing is due.
  // May be early (Tick then does nothing), never late.
  absl::Time NextDeadline() const;

  // The store of the scope's job, fenced by round: NOT_FOUND for an unknown
  // job, ABORTED for a round other than the job's current one. Valid until
  // the next call into the core.
  absl::StatusOr<KvStore*> Store(const v1::StoreScope& scope);

  // What a journal keeps of the job: its round, restart count and, while
  // it runs, the assignment; nullopt once the job is forgotten.
  std::optional<v1::JobSnapshot> SnapshotJob(const std::string& job_id) const;
  // Every job's snapshot followed by its keys: a compact journal.
  std::vector<v1::JournalRecord> Checkpoint() const;
  // Brings back a journaled job at `now`. Its members are detached until
  // their agents resume; those that do not within `grace` are lost. A job
  // that was collecting comes back empty, keeping its round and restart
  // count, and is forgotten if no node joins within `grace`.
  // INVALID_ARGUMENT for a snapshot that does not make sense (the journal
  // is not ours, or damaged); ALREADY_EXISTS for a job held already.
  absl::Status Restore(
      const v1::JobSnapshot& snapshot,
      const std::vector<std::pair<std::string, std::string>>& keys,
      absl::Duration grace, absl::Time now);

  std::vector<v1::JobStatus> ListJobs(absl::Time now) const;
  // Hosts quarantined after a failed health check, by hostname.
  std::vector<v1::QuarantinedNode> ListQuarantined(absl::Time now) const;
  absl::StatusOr<v1::JobStatus> DescribeJob(const std::string& job_id,
                                            absl::Time now) const;

  size_t num_jobs() const { return jobs_.size(); }
  // Keys plus values held in the stores of all jobs.
  size_t store_bytes() const { return store_budget_.used; }

 private:
  struct Node;
  struct Job;

  void OnJoin(SessionId session, const v1::Join& join, absl::Time now,
              Effects* effects);
  // OnJoin's parts. JobForJoin: the job `join` names, created if new, or
  // why the join is refused (bad settings or fields, other settings, an
  // ended job, too many jobs). CheckRoomFor: whether the job can take the
  // node (limits, a duplicate incarnation or rank hint, a full fixed-size
  // job). AdmitNode: the node joins the collecting round, or waits.
  absl::StatusOr<Job*> JobForJoin(const v1::Join& join, absl::Time now,
                                  Effects* effects);
  absl::Status CheckRoomFor(const Job& job, const v1::Join& join) const;
  void AdmitNode(Job& job, SessionId session, const v1::Join& join,
                 absl::Time now, Effects* effects);
  void OnResume(SessionId session, const v1::Join& join, absl::Time now,
                Effects* effects);
  // The health gate for a join: OK, or why it is refused (quarantining
  // a node that failed its check).
  absl::Status CheckHealthGate(SessionId session, const v1::Join& join,
                               absl::Time now, Effects* effects);
  // Quarantines `host` for `hold` after its failed check `reason`, for
  // every job or, when `session` speaks for one job, for `job` only.
  void Quarantine(SessionId session, const std::string& host,
                  const std::string& job, const std::string& reason,
                  absl::Duration hold, absl::Time now, Effects* effects);
  void OnRejoin(Job& job, Node& node, const v1::Rejoin& rejoin, absl::Time now,
                Effects* effects);
  void OnWorkerReport(Job& job, Node& node, const v1::WorkerReport& report,
                      absl::Time now, Effects* effects);
  // A node asks for a coordinated stop, or says its workers hold.
  void OnStopVote(Job& job, Node& node, const v1::StopVote& vote,
                  absl::Time now, Effects* effects);
  // `stop` to every member of the running round.
  void BroadcastStop(Job& job, v1::StopAt stop, Effects* effects);
  // Learned silences (kept by the job, told to its nodes when they grow)
  // and paces (stragglers, named to group rank 0's node).
  void OnProgressReport(Job& job, Node& node, const v1::ProgressReport& report,
                        absl::Time now, Effects* effects);

  // Removes the node of `session` from its job, with the consequences of its
  // state: a lost member opens the next round. `why` is for operators.
  // Forgets the job when it was the last node.
  void RemoveNode(Job& job, SessionId session, const std::string& why,
                  absl::Time now, Effects* effects);
  // A spare takes `lost`'s group rank `slot` (and rank hint) in the round
  // being collected, preferring one of its segment; nothing when the job
  // keeps no spares or none waits.
  void GiveSlotToSpare(Job& job, const Node& lost, int32_t slot,
                       Effects* effects);
  // Ends `session` with `status` and removes its node.
  void Evict(Job& job, SessionId session, const absl::Status& status,
             absl::Time now, Effects* effects);

  void AdmitToCollectingRound(Job& job, Node& node, absl::Time now,
                              Effects* effects);
  void OpenNextRound(Job& job, v1::RestartRequired::Reason reason,
                     const std::string& detail, absl::Time now,
                     Effects* effects);
  void MaybeCloseRound(Job& job, absl::Time now, Effects* effects);
  void CloseRound(Job& job, absl::Time now, Effects* effects);
  void FailJob(Job& job, const std::string& reason, absl::Time now,
               Effects* effects);
  void FinishJob(Job& job, absl::Time now, Effects* effects);
  void ForgetJob(const std::string& job_id, Effects* effects);
  void TickJob(Job& job, absl::Time now, Effects* effects);
  // Finishes the running job when every member has succeeded.
  void MaybeFinishJob(Job& job, absl::Time now, Effects* effects);

  // Whether `job` is in its first round, still below min_nodes.
  static bool WaitsInFirstRound(const Job& job);
  // What `job` is about to change (its joins, its round closing, the job
  // ending) is shown to the other jobs that wait (Progress's
  // other_waiting_jobs): their progress is due again.
  void RefreshOthersWaiting(const Job& job);
  v1::Progress MakeProgress(const Job& job, const Node* node,
                            absl::Time now) const;
  void BroadcastProgress(Job& job, absl::Time now, Effects* effects);
  v1::JobStatus MakeStatus(const Job& job, absl::Time now) const;
  std::string JoinTimeoutReason(const Job& job) const;

  const RendezvousLimits limits_;
  // Shared by the jobs' stores; declared first so that it outlives them.
  StoreBudget store_budget_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  absl::flat_hash_map<SessionId, std::string> session_jobs_;
  SessionId next_detached_ = kDetachedSessions;
  // Opened sessions that have not spoken yet, by deadline.
  std::set<std::pair<absl::Time, SessionId>> silent_;
  absl::flat_hash_map<SessionId, absl::Time> silent_deadline_;
  absl::Time last_tick_ = absl::InfinitePast();
  // Sessions opened with Reach::kOneJob, until they close.
  absl::flat_hash_set<SessionId> one_job_sessions_;
  // Hosts that failed their health check, by hostname and the job they are
  // refused by ("" for every job); an ended quarantine is dropped when next
  // looked at. At most kMaxQuarantined: one-job entries make room first, so
  // a job token can never push out a quarantine of the whole service.
  struct Quarantined {
    absl::Time until;
    std::string reason;
    std::string job;
  };
  std::map<std::pair<std::string, std::string>, Quarantined> quarantined_;
  static constexpr size_t kMaxQuarantined = 4096;
  static constexpr absl::Duration kMaxQuarantine = absl::Hours(24);
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_H_
