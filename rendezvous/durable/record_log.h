// RecordLog: where a durable ctrund writes its records (journal.proto's
// JournalRecord): a journal file (--state-dir, journal.h) or etcd (--etcd,
// etcd_log.h). DurableState drives it the same way for both.
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_DURABLE_RECORD_LOG_H_
#define CTRUN_RENDEZVOUS_DURABLE_RECORD_LOG_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ctrun/v1/journal.pb.h"

namespace ctrun {

// A job as the records leave it.
struct JournaledJob {
  v1::JobSnapshot snapshot;
  std::map<std::string, std::string> keys;  // of snapshot.round()
};

class RecordLog {
 public:
  virtual ~RecordLog() = default;

  // Adds one record to those of the next Commit. On failure the log is as
  // it was before the call.
  virtual absl::Status Append(const v1::JournalRecord& record) = 0;
  // Makes the records appended since the last Commit durable (with `sync`,
  // as far as the log can), all or none. On failure none of them stays and
  // their changes must be refused.
  virtual absl::Status Commit(bool sync) = 0;
  // Replaces everything by `records`, a checkpoint of the whole state.
  virtual absl::Status Rewrite(
      const std::vector<v1::JournalRecord>& records) = 0;
  // Whether the log has grown enough since the last Rewrite to be worth
  // rewriting.
  virtual bool WantsRewrite() const = 0;
  // Whether a record of about `bytes` more still fits in the next Commit;
  // when not, the owner commits what it has first.
  virtual bool HasRoomFor(size_t bytes) const = 0;
  // Whether a commit waits on other machines (a round trip or more), so
  // that its owner does best to gather concurrent changes into each.
  virtual bool CommitsOverNetwork() const { return false; }
};

// Opens a log and reads the jobs its records describe into `*jobs`.
using RecordLogOpener =
    std::function<absl::StatusOr<std::unique_ptr<RecordLog>>(
        std::map<std::string, JournaledJob>* jobs)>;

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_DURABLE_RECORD_LOG_H_
