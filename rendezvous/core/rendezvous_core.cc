#include "rendezvous/core/rendezvous_core.h"

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/core/straggler_watch.h"

namespace ctrun {

using NodeState = v1::NodeStatus::State;

struct RendezvousCore::Node {
  SessionId session = 0;
  // Identity, address, sizes and the latest master port candidate.
  v1::Join join;
  // Changed only through Job::SetState, which keeps the counts.
  NodeState state = v1::NodeStatus::STATE_UNSPECIFIED;
  absl::Time last_seen;
  // In the running round; -1 otherwise.
  int32_t group_rank = -1;
  int32_t first_global_rank = -1;
  // The node's group rank in the round before, to keep survivors in order.
  int32_t previous_group_rank = -1;
  // The round a PENDING_REJOIN node was told to rejoin.
  int64_t rejoin_round = -1;
  bool workers_running = false;

  std::string Name() const {
    return absl::StrCat(join.node().hostname(), ":", join.node().pid());
  }
};

struct RendezvousCore::Job {
  Job(const KvStoreLimits& store_limits, StoreBudget* budget)
      : store(store_limits, budget) {}

  std::string id;
  v1::JobSettings settings;
  v1::JobStatus::Phase phase = v1::JobStatus::COLLECTING;
  int64_t round = 0;
  int32_t restart_count = 0;
  absl::Time round_opened;
  // When this service first held the job (its creation, or its restore).
  absl::Time created;
  absl::Time last_call_deadline = absl::InfiniteFuture();

  std::map<SessionId, Node> nodes;
  // Indexes of `nodes`, so that a join costs O(log n), not O(n).
  std::array<int, v1::NodeStatus::State_ARRAYSIZE> count{};
  absl::flat_hash_map<uint64_t, SessionId> by_incarnation;
  absl::flat_hash_map<int32_t, SessionId> by_hint;
  // The running round's members in group rank order.
  std::vector<SessionId> ranked;
  // Members of the running round that left after their workers succeeded:
  // their success stands (the job finishes when the rest succeed).
  std::set<SessionId> succeeded_and_left;
  int32_t world_size = 0;
  std::string master_addr;
  int32_t master_port = 0;

  KvStore store;
  std::string failure;
  std::deque<std::string> lost;

  // A worker failure with no restart left waits this long for a node loss
  // that would explain it (its peers die when a node does, often before the
  // loss reaches us); the job fails when none comes.
  struct PendingFailure {
    std::string reason;
    absl::Time deadline;
  };
  std::optional<PendingFailure> pending_failure;
  // The last restart spent on a worker failure: refunded when, within the
  // settle time, a node of that round turns out to have been lost.
  int64_t failure_restart_round = -1;
  // Why a restart was given back, for the next round's assignments.
  std::string refund_reason;
  // What opened the latest round after the first (JobStatus.last_restart).
  std::optional<v1::RestartRequired> last_restart;
  absl::Time failure_restart_at = absl::InfinitePast();

  // Restored from a journal: the survivors of its collecting round are not
  // known, so the round waits for its last call like a first one.
  bool survivors_unknown = false;
  // Restored without nodes: forgotten unless one joins by then.
  absl::Time forget_at = absl::InfiniteFuture();

  // The longest silences its agents reported, by section (--hang_timeout
  // =auto): kept across rounds, so that a restarted job does not relearn.
  std::map<std::string, int64_t> longest_ms;
  StragglerWatch stragglers;
  // A hung worker's failure (with pending_failure): the job fails as hung.
  bool failure_hung = false;

  void FillLongest(
      google::protobuf::RepeatedPtrField<v1::LearnedInterval>* out) const {
    for (const auto& [section, ms] : longest_ms) {
      auto* l = out->Add();
      l->set_section(section);
      l->set_longest_ms(ms);
    }
  }

  bool progress_due = false;
  absl::Time next_progress = absl::InfinitePast();
  // A lower bound on the earliest lease expiry among the nodes.
  absl::Time lease_check = absl::InfiniteFuture();

  absl::Duration heartbeat_timeout() const {
    return absl::Milliseconds(settings.heartbeat_timeout_ms());
  }
  absl::Time join_deadline() const {
    return round_opened + absl::Milliseconds(settings.join_timeout_ms());
  }
  int CountIn(NodeState state) const { return count[state]; }

  Node& AddNode(SessionId session, const v1::Join& join) {
    Node& node = nodes[session];
    node.session = session;
    node.join = join;
    ++count[node.state];
    by_incarnation[join.node().incarnation()] = session;
    if (join.node_rank_hint() >= 0) by_hint[join.node_rank_hint()] = session;
    return node;
  }
  Node TakeNode(SessionId session) {
    auto it = nodes.find(session);
    Node node = std::move(it->second);
    nodes.erase(it);
    --count[node.state];
    by_incarnation.erase(node.join.node().incarnation());
    by_hint.erase(node.join.node_rank_hint());
    return node;
  }
  // Moves a node to another session id (a detached node resuming).
  void Rekey(SessionId from, SessionId to) {
    Node node = TakeNode(from);
    const NodeState state = node.state;
    node.state = v1::NodeStatus::STATE_UNSPECIFIED;
    node.session = to;
    Node& moved = AddNode(to, node.join);
    moved = std::move(node);
    SetState(moved, state);
    std::replace(ranked.begin(), ranked.end(), from, to);
  }
  void SetState(Node& node, NodeState state) {
    --count[node.state];
    ++count[state];
    node.state = state;
  }
};

namespace {

constexpr size_t kMaxLostShown = 32;
constexpr int kMaxNamesInProgress = 16;
constexpr int kMaxOtherJobsInProgress = 4;
constexpr size_t kMaxHostBytes = 255;
constexpr int32_t kMaxLocalWorldSize = 65536;
constexpr size_t kMaxFailureMessageBytes = 4096;

absl::Status ValidateJoin(const v1::Join& join, bool port_fixed) {
  if (auto s = CheckJobId(join.job_id()); !s.ok()) return s;
  const auto& node = join.node();
  if (node.hostname().empty() || node.hostname().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostname must be 1..", kMaxHostBytes, " bytes"));
  }
  if (node.incarnation() == 0) {
    return absl::InvalidArgumentError("node incarnation must not be 0");
  }
  if (join.address().empty() || join.address().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node address must be 1..", kMaxHostBytes, " bytes"));
  }
  if (join.local_world_size() < 1 ||
      join.local_world_size() > kMaxLocalWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_world_size ", join.local_world_size(),
                     " must be 1..", kMaxLocalWorldSize));
  }
  if (join.node_rank_hint() < -1 || join.node_rank_hint() >= kMaxNodesPerJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_rank_hint ", join.node_rank_hint(),
                     " must be -1 (none) or 0..", kMaxNodesPerJob - 1));
  }
  const int32_t port = join.master_port_candidate();
  if ((port != 0 || !port_fixed) && (port < 1 || port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "master_port_candidate ", port, " is not a port (1..65535)"));
  }
  return absl::OkStatus();
}

