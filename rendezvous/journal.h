// Journal: the write-ahead log of a ctrund started with --state-dir
// (ctrun/v1/journal.proto has the format).
//
// The service appends a record for each change the core reports and each
// store mutation before it answers; membership changes are fsync'd, store
// mutations are written but not synced (they outlive a crash of the daemon,
// not one of the machine). When the appended records outgrow the state
// they describe, the service rewrites the journal from a checkpoint.
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_JOURNAL_H_
#define CTRUN_RENDEZVOUS_JOURNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctrun/v1/journal.pb.h"

namespace ctrun {

// A job as the journal's records leave it.
struct JournaledJob {
  v1::JobSnapshot snapshot;
  std::map<std::string, std::string> keys;  // of snapshot.round()
};

// One record as it is stored: length, CRC-32 and bytes.
std::string FrameRecord(const v1::JournalRecord& record);

// The jobs that `bytes` (a journal's contents) describe. Reading stops at
// the first record that is cut short or damaged; `*dropped` then counts the
// bytes from there on (0 when the whole journal was read).
std::map<std::string, JournaledJob> ReplayJournal(absl::string_view bytes,
                                                  size_t* dropped);

class Journal {
 public:
  // Creates DIR (mode 0700) if needed, takes its lock, and reads
  // DIR/journal into `*jobs`. FAILED_PRECONDITION when another process
  // holds the lock; the errno's meaning when DIR cannot be used.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(
      const std::string& dir, std::map<std::string, JournaledJob>* jobs);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Appends one record; with `sync`, returns once it is on disk.
  absl::Status Append(const v1::JournalRecord& record, bool sync);
  // Replaces the journal by `records`, atomically (a new file, synced, then
  // renamed over the old one).
  absl::Status Rewrite(const std::vector<v1::JournalRecord>& records);
  // Whether the journal has grown enough since the last Rewrite to be worth
  // rewriting.
  bool WantsRewrite() const;

  const std::string& dir() const { return dir_; }

 private:
  Journal(std::string dir, int lock_fd);

  const std::string dir_;
  const int lock_fd_;
  int fd_ = -1;
  // Sizes in bytes: of the journal as last rewritten, and appended since.
  uint64_t base_bytes_ = 0;
  uint64_t appended_bytes_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_JOURNAL_H_
