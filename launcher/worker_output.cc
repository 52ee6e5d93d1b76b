#include "launcher/worker_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

// Writes all of `data`, retrying after EINTR and short writes. A file that
// cannot be written (disk full) loses the line; workers must not stop for
// that.
void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

std::string ExpandTemplate(const std::string& templ,
                           const std::map<std::string, std::string>& vars) {
  std::string out;
  size_t i = 0;
  while (i < templ.size()) {
    if (templ.compare(i, 2, "${") == 0) {
      const size_t end = templ.find('}', i + 2);
      if (end != std::string::npos) {
        auto it = vars.find(templ.substr(i + 2, end - i - 2));
        if (it != vars.end()) {
          out += it->second;
          i = end + 1;
          continue;
        }
      }
    }
    out += templ[i++];
  }
  return out;
}

WorkerOutput::WorkerOutput(std::string prefix, Console* console, int file_fd)
    : prefix_(std::move(prefix)), console_(console), file_fd_(file_fd) {}

WorkerOutput::~WorkerOutput() {
  if (file_fd_ >= 0) close(file_fd_);
}

WorkerOutput::WorkerOutput(WorkerOutput&& other) noexcept
    : prefix_(std::move(other.prefix_)),
      console_(other.console_),
      file_fd_(std::exchange(other.file_fd_, -1)),
      partial_(std::move(other.partial_)) {}

void WorkerOutput::Append(absl::string_view bytes) {
  if (file_fd_ >= 0) WriteAll(file_fd_, bytes);
  if (console_ == nullptr) return;
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const absl::string_view piece = bytes.substr(0, nl);
    if (!cut_) {
      const size_t room = kMaxLine - partial_.size();
      partial_.append(piece.data(), std::min(room, piece.size()));
      if (piece.size() > room) {
        Show(partial_, file_fd_ >= 0
                           ? " [ctrun: cut at 1 MiB; the whole line is in "
                             "the log file]"
                           : " [ctrun: cut at 1 MiB; --tee keeps whole lines "
                             "in --log_dir]");
        partial_.clear();
        cut_ = true;
      }
    }
    if (nl == absl::string_view::npos) return;
    if (!cut_) Show(partial_);
    partial_.clear();
    cut_ = false;
    bytes.remove_prefix(nl + 1);
  }
}

void WorkerOutput::Finish() {
  if (console_ != nullptr && !partial_.empty() && !cut_) Show(partial_);
  partial_.clear();
  cut_ = false;
}

void WorkerOutput::Show(absl::string_view line, absl::string_view suffix) {
  console_->WriteWorkerLine(absl::StrCat(prefix_, line, suffix, "\n"));
}

}  // namespace ctrun