v1::ServerMessage RestartMessage(int64_t round,
                                 v1::RestartRequired::Reason reason,
                                 const std::string& detail,
                                 int32_t restart_count) {
  v1::ServerMessage m;
  auto* r = m.mutable_restart_required();
  r->set_round(round);
  r->set_reason(reason);
  r->set_detail(detail);
  r->set_restart_count(restart_count);
  r->set_collect_evidence(reason == v1::RestartRequired::WORKER_HUNG);
  return m;
}

v1::Event& AddEvent(const std::string& job, int64_t round, const char* what,
                    Effects* effects) {
  v1::Event& e = effects->events.emplace_back();
  e.set_event(what);
  e.set_job(job);
  e.set_round(static_cast<int32_t>(round));
  return e;
}

// Sections a job learns at most, and the longest name.
constexpr size_t kMaxLearnedSections = 64;
constexpr size_t kMaxSectionBytes = 63;

// At most `max` bytes of `text`, not cutting a UTF-8 character in two:
// every string field of a message must stay valid UTF-8, or its receiver
// cannot parse it.
absl::string_view Utf8Prefix(absl::string_view text, size_t max) {
  if (text.size() <= max) return text;
  size_t end = max;
  // Back off continuation bytes (10xxxxxx) to the start of a character.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  return text.substr(0, end);
}

std::string DescribeFailure(const std::string& node_name,
                            const v1::WorkerFailure& f) {
  std::string text = absl::StrCat("worker rank ", f.global_rank(), " (local ",
                                  f.local_rank(), ") on ", node_name);
  if (f.hung()) {
    absl::StrAppend(&text, " hung");
  } else if (f.signal() != 0) {
    absl::StrAppend(&text, " was killed by signal ", f.signal());
  } else {
    absl::StrAppend(&text, " exited with code ", f.exit_code());
  }
  if (!f.message().empty()) {
    absl::StrAppend(&text, ": ",
                    Utf8Prefix(f.message(), kMaxFailureMessageBytes));
  }
  return text;
}

}  // namespace

const char* RestartReasonName(v1::RestartRequired::Reason reason) {
  switch (reason) {
    case v1::RestartRequired::WORKER_FAILED:
      return "worker_failed";
    case v1::RestartRequired::NODE_LOST:
      return "node_lost";
    case v1::RestartRequired::NODE_WAITING:
      return "scale_up";
    case v1::RestartRequired::WORKER_HUNG:
      return "worker_hung";
    default:
      return "unspecified";
  }
}

RendezvousCore::RendezvousCore(RendezvousLimits limits) : limits_(limits) {
  store_budget_.limit = limits_.max_store_bytes;
}
RendezvousCore::~RendezvousCore() = default;

void RendezvousCore::OnSessionOpened(SessionId session, absl::Time now) {
  const absl::Time deadline = now + limits_.first_message_timeout;
  silent_.emplace(deadline, session);
  silent_deadline_[session] = deadline;
}

void RendezvousCore::OnMessage(SessionId session,
                               const v1::AgentMessage& message, absl::Time now,
                               Effects* effects) {
  auto sit = session_jobs_.find(session);
  if (sit == session_jobs_.end()) {
    if (auto it = silent_deadline_.find(session);
        it != silent_deadline_.end()) {
      silent_.erase({it->second, session});
      silent_deadline_.erase(it);
    }
    if (message.has_join() && message.join().has_resume()) {
      OnResume(session, message.join(), now, effects);
    } else if (message.has_join()) {
      OnJoin(session, message.join(), now, effects);
    } else {
      effects->finishes.emplace_back(
          session, absl::InvalidArgumentError(
                       "the first message of a session must be a join"));
    }
    return;
  }
  Job& job = *jobs_.at(sit->second);
  Node& node = job.nodes.at(session);
  node.last_seen = now;
  switch (message.kind_case()) {
    case v1::AgentMessage::kJoin:
      Evict(job, session,
            absl::InvalidArgumentError(
                "a session joins once; rejoin a new round with rejoin"),
            now, effects);
      return;
    case v1::AgentMessage::kRejoin:
      OnRejoin(job, node, message.rejoin(), now, effects);
      return;
    case v1::AgentMessage::kWorkerReport:
      OnWorkerReport(job, node, message.worker_report(), now, effects);
      return;
    case v1::AgentMessage::kProgressReport:
      OnProgressReport(job, node, message.progress_report(), now, effects);
      return;
    case v1::AgentMessage::kHeartbeat:
    case v1::AgentMessage::KIND_NOT_SET:
      return;
  }
}

