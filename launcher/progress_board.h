// ProgressBoard: the agent's side of the progress board
// (ctrun/progress_board.h): creates the node's board file, clears a slot
// for each new worker, and reads the slots for the ProgressMonitor.
//
// Used by the agent's loop only; not thread-safe.
#ifndef CTRUN_LAUNCHER_PROGRESS_BOARD_H_
#define CTRUN_LAUNCHER_PROGRESS_BOARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/progress_monitor.h"

namespace ctrun {

// How a worker's Python stacks can be taken (its slot says).
struct StackDump {
  bool on_signal = false;
  int signal = 0;
};

// `bytes` as valid UTF-8: each byte that does not belong to a well-formed
// sequence becomes '?'. Section names travel in protobuf strings, which
// must be UTF-8, and a worker's name may be cut in the middle of a
// character (or be anything at all).
std::string SanitizeUtf8(absl::string_view bytes);

class ProgressBoard {
 public:
  // Creates `path` (mode 0600, replacing a file there) with `slots` slots.
  static absl::StatusOr<std::unique_ptr<ProgressBoard>> Create(
      const std::string& path, int slots);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  const std::string& path() const { return path_; }
  int slots() const { return slots_; }

  // Clears every slot, before a new attempt's workers start.
  void Clear();
  // Every slot as it stands now. Times are on the monotonic clock that
  // MonotonicNow() reads.
  std::vector<ProgressSample> Read() const;
  StackDump StacksOf(int slot) const;

 private:
  ProgressBoard(std::string path, int slots, void* map, size_t size)
      : path_(std::move(path)), slots_(slots), map_(map), size_(size) {}

  const std::string path_;
  const int slots_;
  void* const map_;
  const size_t size_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_PROGRESS_BOARD_H_
