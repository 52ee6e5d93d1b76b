// Journal: the write-ahead log of a ctrund started with --state-dir
// (ctrun/v1/journal.proto has the format), on StateFiles.
//
// Appends are undone when they fail: a write cut short (a full disk) is cut
// off again, so that later records never follow a broken one, and Commit
// removes every record since the last commit when its sync fails. Reading
// tells a record cut short at the end (a crash mid-write: dropped, and said)
// from damage that whole records follow (refused unless repairing, with the
// damaged file kept beside the journal).
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_DURABLE_JOURNAL_H_
#define CTRUN_RENDEZVOUS_DURABLE_JOURNAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctrun/v1/journal.pb.h"
#include "rendezvous/durable/record_log.h"
#include "rendezvous/durable/state_files.h"

namespace ctrun {

// One record as it is stored: length, CRC-32 and bytes.
std::string FrameRecord(const v1::JournalRecord& record);

// Bytes [begin, end) of a journal that hold no whole record.
struct DamagedBytes {
  size_t begin = 0;
  size_t end = 0;
  // At the end, and what a crash mid-write leaves: a record whose length
  // runs past the end, or zeroes.
  bool cut_short = false;
};

// What a journal's bytes hold.
struct JournalContents {
  // What the whole records describe, read in order, skipping damage.
  std::map<std::string, JournaledJob> jobs;
  size_t records = 0;
  // The whole records' bytes, in order: the journal without its damage.
  std::string whole;
  // In order; empty when every byte belongs to a whole record.
  std::vector<DamagedBytes> damage;

  // Whether the only damage is a record a crash cut short.
  bool TornTailOnly() const {
    return damage.size() == 1 && damage[0].cut_short;
  }
};

// Reads every whole record of `bytes`; after damage, reading goes on at the
// next offset where a whole record starts.
JournalContents ReadJournal(absl::string_view bytes);

class Journal;

// Opens the journal in `dir` on `files` (Journal::Open; the journal keeps
// `files`), for DurableState and the service (ServerOptions::state_log).
RecordLogOpener JournalOpener(std::string dir, bool repair,
                              std::shared_ptr<StateFiles> files);

class Journal : public RecordLog {
 public:
  struct Options {
    std::string dir;
    StateFiles* files = nullptr;  // must outlive the journal
    // Accept damage that whole records follow: keep the damaged file as
    // DIR/journal.damaged-TIME and go on with its whole records.
    bool repair = false;
  };

  // Creates DIR (mode 0700) if needed, takes its lock, and reads
  // DIR/journal into `*jobs`. FAILED_PRECONDITION when another process holds
  // the lock, or when the journal is damaged before its end and `repair` is
  // not set (naming the offset; nothing is changed then); the errno's
  // meaning when DIR cannot be used.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(
      const Options& options, std::map<std::string, JournaledJob>* jobs);
  ~Journal() override;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Appends one record, not yet synced. On failure the journal is as it
  // was before the call.
  absl::Status Append(const v1::JournalRecord& record) override;
  // Ends the records appended since the last Commit; with `sync`, returns
  // once they are on disk. When the sync fails they are removed (their
  // changes must be refused) and the error is returned.
  absl::Status Commit(bool sync) override;
  // Replaces the journal by `records`, atomically (a new file, synced, then
  // renamed over the old one).
  absl::Status Rewrite(const std::vector<v1::JournalRecord>& records) override;
  // Whether the journal has grown enough since the last Rewrite to be worth
  // rewriting.
  bool WantsRewrite() const override;
  // A file has room for any record.
  bool HasRoomFor(size_t) const override { return true; }

  std::string path() const { return dir_ + "/journal"; }

 private:
  Journal(std::string dir, StateFiles* files, int lock_fd);
  // Replaces the journal by `bytes`.
  absl::Status Replace(const std::string& bytes);
  // Cuts the file back to `end_`, after a failed write or sync.
  absl::Status CutBack();

  const std::string dir_;
  StateFiles* const files_;
  const int lock_fd_;
  // The files it owns (JournalOpener); null when the caller does.
  std::shared_ptr<StateFiles> owned_files_;
  friend RecordLogOpener JournalOpener(std::string dir, bool repair,
                                       std::shared_ptr<StateFiles> files);
  // Where the last whole record ends, and where the last Commit left it.
  uint64_t end_ = 0;
  uint64_t committed_ = 0;
  // A failed write left bytes past `end_` that could not be cut off yet.
  bool dirty_tail_ = false;
  // Sizes in bytes: of the journal as last rewritten, and appended since.
  uint64_t base_bytes_ = 0;
  uint64_t appended_bytes_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_DURABLE_JOURNAL_H_