void RendezvousCore::OnJoin(SessionId session, const v1::Join& join,
                            absl::Time now, Effects* effects) {
  auto refuse = [&](absl::Status status) {
    effects->finishes.emplace_back(session, std::move(status));
  };
  auto settings = ResolveJobSettings(join.settings());
  if (!settings.ok()) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("job settings refused: ", settings.status().message())));
  }
  if (auto s = ValidateJoin(join, settings->master_port() > 0); !s.ok()) {
    return refuse(s);
  }

  auto it = jobs_.find(join.job_id());
  if (it == jobs_.end()) {
    if (jobs_.size() >= limits_.max_jobs) {
      return refuse(absl::ResourceExhaustedError(
          absl::StrCat("the service holds ", jobs_.size(),
                       " jobs; the limit is ", limits_.max_jobs)));
    }
    auto job = std::make_unique<Job>(limits_.store, &store_budget_);
    job->id = join.job_id();
    job->settings = *settings;
    job->round_opened = now;
    job->created = now;
    it = jobs_.emplace(job->id, std::move(job)).first;
    effects->changed_jobs.push_back(join.job_id());
    AddEvent(it->second->id, 0, "round_opened", effects).set_reason("first");
  }
  Job& job = *it->second;
  if (std::string diff = DescribeSettingsDifference(job.settings, *settings);
      !diff.empty()) {
    return refuse(
        absl::InvalidArgumentError(absl::StrCat("join refused: job '", job.id,
                                                "' exists with other "
                                                "settings: ",
                                                diff)));
  }
  if (job.phase == v1::JobStatus::FINISHED ||
      job.phase == v1::JobStatus::FAILED) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "job '", job.id, "' has already ",
        job.phase == v1::JobStatus::FINISHED ? "finished" : "failed",
        "; use a new rendezvous id for a new run")));
  }
  if (job.nodes.size() >= static_cast<size_t>(kMaxNodesPerJob)) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat("job '", job.id, "' has ", job.nodes.size(),
                     " nodes; the limit is ", kMaxNodesPerJob)));
  }
  if (auto it = job.by_incarnation.find(join.node().incarnation());
      it != job.by_incarnation.end()) {
    return refuse(absl::AlreadyExistsError(absl::StrCat(
        "node incarnation ", join.node().incarnation(), " is already in job '",
        job.id, "' as ", job.nodes.at(it->second).Name())));
  }
  if (auto it = job.by_hint.find(join.node_rank_hint());
      join.node_rank_hint() >= 0 && it != job.by_hint.end()) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("node rank ", join.node_rank_hint(), " of job '", job.id,
                     "' is held by ", job.nodes.at(it->second).Name(),
                     "; each node needs its own")));
  }

  const int32_t max_nodes = job.settings.max_nodes();
  if (job.phase == v1::JobStatus::RUNNING &&
      static_cast<int32_t>(job.ranked.size()) >= max_nodes &&
      job.settings.min_nodes() == max_nodes) {
    // Nothing can admit it but the loss of a member, and a fixed-size job
    // keeps no spares: most likely a second run under the same id.
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        "job '", job.id, "' is full: its ", max_nodes,
        max_nodes == 1 ? " node runs" : " nodes run", " (--nnodes=", max_nodes,
        ") and a job of fixed size keeps no spare nodes; give this run its "
        "own --rdzv_id, or the job --nnodes=MIN:MAX")));
  }

  Node& node = job.AddNode(session, join);
  node.last_seen = now;
  AddEvent(job.id, job.round, "node_joined", effects).set_node(node.Name());
  session_jobs_[session] = job.id;
  job.forget_at = absl::InfiniteFuture();
  job.lease_check = std::min(job.lease_check, now + job.heartbeat_timeout());

  if (job.phase == v1::JobStatus::COLLECTING) {
    AdmitToCollectingRound(job, node, now, effects);
    MaybeCloseRound(job, now, effects);
    return;
  }
  // The job runs: the node waits for the next round, which a free slot opens
  // at once (scale-up); an elastic job at its maximum keeps it as a spare.
  job.SetState(node, v1::NodeStatus::WAITING);
  if (static_cast<int>(job.ranked.size()) < max_nodes) {
    OpenNextRound(job, v1::RestartRequired::NODE_WAITING,
                  absl::StrCat(node.Name(), " joined; admitting it"), now,
                  effects);
    return;
  }
  v1::ServerMessage m;
  *m.mutable_progress() = MakeProgress(job, &node, now);
  effects->messages.emplace_back(session, std::move(m));
}

void RendezvousCore::OnResume(SessionId session, const v1::Join& join,
                              absl::Time now, Effects* effects) {
  const int64_t round = join.resume().round();
  auto refuse = [&](absl::string_view why) {
    effects->finishes.emplace_back(
        session, absl::NotFoundError(absl::StrCat(
                     "cannot resume node incarnation ",
                     join.node().incarnation(), " in round ", round,
                     " of job '", join.job_id(), "': ", why, "; join afresh")));
  };
  auto it = jobs_.find(join.job_id());
  if (it == jobs_.end()) {
    return refuse(
        "the service does not hold the job (it restarted without "
        "--state-dir, or the job ended)");
  }
  Job& job = *it->second;
  auto inc = job.by_incarnation.find(join.node().incarnation());
  if (inc == job.by_incarnation.end() || inc->second < kDetachedSessions) {
    return refuse("the job has no such node waiting to resume");
  }
  if (round != job.round) {
    return refuse(absl::StrCat("the job is at round ", job.round));
  }
  const SessionId detached = inc->second;
  job.Rekey(detached, session);
  session_jobs_.erase(detached);
  session_jobs_[session] = job.id;
  Node& node = job.nodes.at(session);
  node.last_seen = now;

  v1::ServerMessage m;
  m.mutable_resumed()->set_round(job.round);
  effects->messages.emplace_back(session, std::move(m));
  // What the node missed while it was away.
  v1::ServerMessage end;
  if (job.phase == v1::JobStatus::FINISHED) {
    end.mutable_job_finished()->set_round(job.round);
  } else if (job.phase == v1::JobStatus::FAILED) {
    auto* f = end.mutable_job_failed();
    f->set_round(job.round);
    f->set_reason(job.failure);
    f->set_job_id(job.id);
  }
  if (end.kind_case() != v1::ServerMessage::KIND_NOT_SET) {
    effects->messages.emplace_back(session, std::move(end));
  }
}

void RendezvousCore::AdmitToCollectingRound(Job& job, Node& node,
                                            absl::Time now, Effects* effects) {
  job.SetState(node, v1::NodeStatus::JOINED);
  node.group_rank = -1;
  node.first_global_rank = -1;
  if (job.CountIn(v1::NodeStatus::JOINED) >= job.settings.min_nodes()) {
    job.last_call_deadline =
        now + absl::Milliseconds(job.settings.last_call_timeout_ms());
  }
  job.progress_due = true;
  if (job.round == 0) RefreshOthersWaiting(job);
  v1::ServerMessage m;
  *m.mutable_progress() = MakeProgress(job, &node, now);
  effects->messages.emplace_back(node.session, std::move(m));
}

void RendezvousCore::OnRejoin(Job& job, Node& node, const v1::Rejoin& rejoin,
                              absl::Time now, Effects* effects) {
  if (node.state != v1::NodeStatus::PENDING_REJOIN ||
      rejoin.round() != node.rejoin_round) {
    Evict(job, node.session,
          absl::AbortedError(absl::StrCat(
              "rejoin for round ", rejoin.round(), " refused: job '", job.id,
              "' is at round ", job.round, " and did not ask ", node.Name(),
              " to rejoin that round")),
          now, effects);
    return;
  }
  if (job.settings.master_port() == 0 &&
      (rejoin.master_port_candidate() < 1 ||
       rejoin.master_port_candidate() > 65535)) {
    Evict(job, node.session,
          absl::InvalidArgumentError(absl::StrCat(
              "master_port_candidate ", rejoin.master_port_candidate(),
              " is not a port (1..65535)")),
          now, effects);
    return;
  }
  node.join.set_master_port_candidate(rejoin.master_port_candidate());
  node.rejoin_round = -1;
  if (job.phase == v1::JobStatus::COLLECTING) {
    AdmitToCollectingRound(job, node, now, effects);
    MaybeCloseRound(job, now, effects);
    return;
  }
  // The round closed without this node (it was slow to stop its workers):
  // it comes in like a new node.
  job.SetState(node, v1::NodeStatus::WAITING);
  node.previous_group_rank = -1;
  if (static_cast<int>(job.ranked.size()) < job.settings.max_nodes()) {
    OpenNextRound(job, v1::RestartRequired::NODE_WAITING,
                  absl::StrCat(node.Name(), " rejoined late; admitting it"),
                  now, effects);
  }
}

