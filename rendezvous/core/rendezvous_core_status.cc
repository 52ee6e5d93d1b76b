// What a job looks like from outside: ctrund status.

#include "absl/strings/str_cat.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/rendezvous_core_state.h"

namespace ctrun {

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
  for (const auto& p : job.promotions) s.add_promotions(p);
  s.set_spares_promoted(job.spares_promoted);
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
    n->set_kept_workers(node->kept_workers);
    n->set_recovery_s(node->recovery_s);
    n->set_spare(node->state == v1::NodeStatus::WAITING &&
                 job.settings.spares() > 0);
    n->set_segment(node->join.segment());
  }
  return s;
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

std::vector<v1::QuarantinedNode> RendezvousCore::ListQuarantined(
    absl::Time now) const {
  std::vector<v1::QuarantinedNode> out;
  for (const auto& [key, q] : quarantined_) {
    if (q.until <= now) continue;
    v1::QuarantinedNode& n = out.emplace_back();
    n.set_hostname(key.first);
    n.set_job_only(!key.second.empty());
    n.set_reason(q.reason);
    n.set_job_id(q.job);
    n.set_remaining_ms(absl::ToInt64Milliseconds(q.until - now));
  }
  return out;
}

}  // namespace ctrun
