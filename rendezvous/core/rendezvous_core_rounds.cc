// Rounds: opening, closing, failing and finishing a job; progress.
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/rendezvous_core_state.h"
#include "rendezvous/core/restart_reason.h"

namespace ctrun {

using core_internal::AddEvent;
using core_internal::kMaxNamesInProgress;
using core_internal::kMaxOtherJobsInProgress;
using core_internal::RestartMessage;

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
  job.root_cause.reset();
  job.stragglers.NewRound();
  job.stop.NewRound();
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
    node.kept_workers = 0;
    node.recovery_s = 0;
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
  // Hints first; then survivors in their old order, spares in the slots
  // they were given; then newcomers by name.
  auto key = [](const Node* n) {
    const int32_t hint = n->join.node_rank_hint();
    const int32_t prev = n->SlotToKeep();
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
      v1::ServerMessage m;
      *m.mutable_progress() = MakeProgress(job, members[i], now);
      effects->messages.emplace_back(members[i]->session, std::move(m));
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
    a->set_took_slot_of(node.took_slot_of);
    job.FillLongest(a->mutable_longest());
    effects->messages.emplace_back(node.session, std::move(m));
  }
  for (auto& [session, node] : job.nodes) {
    node.spare_slot = -1;
    node.took_slot_of.clear();
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
    m.mutable_job_failed()->set_no_progress(job.failure_no_progress);
    if (job.root_cause) {
      *m.mutable_job_failed()->mutable_root_cause() = *job.root_cause;
      m.mutable_job_failed()->set_root_cause_node(job.root_cause_node);
    }
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

void RendezvousCore::BroadcastProgress(Job& job, absl::Time now,
                                       Effects* effects) {
  job.progress_due = false;
  const int told = job.CountIn(v1::NodeStatus::JOINED) +
                   job.CountIn(v1::NodeStatus::PENDING_REJOIN);
  job.next_progress =
      now + std::max(limits_.progress_interval,
                     absl::Seconds(1) * told /
                         std::max(1, limits_.progress_messages_per_second));
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
    p.set_spare(p.waiting_for_slot() && job.settings.spares() > 0);
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

}  // namespace ctrun