void RendezvousCore::OnWorkerReport(Job& job, Node& node,
                                    const v1::WorkerReport& report,
                                    absl::Time now, Effects* effects) {
  if (report.round() > job.round) {
    Evict(job, node.session,
          absl::InvalidArgumentError(absl::StrCat(
              "worker report for round ", report.round(), " of job '", job.id,
              "', which is only at round ", job.round)),
          now, effects);
    return;
  }
  // Reports of an ended round raced with its end and change nothing.
  if (report.round() < job.round || job.phase != v1::JobStatus::RUNNING ||
      node.state != v1::NodeStatus::ACTIVE) {
    return;
  }
  switch (report.state()) {
    case v1::WorkerReport::RUNNING:
      node.workers_running = true;
      return;
    case v1::WorkerReport::SUCCEEDED:
      job.SetState(node, v1::NodeStatus::SUCCEEDED);
      node.workers_running = false;
      // Not journaled: a node restored as active says again that it
      // succeeded when it resumes, and a 1000-node job would otherwise
      // sync its journal 1000 times as it ends.
      MaybeFinishJob(job, now, effects);
      return;
    case v1::WorkerReport::FAILED: {
      node.workers_running = false;
      const v1::WorkerFailure& failure = report.failure();
      const bool hung = failure.hung();
      {
        v1::Event& e = AddEvent(
            job.id, job.round, hung ? "worker_hung" : "worker_failed", effects);
        e.set_node(node.Name());
        e.set_rank(failure.global_rank());
        e.set_local_rank(failure.local_rank());
        if (!hung) e.set_exit_code(failure.exit_code());
        if (failure.signal() != 0) e.set_signal(failure.signal());
        if (!failure.message().empty()) e.set_detail(failure.message());
      }
      if (job.pending_failure) return;  // the first failure decides
      const std::string what = DescribeFailure(node.Name(), failure);
      if (job.restart_count >= job.settings.max_restarts()) {
        const std::string reason =
            absl::StrCat(what, "; no restarts left (max_restarts=",
                         job.settings.max_restarts(), ")");
        job.failure_hung = hung;
        // With one node there is no other node whose loss could explain it.
        if (job.settings.max_nodes() == 1) {
          FailJob(job, reason, now, effects);
          return;
        }
        job.pending_failure =
            Job::PendingFailure{reason, now + limits_.failure_settle_time};
        return;
      }
      ++job.restart_count;
      job.failure_restart_round = job.round;
      job.failure_restart_at = now;
      OpenNextRound(job,
                    hung ? v1::RestartRequired::WORKER_HUNG
                         : v1::RestartRequired::WORKER_FAILED,
                    absl::StrCat(what, "; restart ", job.restart_count, " of ",
                                 job.settings.max_restarts()),
                    now, effects);
      return;
    }
    default:
      Evict(job, node.session,
            absl::InvalidArgumentError("worker report without a state"), now,
            effects);
      return;
  }
}

void RendezvousCore::OnProgressReport(Job& job, Node& node,
                                      const v1::ProgressReport& report,
                                      absl::Time now, Effects* effects) {
  if (report.round() != job.round || job.phase != v1::JobStatus::RUNNING ||
      node.state != v1::NodeStatus::ACTIVE) {
    return;
  }
  v1::ServerMessage grown;
  for (const v1::LearnedInterval& l : report.longest()) {
    if (l.longest_ms() <= 0 || l.section().size() > kMaxSectionBytes) continue;
    auto it = job.longest_ms.find(l.section());
    if (it == job.longest_ms.end()) {
      if (job.longest_ms.size() >= kMaxLearnedSections) continue;
      it = job.longest_ms.emplace(l.section(), 0).first;
    }
    if (l.longest_ms() <= it->second) continue;
    it->second = l.longest_ms();
    *grown.mutable_learned()->add_longest() = l;
  }
  if (grown.has_learned()) {
    effects->changed_jobs.push_back(job.id);
    for (SessionId member : job.ranked) {
      effects->messages.emplace_back(member, grown);
    }
  }
  // A node reports its own ranks only.
  const int32_t first = node.first_global_rank;
  const int32_t end = first + node.join.local_world_size();
  for (const v1::RankPace& pace : report.paces()) {
    if (pace.rank() < first || pace.rank() >= end) continue;
    auto straggler = job.stragglers.Observe(pace, node.Name(), now);
    if (!straggler || job.ranked.empty()) continue;
    v1::ServerMessage m;
    *m.mutable_straggler() = *std::move(straggler);
    effects->messages.emplace_back(job.ranked.front(), std::move(m));
  }
}

void RendezvousCore::OnSessionClosed(SessionId session, absl::Time now,
                                     Effects* effects) {
  if (auto it = silent_deadline_.find(session); it != silent_deadline_.end()) {
    silent_.erase({it->second, session});
    silent_deadline_.erase(it);
  }
  auto sit = session_jobs_.find(session);
  if (sit == session_jobs_.end()) return;
  RemoveNode(*jobs_.at(sit->second), session, "its session closed", now,
             effects);
}

void RendezvousCore::Evict(Job& job, SessionId session,
                           const absl::Status& status, absl::Time now,
                           Effects* effects) {
  effects->finishes.emplace_back(session, status);
  RemoveNode(job, session, std::string(status.message()), now, effects);
}

void RendezvousCore::RemoveNode(Job& job, SessionId session,
                                const std::string& why, absl::Time now,
                                Effects* effects) {
  session_jobs_.erase(session);
  const Node node = job.TakeNode(session);
  const bool running = job.phase == v1::JobStatus::RUNNING;
  const bool collecting = job.phase == v1::JobStatus::COLLECTING;
  const bool member = node.state == v1::NodeStatus::ACTIVE ||
                      node.state == v1::NodeStatus::PENDING_REJOIN ||
                      (node.state == v1::NodeStatus::JOINED && job.round > 0 &&
                       node.previous_group_rank >= 0);
  const bool succeeded = running && node.state == v1::NodeStatus::SUCCEEDED;
  if ((running || collecting) && (member || succeeded)) {
    job.lost.push_back(
        absl::StrCat(node.Name(), " (", why,
                     succeeded ? ", after its workers succeeded)" : ")"));
    if (job.lost.size() > kMaxLostShown) job.lost.pop_front();
  }
  if (succeeded) job.succeeded_and_left.insert(session);
  {
    const bool lost = (running || collecting) && member;
    v1::Event& e =
        AddEvent(job.id, job.round, lost ? "node_lost" : "node_left", effects);
    e.set_node(node.Name());
    e.set_reason(why);
  }

  if (job.nodes.empty()) {
    ForgetJob(job.id, effects);
    return;
  }
  if (running && node.state == v1::NodeStatus::ACTIVE) {
    // A worker failure just before was this loss's consequence.
    job.pending_failure.reset();
    OpenNextRound(job, v1::RestartRequired::NODE_LOST,
                  absl::StrCat("node ", node.Name(), " was lost: ", why), now,
                  effects);
    return;
  }
  if (collecting && node.state == v1::NodeStatus::PENDING_REJOIN &&
      job.failure_restart_round == job.round - 1 &&
      now - job.failure_restart_at <= limits_.failure_settle_time) {
    // The round was opened for a worker failure, but a node of that round
    // was lost too: the failure was the loss's consequence, so its restart
    // is given back.
    --job.restart_count;
    job.failure_restart_round = -1;
    job.refund_reason = absl::StrCat(
        "the restart spent on a worker failure in round ", job.round - 1,
        " was given back: node ", node.Name(), " of that round was lost (", why,
        "), and the failure was its consequence");
    effects->changed_jobs.push_back(job.id);
    v1::Event& e = AddEvent(job.id, job.round, "restart_refunded", effects);
    e.set_detail(job.refund_reason);
    e.set_restart_count(job.restart_count);
  }
  if (collecting) {
    if (job.CountIn(v1::NodeStatus::JOINED) < job.settings.min_nodes()) {
      job.last_call_deadline = absl::InfiniteFuture();
    }
    job.progress_due = true;
    if (job.round == 0) RefreshOthersWaiting(job);
    MaybeCloseRound(job, now, effects);
  }
}

