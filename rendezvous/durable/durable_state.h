// DurableState: what a durable ctrund keeps, between the service and its
// record log: the journal of --state-dir (journal.h) or etcd (--etcd,
// etcd_log.h).
//
// The service journals a store request's changes before anyone can see
// them: it stages them in the KvStore, appends them here, and commits the
// store only once Commit succeeded (rolling it back otherwise). Commit syncs
// according to the fsync policy:
//   always  every change is synced on its own before it is answered;
//   batch   the changes of one batch of concurrent requests share a sync,
//           still before any of them is answered (the default);
//   never   nothing is synced: changes outlive a crash of ctrund, not one of
//           the machine.
// A job's state (membership, rounds) is synced unless the policy is never;
// one that could not be saved is tried again at every later call, and its
// store refuses changes until it is saved.
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_DURABLE_DURABLE_STATE_H_
#define CTRUN_RENDEZVOUS_DURABLE_DURABLE_STATE_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctrun/v1/journal.pb.h"
#include "ctrun/v1/store.pb.h"
#include "rendezvous/core/kv_store.h"
#include "rendezvous/durable/record_log.h"

namespace ctrun {

enum class FsyncPolicy { kAlways, kBatch, kNever };

// "always", "batch" or "never"; INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<FsyncPolicy> ParseFsyncPolicy(absl::string_view name);
absl::string_view FsyncPolicyName(FsyncPolicy policy);

class DurableState {
 public:
  struct Options {
    FsyncPolicy fsync = FsyncPolicy::kBatch;
    // Where the records go: a journal (JournalOpener, journal.h) or etcd
    // (ctrund --etcd, etcd_log.h).
    RecordLogOpener open_log;
  };
  // A job's state now, or none once it has ended.
  using Snapshot =
      std::function<std::optional<v1::JobSnapshot>(const std::string& id)>;

  // Opens the log and reads its jobs into `*jobs`.
  static absl::StatusOr<std::unique_ptr<DurableState>> Open(
      Options options, std::map<std::string, JournaledJob>* jobs);

  // Replaces the journal by `records`, a checkpoint of the whole state.
  absl::Status Rewrite(const std::vector<v1::JournalRecord>& records);
  // Rewrites the journal from `checkpoint()` once it has grown enough.
  void MaybeCompact(
      const std::function<std::vector<v1::JournalRecord>()>& checkpoint);

  // Journals and commits the state of jobs `ids`, and of every job whose
  // state could not be saved before. Failures are logged; those jobs are
  // tried again at the next call.
  void SaveJobs(const std::vector<std::string>& ids, const Snapshot& snapshot);
  // Whether some job's state waits to be saved again.
  bool HasUnsavedJobs() const { return !unsaved_jobs_.empty(); }

  // Appends what one store request changed in `scope`, not yet committed.
  // On failure nothing of it stays in the journal.
  absl::Status AppendStoreChange(const v1::StoreScope& scope,
                                 const std::vector<KvStore::Change>& changes);
  // Commits what was appended since the last commit. On failure none of it
  // stays: each of those changes must be refused.
  absl::Status Commit();
  // Whether each store change must be committed on its own, before the
  // next one is applied (fsync=always).
  bool CommitsEachChange() const { return fsync_ == FsyncPolicy::kAlways; }
  // Whether a store change of about `bytes` still fits in the next commit
  // (RecordLog::HasRoomFor); when not, commit first.
  bool HasRoomFor(size_t bytes) const { return log_->HasRoomFor(bytes); }
  // RecordLog::CommitsOverNetwork.
  bool CommitsOverNetwork() const { return log_->CommitsOverNetwork(); }

 private:
  DurableState(std::unique_ptr<RecordLog> log, FsyncPolicy fsync);

  const std::unique_ptr<RecordLog> log_;
  const FsyncPolicy fsync_;
  std::set<std::string> unsaved_jobs_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_DURABLE_DURABLE_STATE_H_
