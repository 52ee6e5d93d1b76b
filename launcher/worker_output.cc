#include "launcher/worker_output.h"

#include <unistd.h>

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
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    if (nl == absl::string_view::npos) {
      partial_.append(bytes.data(), bytes.size());
      while (partial_.size() >= kMaxLine) {
        Emit(absl::string_view(partial_).substr(0, kMaxLine));
        partial_.erase(0, kMaxLine);
      }
      return;
    }
    if (partial_.empty()) {
      Emit(bytes.substr(0, nl));
    } else {
      partial_.append(bytes.data(), nl);
      Emit(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void WorkerOutput::Finish() {
  if (!partial_.empty()) Emit(partial_);
  partial_.clear();
}

void WorkerOutput::Emit(absl::string_view line) {
  if (file_fd_ >= 0) WriteAll(file_fd_, absl::StrCat(line, "\n"));
  if (console_ != nullptr) {
    console_->WriteWorkerLine(absl::StrCat(prefix_, line, "\n"));
  }
}

}  // namespace ctrun