void RendezvousCore::OpenNextRound(Job& job, v1::RestartRequired::Reason reason,
                                   const std::string& detail, absl::Time now,
                                   Effects* effects) {
  ++job.round;
  job.phase = v1::JobStatus::COLLECTING;
  job.round_opened = now;
  job.survivors_unknown = false;
  effects->changed_jobs.push_back(job.id);
  job.pending_failure.reset();
  job.failure_hung = false;
  job.stragglers.NewRound();
  job.last_call_deadline = absl::InfiniteFuture();
  {
    v1::Event& e = AddEvent(job.id, job.round, "round_opened", effects);
    e.set_reason(RestartReasonName(reason));
    e.set_detail(detail);
    e.set_restart_count(job.restart_count);
    e.set_max_restarts(job.settings.max_restarts());
  }
  const v1::ServerMessage restart =
      RestartMessage(job.round, reason, detail, job.restart_count);
  job.last_restart = restart.restart_required();
  job.store.Reset(
      absl::AbortedError(absl::StrCat("round ", job.round - 1, " of job '",
                                      job.id, "' ended: ", detail)),
      &effects->fired);
  for (size_t i = 0; i < job.ranked.size(); ++i) {
    if (auto it = job.nodes.find(job.ranked[i]); it != job.nodes.end()) {
      it->second.previous_group_rank = static_cast<int32_t>(i);
    }
  }
  job.ranked.clear();
  job.succeeded_and_left.clear();
  job.world_size = 0;
  job.master_addr.clear();
  job.master_port = 0;

  std::vector<Node*> waiting;
  for (auto& [session, node] : job.nodes) {
    node.group_rank = -1;
    node.first_global_rank = -1;
    node.workers_running = false;
    switch (node.state) {
      case v1::NodeStatus::ACTIVE:
      case v1::NodeStatus::SUCCEEDED:
        job.SetState(node, v1::NodeStatus::PENDING_REJOIN);
        node.rejoin_round = job.round;
        effects->messages.emplace_back(session, restart);
        break;
      case v1::NodeStatus::WAITING:
        node.previous_group_rank = -1;
        waiting.push_back(&node);
        break;
      default:
        // PENDING_REJOIN from an earlier round: still stopping its workers;
        // its rejoin for that round is accepted into this one.
        break;
    }
  }
  for (Node* node : waiting) AdmitToCollectingRound(job, *node, now, effects);
  job.progress_due = true;
  MaybeCloseRound(job, now, effects);
}

void RendezvousCore::MaybeCloseRound(Job& job, absl::Time now,
                                     Effects* effects) {
  if (job.phase != v1::JobStatus::COLLECTING) return;
  const int joined = job.CountIn(v1::NodeStatus::JOINED);
  const int pending = job.CountIn(v1::NodeStatus::PENDING_REJOIN);
  if (joined == 0 || joined < job.settings.min_nodes()) return;
  const bool last_call_over = now >= job.last_call_deadline;
  // A full round still waits for the last call when nodes of the previous
  // round are on their way back: they rank before newcomers.
  if (joined >= job.settings.max_nodes() && (pending == 0 || last_call_over)) {
    return CloseRound(job, now, effects);
  }
  const bool everyone_back =
      job.round > 0 && pending == 0 && !job.survivors_unknown;
  if (everyone_back || last_call_over) CloseRound(job, now, effects);
}

void RendezvousCore::CloseRound(Job& job, absl::Time now, Effects* effects) {
  std::vector<Node*> members;
  for (auto& [session, node] : job.nodes) {
    if (node.state == v1::NodeStatus::JOINED) members.push_back(&node);
  }
  // Hints first; then survivors in their old order; then newcomers by name.
  auto key = [](const Node* n) {
    const int32_t hint = n->join.node_rank_hint();
    const int32_t prev = n->previous_group_rank;
    return std::make_tuple(hint < 0, hint, prev < 0, prev,
                           std::cref(n->join.node().hostname()),
                           n->join.node().pid(), n->join.node().incarnation());
  };
  std::sort(members.begin(), members.end(),
            [&key](const Node* a, const Node* b) { return key(a) < key(b); });
  // Hosts beyond max_nodes wait for the next round.
  if (members.size() > static_cast<size_t>(job.settings.max_nodes())) {
    for (size_t i = job.settings.max_nodes(); i < members.size(); ++i) {
      job.SetState(*members[i], v1::NodeStatus::WAITING);
    }
    members.resize(job.settings.max_nodes());
  }

  int32_t next_rank = 0;
  for (Node* node : members) {
    node->first_global_rank = next_rank;
    next_rank += node->join.local_world_size();
  }
  const Node& master = *members.front();
  if (job.round == 0) RefreshOthersWaiting(job);
  job.phase = v1::JobStatus::RUNNING;
  job.world_size = next_rank;
  job.master_addr = master.join.address();
  job.master_port = job.settings.master_port() > 0
                        ? job.settings.master_port()
                        : master.join.master_port_candidate();
  job.last_call_deadline = absl::InfiniteFuture();
  job.progress_due = false;
  job.survivors_unknown = false;
  job.ranked.clear();
  job.succeeded_and_left.clear();
  effects->changed_jobs.push_back(job.id);
  for (size_t i = 0; i < members.size(); ++i) {
    Node& node = *members[i];
    job.SetState(node, v1::NodeStatus::ACTIVE);
    node.group_rank = static_cast<int32_t>(i);
    job.ranked.push_back(node.session);

    v1::ServerMessage m;
    auto* a = m.mutable_assignment();
    a->set_round(job.round);
    a->set_group_rank(node.group_rank);
    a->set_group_world_size(static_cast<int32_t>(members.size()));
    a->set_first_global_rank(node.first_global_rank);
    a->set_world_size(job.world_size);
    a->set_master_addr(job.master_addr);
    a->set_master_port(job.master_port);
    a->set_restart_count(job.restart_count);
    a->set_max_restarts(job.settings.max_restarts());
    a->set_job_id(job.id);
    a->set_restart_refunded(job.refund_reason);
    job.FillLongest(a->mutable_longest());
    effects->messages.emplace_back(node.session, std::move(m));
  }
  job.refund_reason.clear();
  v1::Event& e = AddEvent(job.id, job.round, "round_closed", effects);
  e.set_nodes(static_cast<int32_t>(members.size()));
  e.set_world_size(job.world_size);
  e.set_master(absl::StrCat(job.master_addr, ":", job.master_port));
  e.set_restart_count(job.restart_count);
  e.set_max_restarts(job.settings.max_restarts());
  e.set_duration_s(absl::ToDoubleSeconds(now - job.round_opened));
}

