// WorkerOutput: one worker stream (stdout or stderr). Its log file gets the
// bytes verbatim; the console gets whole lines, each queued with the worker's
// prefix. The console (console.h) may drop lines when it does not keep up;
// the log file never does.
#ifndef CTRUN_LAUNCHER_WORKERS_WORKER_OUTPUT_H_
#define CTRUN_LAUNCHER_WORKERS_WORKER_OUTPUT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "launcher/workers/console.h"

namespace ctrun {

// Replaces ${name} in `templ` by vars[name]; unknown names stay as written.
std::string ExpandTemplate(const std::string& templ,
                           const std::map<std::string, std::string>& vars);

// torchrun's --duplicate-std{out,err}-filters: the lines of every local
// rank that contain one of `filters` are also written, prefixed, to one
// file of the attempt (filtered_stdout.log, filtered_stderr.log).
struct DuplicateFilter {
  std::vector<std::string> filters;
  int fd = -1;  // owned by whoever made it; outlives the WorkerOutputs

  bool Matches(absl::string_view line) const;
};

class WorkerOutput {
 public:
  // `console` null: not shown (not owned); `file_fd` < 0: not kept. Takes
  // ownership of `file_fd`. `duplicate` (optional, not owned) receives the
  // lines it matches.
  WorkerOutput(std::string prefix, Console* console, int file_fd,
               const DuplicateFilter* duplicate = nullptr);
  ~WorkerOutput();
  // Not movable: the console knows an open line by its WorkerOutput.
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  // Writes `bytes` to the log file, and every line they complete (with what
  // was buffered before) to the console. `now`: when they were read.
  void Append(absl::string_view bytes, absl::Time now);
  // Shows what is left without a newline (the stream ended).
  void Finish();
  // Lines from now on carry `prefix` (a worker that took a new rank).
  void set_prefix(std::string prefix) { prefix_ = std::move(prefix); }

  // A line without its newline yet (a prompt, a progress bar) is shown as
  // far as it goes once the worker has been quiet this long; the rest
  // follows as it comes, and the line stays one line unless another
  // worker's line comes between (then it goes on after its prefix).
  static constexpr absl::Duration kPartialAfter = absl::Milliseconds(100);
  // When the line being read is due to be shown in part; InfiniteFuture
  // when nothing is waiting.
  absl::Time PartialDue() const;
  // Shows the waiting part of the line if it is due at `now`.
  void ShowPartial(absl::Time now);
  // Whether nothing keeps this stream any more: no log file, and a console
  // that went away. Its pipe is then closed, so that the worker gets EPIPE
  // as it would writing to that console itself (as under torchrun).
  // (A stream hidden by --local_ranks_filter is read and discarded.)
  bool Unread() const {
    return file_fd_ < 0 && console_ != nullptr && console_->gone();
  }

  // The longest line the console shows whole; a longer one is shown cut
  // there, with a note, and only its log file (if any) has all of it.
  static constexpr size_t kMaxLine = 1 << 20;

 private:
  // Shows the line being read (what is not shown yet) with `suffix` and
  // its newline, and starts the next.
  void ShowRest(absl::string_view suffix = "");

  // Whether lines are cut out of the stream at all.
  bool SplitsLines() const {
    return console_ != nullptr || duplicate_ != nullptr;
  }

  std::string prefix_;
  Console* console_;
  int file_fd_;
  const DuplicateFilter* duplicate_;
  std::string partial_;  // of the line being read, up to kMaxLine
  size_t shown_ = 0;     // bytes of partial_ shown already
  absl::Time waiting_since_ = absl::InfiniteFuture();  // unshown bytes came
  bool cut_ = false;  // the line being read was cut: skip to its end
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_WORKER_OUTPUT_H_
