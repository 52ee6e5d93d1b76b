// Snapshots and checkpoints, and a job restored from them.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/rendezvous_core_state.h"

namespace ctrun {

using core_internal::kMaxLearnedSections;
using core_internal::ValidateJoin;

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

}  // namespace ctrun
