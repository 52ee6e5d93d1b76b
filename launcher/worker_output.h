// WorkerOutput: one worker stream (stdout or stderr) cut into lines, each
// queued whole on the console with the worker's prefix and/or written to its
// log file. The console (console.h) may drop lines when it does not keep up;
// the log file never does.
#ifndef CTRUN_LAUNCHER_WORKER_OUTPUT_H_
#define CTRUN_LAUNCHER_WORKER_OUTPUT_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "launcher/console.h"

namespace ctrun {

// Replaces ${name} in `templ` by vars[name]; unknown names stay as written.
std::string ExpandTemplate(const std::string& templ,
                           const std::map<std::string, std::string>& vars);

class WorkerOutput {
 public:
  // `console` null: not shown (not owned); `file_fd` < 0: not kept. Takes
  // ownership of `file_fd`.
  WorkerOutput(std::string prefix, Console* console, int file_fd);
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
  Console* console_;
  int file_fd_;
  std::string partial_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKER_OUTPUT_H_