void RendezvousCore::FailJob(Job& job, const std::string& reason,
                             absl::Time now, Effects* effects) {
  job.phase = v1::JobStatus::FAILED;
  job.failure = reason;
  job.progress_due = false;
  effects->changed_jobs.push_back(job.id);
  {
    v1::Event& e = AddEvent(job.id, job.round, "job_failed", effects);
    e.set_reason(reason);
    e.set_restart_count(job.restart_count);
    e.set_duration_s(absl::ToDoubleSeconds(now - job.created));
  }
  job.store.Reset(
      absl::AbortedError(absl::StrCat("job '", job.id, "' failed: ", reason)),
      &effects->fired);
  for (const auto& [session, node] : job.nodes) {
    v1::ServerMessage m;
    m.mutable_job_failed()->set_round(job.round);
    m.mutable_job_failed()->set_reason(reason);
    m.mutable_job_failed()->set_job_id(job.id);
    m.mutable_job_failed()->set_hung(job.failure_hung);
    effects->messages.emplace_back(session, std::move(m));
  }
}

void RendezvousCore::FinishJob(Job& job, absl::Time now, Effects* effects) {
  job.phase = v1::JobStatus::FINISHED;
  effects->changed_jobs.push_back(job.id);
  {
    v1::Event& e = AddEvent(job.id, job.round, "job_finished", effects);
    e.set_restart_count(job.restart_count);
    e.set_duration_s(absl::ToDoubleSeconds(now - job.created));
  }
  for (const auto& [session, node] : job.nodes) {
    v1::ServerMessage m;
    m.mutable_job_finished()->set_round(job.round);
    effects->messages.emplace_back(session, std::move(m));
  }
}

void RendezvousCore::ForgetJob(const std::string& job_id, Effects* effects) {
  auto it = jobs_.find(job_id);
  RefreshOthersWaiting(*it->second);
  it->second->store.Reset(
      absl::AbortedError(absl::StrCat("job '", job_id, "' has no nodes left")),
      &effects->fired);
  for (const auto& [session, node] : it->second->nodes) {
    session_jobs_.erase(session);
  }
  // `job_id` may be the job's own id, gone with it.
  effects->changed_jobs.push_back(job_id);
  jobs_.erase(it);
}

void RendezvousCore::MaybeFinishJob(Job& job, absl::Time now,
                                    Effects* effects) {
  if (job.phase != v1::JobStatus::RUNNING || job.pending_failure) return;
  const bool all =
      std::all_of(job.ranked.begin(), job.ranked.end(), [&job](SessionId s) {
        auto it = job.nodes.find(s);
        return it != job.nodes.end()
                   ? it->second.state == v1::NodeStatus::SUCCEEDED
                   : job.succeeded_and_left.contains(s);
      });
  if (all) FinishJob(job, now, effects);
}

std::string RendezvousCore::JoinTimeoutReason(const Job& job) const {
  std::vector<std::string> joined, pending;
  for (const auto& [session, node] : job.nodes) {
    if (node.state == v1::NodeStatus::JOINED) joined.push_back(node.Name());
    if (node.state == v1::NodeStatus::PENDING_REJOIN) {
      pending.push_back(node.Name());
    }
  }
  std::string reason = absl::StrCat(
      "round ", job.round, " of job '", job.id, "' has ", joined.size(),
      " of at least ", job.settings.min_nodes(),
      " nodes after the join "
      "timeout of ",
      absl::FormatDuration(absl::Milliseconds(job.settings.join_timeout_ms())),
      "; joined: [", absl::StrJoin(joined, ", "), "]");
  const v1::Progress progress = MakeProgress(job, nullptr, job.round_opened);
  if (progress.missing_node_ranks_size() > 0) {
    absl::StrAppend(&reason, "; missing node ranks: [",
                    absl::StrJoin(progress.missing_node_ranks(), ", "), "]");
  }
  if (!pending.empty()) {
    absl::StrAppend(&reason, "; not rejoined: [", absl::StrJoin(pending, ", "),
                    "]");
  }
  if (!job.lost.empty()) {
    absl::StrAppend(&reason, "; lost: [", absl::StrJoin(job.lost, ", "), "]");
  }
  return reason;
}

void RendezvousCore::Tick(absl::Time now, Effects* effects) {
  if (last_tick_ != absl::InfinitePast() && now - last_tick_ > kPausedAfter) {
    // The service was stopped: what the nodes said while it was is being
    // heard only now.
    const absl::Duration paused = now - last_tick_;
    for (auto& [id, job] : jobs_) {
      for (auto& [session, node] : job->nodes) {
        node.last_seen = std::min(now, node.last_seen + paused);
      }
    }
  }
  last_tick_ = now;
  while (!silent_.empty() && silent_.begin()->first <= now) {
    const SessionId session = silent_.begin()->second;
    silent_.erase(silent_.begin());
    silent_deadline_.erase(session);
    effects->finishes.emplace_back(
        session, absl::DeadlineExceededError(absl::StrCat(
                     "no join within ",
                     absl::FormatDuration(limits_.first_message_timeout),
                     " of opening the session")));
  }
  std::vector<std::string> ids;
  ids.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  for (const auto& id : ids) {
    // A job may forget itself while it ticks; look each one up.
    auto it = jobs_.find(id);
    if (it != jobs_.end()) TickJob(*it->second, now, effects);
  }
}

