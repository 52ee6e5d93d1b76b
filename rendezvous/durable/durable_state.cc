#include "rendezvous/durable/durable_state.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace ctrun {

absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name) {
  if (name == "always") return FsyncPolicy::kAlways;
  if (name == "batch") return FsyncPolicy::kBatch;
  if (name == "never") return FsyncPolicy::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not one of always, batch, never"));
}

absl::string_view FsyncPolicyName(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kAlways:
      return "always";
    case FsyncPolicy::kBatch:
      return "batch";
    case FsyncPolicy::kNever:
      return "never";
  }
  return "?";
}

DurableState::DurableState(std::unique_ptr<RecordLog> log, FsyncPolicy fsync)
    : log_(std::move(log)), fsync_(fsync) {}

absl::StatusOr<std::unique_ptr<DurableState>> DurableState::Open(
    Options options, std::map<std::string, JournaledJob>* jobs) {
  auto log = options.open_log(jobs);
  if (!log.ok()) return log.status();
  return std::unique_ptr<DurableState>(
      new DurableState(*std::move(log), options.fsync));
}

absl::Status DurableState::Rewrite(
    const std::vector<v1::JournalRecord>& records) {
  return log_->Rewrite(records);
}

void DurableState::MaybeCompact(
    const std::function<std::vector<v1::JournalRecord>()>& checkpoint) {
  if (!log_->WantsRewrite()) return;
  if (auto s = log_->Rewrite(checkpoint()); !s.ok()) {
    spdlog::error("cannot compact the saved state: {}",
                  std::string(s.message()));
  }
}

void DurableState::SaveJobs(const std::vector<std::string>& ids,
                            const Snapshot& snapshot) {
  std::set<std::string> saving = std::move(unsaved_jobs_);
  unsaved_jobs_.clear();
  saving.insert(ids.begin(), ids.end());
  if (saving.empty()) return;
  for (const auto& id : saving) {
    v1::JournalRecord record;
    if (auto state = snapshot(id)) {
      *record.mutable_job() = *std::move(state);
    } else {
      record.set_forget_job(id);
    }
    if (auto s = log_->Append(record); !s.ok()) {
      spdlog::error("state of job {} not saved (tried again in a second): {}",
                    id, std::string(s.message()));
      unsaved_jobs_.insert(id);
    }
  }
  if (auto s = log_->Commit(fsync_ != FsyncPolicy::kNever); !s.ok()) {
    spdlog::error("state of jobs not saved (tried again in a second): {}",
                  std::string(s.message()));
    unsaved_jobs_ = std::move(saving);
  }
}

absl::Status DurableState::AppendStoreChange(
    const v1::StoreScope& scope, const std::vector<KvStore::Change>& changes) {
  if (unsaved_jobs_.contains(scope.job_id())) {
    // Replayed without its job's state, the change would be lost.
    return absl::UnavailableError(
        absl::StrCat("the state of job '", scope.job_id(),
                     "' is not saved yet: the state directory fails writes"));
  }
  v1::JournalRecord record;
  v1::KvChange* change = record.mutable_change();
  change->set_job_id(scope.job_id());
  change->set_round(scope.round());
  for (const auto& c : changes) {
    auto* key = change->add_keys();
    key->set_key(c.key);
    if (c.value) {
      key->set_value(*c.value);
    } else {
      key->set_deleted(true);
    }
  }
  return log_->Append(record);
}

absl::Status DurableState::Commit() {
  return log_->Commit(fsync_ != FsyncPolicy::kNever);
}

}  // namespace ctrun
