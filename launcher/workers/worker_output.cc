#include "launcher/workers/worker_output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
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

bool DuplicateFilter::Matches(absl::string_view line) const {
  return std::any_of(
      filters.begin(), filters.end(),
      [line](const std::string& f) { return absl::StrContains(line, f); });
}

WorkerOutput::WorkerOutput(std::string prefix, Console* console, int file_fd,
                           const DuplicateFilter* duplicate)
    : prefix_(std::move(prefix)),
      console_(console),
      file_fd_(file_fd),
      duplicate_(duplicate) {}

WorkerOutput::~WorkerOutput() {
  if (console_ != nullptr) console_->EndPiece(this);
  if (file_fd_ >= 0) close(file_fd_);
}

void WorkerOutput::Append(absl::string_view bytes, absl::Time now) {
  if (file_fd_ >= 0) WriteAll(file_fd_, bytes);
  if (!SplitsLines()) return;
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const absl::string_view piece = bytes.substr(0, nl);
    if (!cut_) {
      const size_t room = kMaxLine - partial_.size();
      partial_.append(piece.data(), std::min(room, piece.size()));
      if (piece.size() > room) {
        ShowRest(file_fd_ >= 0
                     ? " [ctrun: cut at 1 MiB; the whole line is in the log "
                       "file]"
                     : " [ctrun: cut at 1 MiB; --tee keeps whole lines in "
                       "--log_dir]");
        cut_ = true;
      }
    }
    if (nl == absl::string_view::npos) break;
    if (!cut_) ShowRest();
    cut_ = false;
    bytes.remove_prefix(nl + 1);
  }
  if (console_ != nullptr && partial_.size() > shown_ &&
      waiting_since_ == absl::InfiniteFuture()) {
    waiting_since_ = now;
  }
}

void WorkerOutput::Finish() {
  if (SplitsLines() && !cut_ && !partial_.empty()) ShowRest();
  partial_.clear();
  shown_ = 0;
  cut_ = false;
}

absl::Time WorkerOutput::PartialDue() const {
  return waiting_since_ == absl::InfiniteFuture()
             ? absl::InfiniteFuture()
             : waiting_since_ + kPartialAfter;
}

void WorkerOutput::ShowPartial(absl::Time now) {
  if (console_ == nullptr || cut_ || now < PartialDue()) return;
  console_->WriteWorkerPiece(this, prefix_,
                             absl::string_view(partial_).substr(shown_));
  shown_ = partial_.size();
  waiting_since_ = absl::InfiniteFuture();
}

void WorkerOutput::ShowRest(absl::string_view suffix) {
  if (duplicate_ != nullptr && duplicate_->Matches(partial_)) {
    WriteAll(duplicate_->fd, absl::StrCat(prefix_, partial_, suffix, "\n"));
  }
  if (console_ == nullptr) {
    // Only the duplicate file wanted the line.
  } else if (shown_ > 0) {
    console_->WriteWorkerPiece(
        this, prefix_,
        absl::StrCat(absl::string_view(partial_).substr(shown_), suffix, "\n"));
  } else {
    console_->WriteWorkerLine(absl::StrCat(prefix_, partial_, suffix, "\n"));
  }
  partial_.clear();
  shown_ = 0;
  waiting_since_ = absl::InfiniteFuture();
}

}  // namespace ctrun
