// ProgressBoard: the agent's side of the progress board
// (ctrun/progress_board.h): creates the node's board, clears a slot for each
// new worker, and reads the slots for the ProgressMonitor.
//
// The board is an anonymous memory file (memfd) sealed at its size: workers
// reach it as /proc/AGENT_PID/fd/N, and nothing a worker does can shrink it
// (a read past the end of a shrunk mapping would kill the agent with
// SIGBUS) or remove it (the next round's workers would report to nothing).
//
// Used by the agent's loop only; not thread-safe.
#ifndef CTRUN_LAUNCHER_WORKERS_AGENT_BOARD_H_
#define CTRUN_LAUNCHER_WORKERS_AGENT_BOARD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/policy/progress_monitor.h"

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
  // Creates a board with `slots` slots, sealed against shrinking and
  // growing. INTERNAL naming the call when the kernel refuses.
  static absl::StatusOr<std::unique_ptr<ProgressBoard>> Create(int slots);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // Where workers open the board (CTRUN_PROGRESS_FILE): a path in this
  // process's /proc, valid while the board lives.
  const std::string& path() const { return path_; }
  int slots() const { return slots_; }

  // Clears every slot, before a new attempt's workers start (and the stop
  // state, to idle when stops are on); or one, before a worker replacing
  // another starts in it.
  void Clear();
  void Clear(int slot);
  // Every slot as it stands now. Times are on the monotonic clock that
  // MonotonicNow() reads.
  std::vector<ProgressSample> Read() const;
  StackDump StacksOf(int slot) const;
  // Coordinated stops: whether they are on (--preemption_grace), and the
  // state the workers' stop check reads (progress::kStop*), with the step
  // of kStopAt and why (cut to the header's room).
  void EnableStops() { stops_on_ = true; }
  void SetStop(uint32_t state, int64_t step, absl::string_view reason);

 private:
  ProgressBoard(int fd, int slots, void* map, size_t size);

  const int fd_;
  const std::string path_;
  const int slots_;
  void* const map_;
  const size_t size_;
  bool stops_on_ = false;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_AGENT_BOARD_H_
