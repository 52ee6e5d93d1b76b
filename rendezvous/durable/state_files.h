// StateFiles: the file operations behind ctrund's journal, as an interface
// so that tests (and `CTRUND_JOURNAL_FAULTS`) can make them fail the way
// disks do: a write cut short by a full disk, a failed fsync, a machine
// crash that loses what was never synced.
#ifndef CTRUN_RENDEZVOUS_DURABLE_STATE_FILES_H_
#define CTRUN_RENDEZVOUS_DURABLE_STATE_FILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ctrun {

class StateFiles {
 public:
  virtual ~StateFiles() = default;

  // The whole file; NOT_FOUND when there is none.
  virtual absl::StatusOr<std::string> Read(const std::string& path) = 0;
  // Appends `bytes` at the end of the file, creating it (mode 0600). On
  // failure a prefix of `bytes` may have been written.
  virtual absl::Status Append(const std::string& path,
                              absl::string_view bytes) = 0;
  // Returns once the file's contents are on disk.
  virtual absl::Status Sync(const std::string& path) = 0;
  // Cuts the file to `size` bytes.
  virtual absl::Status Truncate(const std::string& path, uint64_t size) = 0;
  // Writes `bytes` as the whole of a new file and syncs it.
  virtual absl::Status WriteSynced(const std::string& path,
                                   absl::string_view bytes) = 0;
  // Renames `from` over `to`, then syncs the directory so that the rename
  // outlives a crash.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // Gives the file a second name, which later renames over `from` leave
  // alone: a copy that costs no space.
  virtual absl::Status Link(const std::string& from, const std::string& to) = 0;
};

// The real file system.
std::unique_ptr<StateFiles> NewPosixStateFiles();

// Passes every operation to `base`, failing some of them on request, and
// keeps track of what was synced.
class FaultInjectingFiles final : public StateFiles {
 public:
  explicit FaultInjectingFiles(std::unique_ptr<StateFiles> base);

  // The next Append writes only the first `bytes` of its data, then fails
  // with ENOSPC.
  void FailNextAppendAfter(size_t bytes) { fail_append_after_ = bytes; }
  // The next Sync fails with EIO.
  void FailNextSync() { fail_sync_ = true; }
  // Every Append fails with probability `append` (having written a random
  // prefix), every Sync with probability `sync`.
  void FailRandomly(double append, double sync, uint64_t seed);
  // Cuts every file back to what was last synced, as a machine crash
  // would.
  absl::Status DropUnsynced();

  absl::StatusOr<std::string> Read(const std::string& path) override;
  absl::Status Append(const std::string& path,
                      absl::string_view bytes) override;
  absl::Status Sync(const std::string& path) override;
  absl::Status Truncate(const std::string& path, uint64_t size) override;
  absl::Status WriteSynced(const std::string& path,
                           absl::string_view bytes) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Link(const std::string& from, const std::string& to) override;

 private:
  struct Sizes {
    uint64_t written = 0;
    uint64_t synced = 0;
  };
  bool Chance(double p);

  const std::unique_ptr<StateFiles> base_;
  std::map<std::string, Sizes> sizes_;
  std::optional<size_t> fail_append_after_;
  bool fail_sync_ = false;
  double append_p_ = 0, sync_p_ = 0;
  std::mt19937_64 random_;
};

// The files ctrund uses: the real ones, or, when the environment variable
// CTRUND_JOURNAL_FAULTS holds "append=P,sync=P,seed=N" (for tests), real
// ones that fail at random. INVALID_ARGUMENT for a malformed value.
absl::StatusOr<std::unique_ptr<StateFiles>> StateFilesFromEnvironment();

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_DURABLE_STATE_FILES_H_
