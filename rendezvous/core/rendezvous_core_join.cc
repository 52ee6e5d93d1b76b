// Joins, resumes, rejoins, reports, and nodes leaving.
#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/core/failure_class.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/rendezvous_core_state.h"

namespace ctrun {

using core_internal::AddEvent;
using core_internal::DescribeFailure;
using core_internal::kMaxFailureMessageBytes;
using core_internal::kMaxHostBytes;
using core_internal::kMaxLearnedSections;
using core_internal::kMaxLostShown;
using core_internal::kMaxSectionBytes;
using core_internal::kNoProgressFailures;
using core_internal::Utf8Prefix;
using core_internal::ValidateJoin;

void RendezvousCore::Job::SetRootCause(const std::string& node_name,
                                       const v1::WorkerFailure& failure) {
  root_cause = failure;
  root_cause->set_message(
      std::string(Utf8Prefix(failure.message(), kMaxFailureMessageBytes)));
  root_cause->set_error_file(
      std::string(Utf8Prefix(failure.error_file(), kMaxFailureMessageBytes)));
  root_cause_node = node_name;
}

void RendezvousCore::OnJoin(SessionId session, const v1::Join& join,
                            absl::Time now, Effects* effects) {
  if (absl::Status gate = CheckHealthGate(session, join, now, effects);
      !gate.ok()) {
    effects->finishes.emplace_back(session, std::move(gate));
    return;
  }
  absl::StatusOr<Job*> job = JobForJoin(join, now, effects);
  absl::Status room = job.ok() ? CheckRoomFor(**job, join) : job.status();
  if (!room.ok()) {
    effects->finishes.emplace_back(session, std::move(room));
    return;
  }
  AdmitNode(**job, session, join, now, effects);
}

namespace {

// A host as quarantine knows it: its name and the address it joins from
// (nodes of one machine may stand for several, as on loopback).
std::string HostOf(const v1::Join& join) {
  return join.address().empty() || join.address() == join.node().hostname()
             ? join.node().hostname()
             : absl::StrCat(join.node().hostname(), " (", join.address(), ")");
}

}  // namespace

absl::Status RendezvousCore::CheckHealthGate(SessionId session,
                                             const v1::Join& join,
                                             absl::Time now, Effects* effects) {
  if (join.node().hostname().empty() ||
      join.node().hostname().size() > kMaxHostBytes ||
      join.address().size() > kMaxHostBytes) {
    return absl::OkStatus();  // refused by ValidateJoin
  }
  const std::string host = HostOf(join);
  if (!join.unhealthy().empty()) {
    const std::string reason(
        Utf8Prefix(join.unhealthy(), kMaxFailureMessageBytes));
    const absl::Duration hold =
        std::clamp(absl::Milliseconds(join.quarantine_ms()),
                   absl::ZeroDuration(), kMaxQuarantine);
    Quarantine(session, host, join.job_id(), reason, hold, now, effects);
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", host, " failed its health check: ", reason,
        hold > absl::ZeroDuration()
            ? absl::StrCat("; quarantined for ", absl::FormatDuration(hold))
            : ""));
  }
  for (const std::string& scope : {std::string(), join.job_id()}) {
    auto it = quarantined_.find({host, scope});
    if (it == quarantined_.end()) continue;
    if (it->second.until <= now) {
      quarantined_.erase(it);
      continue;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("node ", host, " is quarantined for another ",
                     absl::FormatDuration(
                         absl::Ceil(it->second.until - now, absl::Seconds(1))),
                     scope.empty() ? "" : absl::StrCat(" by job '", scope, "'"),
                     ": its health check failed (", it->second.reason, ")"));
  }
  return absl::OkStatus();
}

void RendezvousCore::Quarantine(SessionId session, const std::string& host,
                                const std::string& job,
                                const std::string& reason, absl::Duration hold,
                                absl::Time now, Effects* effects) {
  v1::Event& e = AddEvent(job, 0, "node_quarantined", effects);
  e.clear_round();
  e.set_node(host);
  e.set_reason(reason);
  e.set_duration_s(absl::ToDoubleSeconds(hold));
  if (hold <= absl::ZeroDuration()) return;
  const std::pair<std::string, std::string> key(
      host, one_job_sessions_.contains(session) ? job : std::string());
  if (!quarantined_.contains(key) && quarantined_.size() >= kMaxQuarantined) {
    // Full: the one-job quarantine that ends first makes room, else (none
    // left) the quarantine that ends first.
    auto first = std::min_element(
        quarantined_.begin(), quarantined_.end(),
        [](const auto& a, const auto& b) {
          return std::make_pair(a.first.second.empty(), a.second.until) <
                 std::make_pair(b.first.second.empty(), b.second.until);
        });
    if (!key.second.empty() && first->first.second.empty()) return;
    quarantined_.erase(first);
  }
  quarantined_[key] = Quarantined{now + hold, reason, job};
}

