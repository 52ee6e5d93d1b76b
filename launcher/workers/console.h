// Console: the agent's stdout or stderr, written by a thread of its own, so
// that a console that stops reading (a pipe nobody drains, a stuck log
// shipper, terminal flow control) never blocks the agent's loop.
//
// What is queued is bounded: worker lines that do not fit are dropped and
// counted, and the count is written once the console has caught up. The
// agent's own lines are never dropped (they are few). Lines are queued
// whole and written in order, so lines never interleave mid-line.
//
// Thread-safe.
#ifndef CTRUN_LAUNCHER_WORKERS_CONSOLE_H_
#define CTRUN_LAUNCHER_WORKERS_CONSOLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ctrun {

class Console {
 public:
  static constexpr size_t kDefaultLimit = 4 << 20;

  // Writes to `fd`, which it does not own; at most `limit` bytes wait.
  explicit Console(int fd, size_t limit = kDefaultLimit);
  // Writes what is queued while the console takes it; gives up (drops the
  // rest) once it has taken nothing for kStallTimeout.
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Queues one whole line of a worker's output (with its newline), or drops
  // it when `limit` bytes are waiting already.
  void WriteWorkerLine(absl::string_view line);

  // Partial lines (a prompt, a progress bar) shown before their newline
  // comes. The console remembers whose line is open: any other line ends it
  // first (with a newline), and only its owner continues it.
  //
  // Shows `text` of `owner`'s line: after `prefix` unless it continues the
  // line `owner` has open. `text` ending in a newline closes the line.
  // Dropped, like a whole line, when the console is full.
  void WriteWorkerPiece(const void* owner, absl::string_view prefix,
                        absl::string_view text);
  // Ends `owner`'s open line, if it has one (its stream ended).
  void EndPiece(const void* owner);
  // Queues one of the agent's own lines; never dropped.
  void WriteAgentLine(absl::string_view line);
  // Waits until everything queued is written, or `timeout` passed; returns
  // whether it all was.
  bool Flush(absl::Duration timeout);

  // Worker lines dropped so far.
  uint64_t dropped_lines() const;
  // Whether the console went away (its reader closed it: `| head`); what is
  // written from then on is discarded.
  bool gone() const;

  static constexpr absl::Duration kStallTimeout = absl::Seconds(1);

 private:
  void WriteLoop();
  // Queues `text` of a worker unless the console is full (then counted);
  // returns whether it did.
  bool QueueWorkerText(absl::string_view text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the open partial line, if any, so that other text starts afresh.
  void CloseOpenLine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const int fd_;
  const size_t limit_;

  mutable absl::Mutex mu_;
  std::string queue_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // bytes, ever
  uint64_t unreported_drops_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Whose partial line the console shows last, still without its newline.
  const void* open_line_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The console cannot be written (closed, or abandoned at exit).
  bool gone_ ABSL_GUARDED_BY(mu_) = false;

  std::thread writer_;  // started last: it reads the fields above
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_CONSOLE_H_
