// The core's entry points and clock: messages in, deadlines, the store.
#include "rendezvous/core/rendezvous_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/core/rendezvous_core_state.h"

namespace ctrun {

RendezvousCore::RendezvousCore(RendezvousLimits limits) : limits_(limits) {
  store_budget_.limit = limits_.max_store_bytes;
}
RendezvousCore::~RendezvousCore() = default;

void RendezvousCore::OnSessionOpened(SessionId session, absl::Time now,
                                     Reach reach) {
  if (reach == Reach::kOneJob) one_job_sessions_.insert(session);
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
    case v1::AgentMessage::kStopVote:
      OnStopVote(job, node, message.stop_vote(), now, effects);
      return;
    case v1::AgentMessage::kHeartbeat:
    case v1::AgentMessage::KIND_NOT_SET:
      return;
  }
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
  if (auto decided = job.stop.Tick(now)) {
    BroadcastStop(job, *std::move(decided), effects);
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
    next = std::min(next, job->stop.deadline());
    if (job->phase != v1::JobStatus::COLLECTING) continue;
    next = std::min(next, job->last_call_deadline);
    if (job->CountIn(v1::NodeStatus::JOINED) < job->settings.min_nodes()) {
      next = std::min(next, job->join_deadline());
    }
    if (job->progress_due) next = std::min(next, job->next_progress);
  }
  return next;
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

namespace core_internal {

absl::Status ValidateJoin(const v1::Join& join, bool port_fixed) {
  if (auto s = CheckJobId(join.job_id()); !s.ok()) return s;
  const auto& node = join.node();
  if (node.hostname().empty() || node.hostname().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostname must be 1..", kMaxHostBytes, " bytes"));
  }
  if (node.name().size() > kMaxHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node name must be 0..", kMaxHostBytes, " bytes"));
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
  if (auto s = CheckSegment(join.segment()); !s.ok()) return s;
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

}  // namespace core_internal

}  // namespace ctrun