absl::StatusOr<RendezvousCore::Job*> RendezvousCore::JobForJoin(
    const v1::Join& join, absl::Time now, Effects* effects) {
  auto settings = ResolveJobSettings(join.settings());
  if (!settings.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job settings refused: ", settings.status().message()));
  }
  if (auto s = ValidateJoin(join, settings->master_port() > 0); !s.ok()) {
    return s;
  }
  auto it = jobs_.find(join.job_id());
  if (it == jobs_.end()) {
    if (jobs_.size() >= limits_.max_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the service holds ", jobs_.size(),
                       " jobs; the limit is ", limits_.max_jobs));
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
    return absl::InvalidArgumentError(absl::StrCat(
        "join refused: job '", job.id, "' exists with other settings: ", diff));
  }
  if (job.phase == v1::JobStatus::FINISHED ||
      job.phase == v1::JobStatus::FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.id, "' has already ",
        job.phase == v1::JobStatus::FINISHED ? "finished" : "failed",
        "; use a new rendezvous id for a new run"));
  }
  return &job;
}

absl::Status RendezvousCore::CheckRoomFor(const Job& job,
                                          const v1::Join& join) const {
  if (job.nodes.size() >= static_cast<size_t>(kMaxNodesPerJob)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job '", job.id, "' has ", job.nodes.size(),
                     " nodes; the limit is ", kMaxNodesPerJob));
  }
  if (auto it = job.by_incarnation.find(join.node().incarnation());
      it != job.by_incarnation.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "node incarnation ", join.node().incarnation(), " is already in job '",
        job.id, "' as ", job.nodes.at(it->second).Name()));
  }
  if (auto it = job.by_hint.find(join.node_rank_hint());
      join.node_rank_hint() >= 0 && it != job.by_hint.end() &&
      !job.nodes.at(it->second).inherited_hint) {
    return absl::FailedPreconditionError(
        absl::StrCat("node rank ", join.node_rank_hint(), " of job '", job.id,
                     "' is held by ", job.nodes.at(it->second).Name(),
                     "; each node needs its own"));
  }
  const int32_t max_nodes = job.settings.max_nodes();
  if (const int32_t spares = job.settings.spares();
      spares > 0 &&
      job.nodes.size() >= static_cast<size_t>(max_nodes) + spares) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", job.id, "' is full: it has its ", max_nodes,
        max_nodes == 1 ? " node" : " nodes", " (--nnodes) and ", spares,
        spares == 1 ? " spare" : " spares",
        " (--spares); give this run its own --rdzv_id, or the job more "
        "--spares"));
  }
  if (job.settings.spares() > 0 && job.phase == v1::JobStatus::RUNNING &&
      static_cast<int32_t>(job.ranked.size()) >= max_nodes) {
    // It can only be a spare, and a spare takes the slot of a lost node of
    // its own size: the world keeps its size and every other rank.
    std::set<int32_t> sizes;
    for (SessionId ranked : job.ranked) {
      sizes.insert(job.nodes.at(ranked).join.local_world_size());
    }
    if (!sizes.contains(join.local_world_size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job.id,
          "' runs nodes of --nproc_per_node=", absl::StrJoin(sizes, " or "),
          "; a spare takes a lost node's ranks, "
          "so it needs as many workers as that node: this node has ",
          join.local_world_size()));
    }
  }
  if (job.settings.spares() == 0 && job.phase == v1::JobStatus::RUNNING &&
      static_cast<int32_t>(job.ranked.size()) >= max_nodes &&
      job.settings.min_nodes() == max_nodes) {
    // Nothing can admit it but the loss of a member, and a fixed-size job
    // keeps no spares: most likely a second run under the same id.
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", job.id, "' is full: its ", max_nodes,
        max_nodes == 1 ? " node runs" : " nodes run", " (--nnodes=", max_nodes,
        ") and keeps no spare nodes; give this run its own --rdzv_id, or "
        "the job --spares=K or --nnodes=MIN:MAX"));
  }
  return absl::OkStatus();
}

