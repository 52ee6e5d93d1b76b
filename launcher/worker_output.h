// WorkerOutput: one worker stream (stdout or stderr) cut into lines, each
// written whole to the console with the worker's prefix and/or to its log
// file. Only the agent's loop writes to the console, one write per line, so
// lines of different workers never interleave mid-line.
#ifndef CTRUN_LAUNCHER_WORKER_OUTPUT_H_
#define CTRUN_LAUNCHER_WORKER_OUTPUT_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace ctrun {

// Replaces ${name} in `templ` by vars[name]; unknown names stay as written.
std::string ExpandTemplate(const std::string& templ,
                           const std::map<std::string, std::string>& vars);

class WorkerOutput {
 public:
  // `console_fd` < 0: not shown; `file_fd` < 0: not kept. Takes ownership
  // of `file_fd`.
  WorkerOutput(std::string prefix, int console_fd, int file_fd);
  ~WorkerOutput();
  WorkerOutput(WorkerOutput&& other) noexcept;
  WorkerOutput& operator=(WorkerOutput&&) = delete;
  WorkerOutput(const WorkerOutput&) = delete;

  // Emits every complete line in `bytes` (with what was buffered before).
  void Append(absl::string_view bytes);
  // Emits what is left without a newline (the stream ended).
  void Finish();

 private:
  void Emit(absl::string_view line);

  // A line longer than this is emitted in pieces.
  static constexpr size_t kMaxLine = 64 << 10;

  std::string prefix_;
  int console_fd_;
  int file_fd_;
  std::string partial_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKER_OUTPUT_H_