void RendezvousCore::TickJob(Job& job, absl::Time now, Effects* effects) {
  const std::string id = job.id;
  auto alive = [this, &id] { return jobs_.contains(id); };

  job.store.ExpireWaiters(now, &effects->fired);

  if (now >= job.lease_check) {
    std::vector<SessionId> expired;
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [session, node] : job.nodes) {
      const absl::Time expiry = node.last_seen + job.heartbeat_timeout();
      if (expiry <= now) {
        expired.push_back(session);
      } else {
        earliest = std::min(earliest, expiry);
      }
    }
    job.lease_check = earliest;
    for (SessionId session : expired) {
      const Node& node = job.nodes.at(session);
      const std::string name = node.Name();
      Evict(
          job, session,
          absl::AbortedError(
              session >= kDetachedSessions
                  ? absl::StrCat("node ", name, " of job '", id,
                                 "' did not resume after the service "
                                 "restarted; its round has ended")
                  : absl::StrCat("node ", name, " of job '", id,
                                 "' was declared lost after ",
                                 absl::FormatDuration(job.heartbeat_timeout()),
                                 " without a heartbeat; its round has ended")),
          now, effects);
      if (!alive()) return;
    }
  }
  if (job.nodes.empty() && now >= job.forget_at) {
    ForgetJob(id, effects);
    return;
  }

  if (job.pending_failure && now >= job.pending_failure->deadline) {
    const std::string reason = job.pending_failure->reason;
    job.pending_failure.reset();
    FailJob(job, reason, now, effects);
  }
  if (job.phase == v1::JobStatus::COLLECTING) {
    MaybeCloseRound(job, now, effects);
    if (job.phase == v1::JobStatus::COLLECTING && now >= job.join_deadline() &&
        job.CountIn(v1::NodeStatus::JOINED) < job.settings.min_nodes()) {
      FailJob(job, JoinTimeoutReason(job), now, effects);
    }
  }
  if (job.phase == v1::JobStatus::COLLECTING && job.progress_due &&
      now >= job.next_progress) {
    BroadcastProgress(job, now, effects);
  }
}

absl::Time RendezvousCore::NextDeadline() const {
  absl::Time next =
      silent_.empty() ? absl::InfiniteFuture() : silent_.begin()->first;
  for (const auto& [id, job] : jobs_) {
    next = std::min(
        {next, job->lease_check, job->store.NextDeadline(), job->forget_at});
    if (job->pending_failure)
      next = std::min(next, job->pending_failure->deadline);
    if (job->phase != v1::JobStatus::COLLECTING) continue;
    next = std::min(next, job->last_call_deadline);
    if (job->CountIn(v1::NodeStatus::JOINED) < job->settings.min_nodes()) {
      next = std::min(next, job->join_deadline());
    }
    if (job->progress_due) next = std::min(next, job->next_progress);
  }
  return next;
}

void RendezvousCore::BroadcastProgress(Job& job, absl::Time now,
                                       Effects* effects) {
  job.progress_due = false;
  job.next_progress = now + limits_.progress_interval;
  const v1::Progress progress = MakeProgress(job, nullptr, now);
  for (const auto& [session, node] : job.nodes) {
    if (node.state != v1::NodeStatus::JOINED &&
        node.state != v1::NodeStatus::PENDING_REJOIN) {
      continue;
    }
    v1::ServerMessage m;
    *m.mutable_progress() = progress;
    effects->messages.emplace_back(session, std::move(m));
  }
}

void RendezvousCore::RefreshOthersWaiting(const Job& job) {
  for (auto& [id, other] : jobs_) {
    if (other.get() != &job && WaitsInFirstRound(*other)) {
      other->progress_due = true;
    }
  }
}

bool RendezvousCore::WaitsInFirstRound(const Job& job) {
  return job.phase == v1::JobStatus::COLLECTING && job.round == 0 &&
         job.CountIn(v1::NodeStatus::JOINED) < job.settings.min_nodes();
}

v1::Progress RendezvousCore::MakeProgress(const Job& job, const Node* node,
                                          absl::Time now) const {
  v1::Progress p;
  p.set_round(job.round);
  p.set_min_nodes(job.settings.min_nodes());
  p.set_max_nodes(job.settings.max_nodes());
  p.set_joined(job.CountIn(v1::NodeStatus::JOINED));
  p.set_pending_count(job.CountIn(v1::NodeStatus::PENDING_REJOIN));
  p.set_last_call_remaining_ms(
      job.last_call_deadline == absl::InfiniteFuture()
          ? -1
          : std::max<int64_t>(
                0, absl::ToInt64Milliseconds(job.last_call_deadline - now)));
  p.set_join_timeout_remaining_ms(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(job.join_deadline() - now)));
  if (node != nullptr) {
    // A node's own acknowledgement stays O(1): names come with broadcasts.
    p.set_waiting_for_slot(node->state == v1::NodeStatus::WAITING);
    return p;
  }
  for (const auto& [session, n] : job.nodes) {
    if (n.state == v1::NodeStatus::PENDING_REJOIN &&
        p.pending_size() < kMaxNamesInProgress) {
      p.add_pending(n.Name());
    }
  }
  if (WaitsInFirstRound(job)) {
    // Broadcasts come at most once per progress_interval per waiting job.
    for (const auto& [id, other] : jobs_) {
      if (p.other_waiting_jobs_size() == kMaxOtherJobsInProgress) break;
      if (other.get() == &job || !WaitsInFirstRound(*other)) continue;
      auto* o = p.add_other_waiting_jobs();
      o->set_job_id(id);
      o->set_joined(other->CountIn(v1::NodeStatus::JOINED));
      o->set_min_nodes(other->settings.min_nodes());
    }
  }
  if (!job.by_hint.empty()) {
    for (int32_t r = 0; r < job.settings.min_nodes(); ++r) {
      auto it = job.by_hint.find(r);
      if (it == job.by_hint.end() ||
          job.nodes.at(it->second).state != v1::NodeStatus::JOINED) {
        p.add_missing_node_ranks(r);
      }
    }
  }
  return p;
}

absl::StatusOr<KvStore*> RendezvousCore::Store(const v1::StoreScope& scope) {
  auto it = jobs_.find(scope.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no job '", scope.job_id(), "' on this rendezvous"));
  }
  Job& job = *it->second;
  if (scope.round() != job.round) {
    return absl::AbortedError(absl::StrCat("store request for round ",
                                           scope.round(), " of job '", job.id,
                                           "', which is at round ", job.round));
  }
  return &job.store;
}