void RendezvousCore::AdmitNode(Job& job, SessionId session,
                               const v1::Join& join, absl::Time now,
                               Effects* effects) {
  v1::Join admitted = join;
  if (join.node_rank_hint() >= 0 &&
      job.by_hint.contains(join.node_rank_hint())) {
    // A member lost and back (CheckRoomFor allowed it): the spare that took
    // its slot holds its rank hint now, so it comes in without one.
    admitted.set_node_rank_hint(-1);
  }
  Node& node = job.AddNode(session, admitted);
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
  if (static_cast<int>(job.ranked.size()) < job.settings.max_nodes()) {
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
  if (!rejoin.unhealthy().empty()) {
    const std::string host = HostOf(node.join);
    const std::string reason(
        Utf8Prefix(rejoin.unhealthy(), kMaxFailureMessageBytes));
    const absl::Duration hold =
        std::clamp(absl::Milliseconds(rejoin.quarantine_ms()),
                   absl::ZeroDuration(), kMaxQuarantine);
    Quarantine(node.session, host, job.id, reason, hold, now, effects);
    Evict(
        job, node.session,
        absl::FailedPreconditionError(absl::StrCat(
            "node ", host, " failed its health check: ", reason,
            hold > absl::ZeroDuration()
                ? absl::StrCat("; quarantined for ", absl::FormatDuration(hold))
                : "")),
        now, effects);
    return;
  }
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
      // An agent's figures, kept within what they can mean.
      node.kept_workers =
          std::clamp(report.kept_workers(), 0, node.join.local_world_size());
      if (report.recovery_s() > 0 && report.recovery_s() < 1e6 &&
          node.recovery_s == 0) {
        node.recovery_s = report.recovery_s();
        v1::Event& e =
            AddEvent(job.id, job.round, "workers_recovered", effects);
        e.set_node(node.Name());
        e.set_kept(node.kept_workers);
        e.set_duration_s(report.recovery_s());
      }
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
        e.set_failure_class(FailureClassName(failure.failure_class()));
      }
      const std::string what = DescribeFailure(node.Name(), failure);
      if (!job.pending_failure) {
        job.no_progress_failures =
            failure.no_progress() ? job.no_progress_failures + 1 : 0;
      }
      const bool stuck = job.no_progress_failures >= kNoProgressFailures;
      const bool restarts = !stuck && RestartsOn(job.settings.restart_on(),
                                                 failure.failure_class());
      // Why the job fails if this failure is its last.
      std::string final_reason;
      if (stuck) {
        final_reason = absl::StrCat(
            what, "; no progress in ", kNoProgressFailures,
            " attempts in a row, so not restarted (",
            std::max(0, job.settings.max_restarts() - job.restart_count),
            " of max_restarts=", job.settings.max_restarts(), " left)");
      } else if (restarts) {
        final_reason = absl::StrCat(what, "; no restarts left (max_restarts=",
                                    job.settings.max_restarts(), ")");
      } else {
        final_reason = absl::StrCat(
            what,
            "; not restarted: ", FailureClassWords(failure.failure_class()),
            " (--restart_on=", FormatRestartOn(job.settings.restart_on()), ")");
      }
      if (job.pending_failure) {
        // The first failure decides, unless its rank hung waiting in a
        // collective and this one hung outside any: the rank it waited for;
        // or it lost a peer (a communication failure) and this one is not
        // such a cascade.
        const bool explains_wait = hung && !failure.waiting() &&
                                   job.root_cause && job.root_cause->hung() &&
                                   job.root_cause->waiting();
        const bool explains_cascade =
            job.root_cause && job.root_cause->failure_class() == v1::NETWORK &&
            failure.failure_class() != v1::NETWORK;
        if (explains_wait || explains_cascade) {
          job.pending_failure->reason = final_reason;
          job.pending_failure->deadline = std::min(
              job.pending_failure->deadline, now + limits_.failure_settle_time);
          job.SetRootCause(node.Name(), failure);
        }
        return;
      }
      if (!restarts || job.restart_count >= job.settings.max_restarts()) {
        job.failure_hung = hung;
        job.failure_no_progress = stuck;
        job.SetRootCause(node.Name(), failure);
        // With one node there is no other node whose loss could explain it.
        if (job.settings.max_nodes() == 1) {
          FailJob(job, final_reason, now, effects);
          return;
        }
        job.pending_failure = Job::PendingFailure{
            final_reason,
            now + (hung && failure.waiting() ? limits_.waiting_hang_settle_time
                                             : limits_.failure_settle_time)};
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

void RendezvousCore::OnStopVote(Job& job, Node& node, const v1::StopVote& vote,
                                absl::Time now, Effects* effects) {
  if (vote.round() != job.round || job.phase != v1::JobStatus::RUNNING ||
      node.state != v1::NodeStatus::ACTIVE) {
    return;
  }
  if (!vote.asked().empty()) {
    const std::string reason(
        Utf8Prefix(vote.asked(), CoordinatedStop::kMaxReasonBytes));
    auto hold = job.stop.Ask(job.round, reason, vote.signal(),
                             absl::Milliseconds(vote.hold_ms()), now);
    if (hold) {
      v1::Event& e = AddEvent(job.id, job.round, "stop_asked", effects);
      e.set_node(node.Name());
      e.set_reason(reason);
      BroadcastStop(job, *std::move(hold), effects);
    }
  }
  if (!vote.held()) return;
  const size_t members =
      std::count_if(job.ranked.begin(), job.ranked.end(), [&job](SessionId s) {
        auto it = job.nodes.find(s);
        return it != job.nodes.end() &&
               it->second.state == v1::NodeStatus::ACTIVE;
      });
  if (auto decided = job.stop.Held(node.session, vote.step(), members)) {
    BroadcastStop(job, *std::move(decided), effects);
  }
}

void RendezvousCore::BroadcastStop(Job& job, v1::StopAt stop,
                                   Effects* effects) {
  if (stop.decided()) {
    v1::Event& e = AddEvent(job.id, job.round, "stop_decided", effects);
    e.set_reason(stop.reason());
    e.set_step(static_cast<int32_t>(
        std::min<int64_t>(stop.step(), std::numeric_limits<int32_t>::max())));
  }
  v1::ServerMessage m;
  *m.mutable_stop_at() = std::move(stop);
  for (SessionId member : job.ranked) {
    if (job.nodes.contains(member)) effects->messages.emplace_back(member, m);
  }
}

void RendezvousCore::OnSessionClosed(SessionId session, absl::Time now,
                                     Effects* effects) {
  one_job_sessions_.erase(session);
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
                       node.SlotToKeep() >= 0);
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
    GiveSlotToSpare(job, node, node.group_rank, effects);
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
  if (collecting && member) {
    GiveSlotToSpare(job, node, node.SlotToKeep(), effects);
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

void RendezvousCore::GiveSlotToSpare(Job& job, const Node& lost, int32_t slot,
                                     Effects* effects) {
  if (job.settings.spares() == 0 || slot < 0) return;
  // Waiting beside a running round, or admitted to the collecting one
  // without a slot of its own. Same segment first; then the order in
  // which CloseRound ranks newcomers, so that the choice is stable.
  const std::string& segment = lost.join.segment();
  auto key = [&segment](const Node* n) {
    return std::make_tuple(segment.empty() || n->join.segment() != segment,
                           std::cref(n->join.node().hostname()),
                           n->join.node().pid(), n->join.node().incarnation());
  };
  Node* spare = nullptr;
  for (auto& [session, node] : job.nodes) {
    // Only into a slot of its own size: the world keeps its size and every
    // other node its ranks.
    const bool free =
        (node.state == v1::NodeStatus::WAITING ||
         (node.state == v1::NodeStatus::JOINED && node.SlotToKeep() < 0)) &&
        node.join.local_world_size() == lost.join.local_world_size();
    if (free && (spare == nullptr || key(&node) < key(spare))) spare = &node;
  }
  if (spare == nullptr) return;
  spare->spare_slot = slot;
  spare->took_slot_of = lost.Name();
  spare->inherited_hint = lost.join.node_rank_hint() >= 0;
  job.SetHint(*spare, lost.join.node_rank_hint());
  ++job.spares_promoted;
  job.promotions.push_back(absl::StrCat(spare->Name(), " took group rank ",
                                        slot, " of ", lost.Name()));
  if (job.promotions.size() > kMaxLostShown) job.promotions.pop_front();
  effects->changed_jobs.push_back(job.id);
  v1::Event& e = AddEvent(job.id, job.round, "spare_promoted", effects);
  e.set_node(spare->Name());
  e.set_group_rank(slot);
  std::string detail = absl::StrCat("takes the slot of ", lost.Name());
  if (!segment.empty()) {
    absl::StrAppend(&detail,
                    spare->join.segment() == segment
                        ? " in its segment "
                        : ", no spare waits in its segment ",
                    segment);
  }
  e.set_detail(detail);
}

}  // namespace ctrun