v1::JobStatus RendezvousCore::MakeStatus(const Job& job, absl::Time now) const {
  v1::JobStatus s;
  s.set_job_id(job.id);
  s.set_phase(job.phase);
  s.set_round(job.round);
  *s.mutable_settings() = job.settings;
  s.set_restart_count(job.restart_count);
  s.set_world_size(job.world_size);
  s.set_master_addr(job.master_addr);
  s.set_master_port(job.master_port);
  s.set_failure(job.failure);
  s.set_num_keys(job.store.NumKeys());
  if (job.last_restart) *s.mutable_last_restart() = *job.last_restart;
  for (const auto& lost : job.lost) s.add_lost_nodes(lost);
  job.FillLongest(s.mutable_longest());
  for (const auto& straggler : job.stragglers.named()) {
    *s.add_stragglers() = straggler;
  }

  std::vector<const Node*> order;
  for (SessionId session : job.ranked) {
    if (auto it = job.nodes.find(session); it != job.nodes.end()) {
      order.push_back(&it->second);
    }
  }
  for (const auto& [session, node] : job.nodes) {
    if (node.group_rank < 0) order.push_back(&node);
  }
  for (const Node* node : order) {
    auto* n = s.add_nodes();
    *n->mutable_node() = node->join.node();
    n->set_address(node->join.address());
    n->set_state(node->state);
    n->set_local_world_size(node->join.local_world_size());
    n->set_node_rank_hint(node->join.node_rank_hint());
    n->set_group_rank(node->group_rank);
    n->set_first_global_rank(node->first_global_rank);
    const bool resuming = node->session >= kDetachedSessions;
    n->set_resuming(resuming);
    // A detached node's last_seen is set ahead to give it its grace.
    n->set_heartbeat_age_ms(
        resuming ? 0 : absl::ToInt64Milliseconds(now - node->last_seen));
    n->set_workers_running(node->workers_running);
  }
  return s;
}

std::optional<v1::JobSnapshot> RendezvousCore::SnapshotJob(
    const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  const Job& job = *it->second;
  v1::JobSnapshot s;
  s.set_job_id(job.id);
  *s.mutable_settings() = job.settings;
  s.set_round(job.round);
  s.set_restart_count(job.restart_count);
  s.set_phase(job.phase);
  s.set_failure(job.failure);
  job.FillLongest(s.mutable_longest());
  if (job.last_restart) *s.mutable_last_restart() = *job.last_restart;
  if (job.phase == v1::JobStatus::COLLECTING) return s;
  s.set_world_size(job.world_size);
  s.set_master_addr(job.master_addr);
  s.set_master_port(job.master_port);
  for (SessionId session : job.ranked) {
    auto n = job.nodes.find(session);
    if (n == job.nodes.end()) continue;
    auto* m = s.add_members();
    *m->mutable_join() = n->second.join;
    m->mutable_join()->clear_resume();
    m->set_group_rank(n->second.group_rank);
    m->set_first_global_rank(n->second.first_global_rank);
    m->set_succeeded(n->second.state == v1::NodeStatus::SUCCEEDED);
  }
  return s;
}

std::vector<v1::JournalRecord> RendezvousCore::Checkpoint() const {
  std::vector<v1::JournalRecord> records;
  for (const auto& entry : jobs_) {
    // Named, not bound: clang 14 cannot capture structured bindings.
    const std::string& id = entry.first;
    const int64_t round = entry.second->round;
    *records.emplace_back().mutable_job() = *SnapshotJob(id);
    entry.second->store.ForEach(
        [&](const std::string& key, const std::string& value) {
          auto* put = records.emplace_back().mutable_put();
          put->set_job_id(id);
          put->set_round(round);
          put->set_key(key);
          put->set_value(value);
        });
  }
  return records;
}

absl::Status RendezvousCore::Restore(
    const v1::JobSnapshot& snapshot,
    const std::vector<std::pair<std::string, std::string>>& keys,
    absl::Duration grace, absl::Time now) {
  const std::string& id = snapshot.job_id();
  auto bad = [&id](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("journaled job '", id, "': ", why));
  };
  if (jobs_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("job '", id, "' is held"));
  }
  auto settings = ResolveJobSettings(snapshot.settings());
  if (!settings.ok()) return bad(settings.status().message());
  if (snapshot.round() < 0 || snapshot.restart_count() < 0) {
    return bad("negative round or restart count");
  }
  const v1::JobStatus::Phase phase = snapshot.phase();
  if (phase != v1::JobStatus::COLLECTING && phase != v1::JobStatus::RUNNING &&
      phase != v1::JobStatus::FINISHED && phase != v1::JobStatus::FAILED) {
    return bad("no phase");
  }
  auto job = std::make_unique<Job>(limits_.store, &store_budget_);
  job->id = id;
  job->settings = *settings;
  job->phase = phase;
  job->round = snapshot.round();
  job->restart_count = snapshot.restart_count();
  job->failure = snapshot.failure();
  if (snapshot.has_last_restart()) job->last_restart = snapshot.last_restart();
  for (const v1::LearnedInterval& l : snapshot.longest()) {
    if (job->longest_ms.size() >= kMaxLearnedSections) break;
    job->longest_ms[l.section()] = std::max<int64_t>(0, l.longest_ms());
  }
  job->round_opened = now;
  job->created = now;
  job->survivors_unknown = phase == v1::JobStatus::COLLECTING;
  if (phase != v1::JobStatus::COLLECTING) {
    job->world_size = snapshot.world_size();
    job->master_addr = snapshot.master_addr();
    job->master_port = snapshot.master_port();
  }
  // The lease of a detached node runs out `grace` from now.
  const absl::Time seen = now + grace - job->heartbeat_timeout();
  for (const auto& member : snapshot.members()) {
    const SessionId session = next_detached_++;
    if (auto s = ValidateJoin(member.join(), settings->master_port() > 0);
        !s.ok()) {
      return bad(s.message());
    }
    if (job->by_incarnation.contains(member.join().node().incarnation())) {
      return bad("a node incarnation appears twice");
    }
    Node& node = job->AddNode(session, member.join());
    node.last_seen = seen;
    node.group_rank = member.group_rank();
    node.first_global_rank = member.first_global_rank();
    job->SetState(node, member.succeeded() ? v1::NodeStatus::SUCCEEDED
                                           : v1::NodeStatus::ACTIVE);
    job->ranked.push_back(session);
  }
  if (job->nodes.empty()) {
    job->forget_at = now + grace;
  } else {
    job->lease_check = now + grace;
  }
  std::vector<KvStore::Fired> fired;  // nobody waits yet
  for (const auto& [key, value] : keys) {
    if (auto s = job->store.Set(key, value, &fired); !s.ok()) {
      return bad(absl::StrCat("key refused: ", s.message()));
    }
  }
  for (const auto& [session, node] : job->nodes) session_jobs_[session] = id;
  jobs_.emplace(id, std::move(job));
  return absl::OkStatus();
}

std::vector<v1::JobStatus> RendezvousCore::ListJobs(absl::Time now) const {
  std::vector<v1::JobStatus> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(MakeStatus(*job, now));
  return jobs;
}

absl::StatusOr<v1::JobStatus> RendezvousCore::DescribeJob(
    const std::string& job_id, absl::Time now) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return MakeStatus(*it->second, now);
}

}  // namespace ctrun
