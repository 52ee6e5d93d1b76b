#include "launcher/workers/console.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

// A pipe that polls writable has room for PIPE_BUF bytes: a write of no more
// never blocks there, so the writer can always notice that it should stop.
constexpr size_t kChunk = PIPE_BUF;
constexpr int kPollMs = 100;

}  // namespace

Console::Console(int fd, size_t limit)
    : fd_(fd), limit_(limit), writer_([this] { WriteLoop(); }) {}

Console::~Console() {
  {
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.empty() || gone_;
    };
    uint64_t before;
    do {
      before = written_;
    } while (!mu_.AwaitWithTimeout(absl::Condition(&drained), kStallTimeout) &&
             written_ != before);
    stopping_ = true;
  }
  writer_.join();
}

bool Console::QueueWorkerText(absl::string_view text) {
  if (gone_) return false;
  if (queue_.size() + text.size() > limit_) {
    ++dropped_;
    ++unreported_drops_;
    return false;
  }
  queue_.append(text.data(), text.size());
  return true;
}

void Console::CloseOpenLine() {
  if (open_line_ == nullptr) return;
  open_line_ = nullptr;
  if (!gone_) queue_.push_back('\n');
}

void Console::WriteWorkerLine(absl::string_view line) {
  absl::MutexLock lock(&mu_);
  CloseOpenLine();
  QueueWorkerText(line);
}

void Console::WriteWorkerPiece(const void* owner, absl::string_view prefix,
                               absl::string_view text) {
  absl::MutexLock lock(&mu_);
  bool queued;
  if (open_line_ == owner) {
    queued = QueueWorkerText(text);
  } else {
    CloseOpenLine();
    queued = QueueWorkerText(absl::StrCat(prefix, text));
  }
  // A dropped piece leaves no line open: what follows starts afresh.
  open_line_ = queued && !absl::EndsWith(text, "\n") ? owner : nullptr;
}

void Console::EndPiece(const void* owner) {
  absl::MutexLock lock(&mu_);
  if (open_line_ == owner) CloseOpenLine();
}

void Console::WriteAgentLine(absl::string_view line) {
  absl::MutexLock lock(&mu_);
  CloseOpenLine();
  if (!gone_) queue_.append(line.data(), line.size());
}

bool Console::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() || gone_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
  return queue_.empty();
}

uint64_t Console::dropped_lines() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

bool Console::gone() const {
  absl::MutexLock lock(&mu_);
  return gone_;
}

void Console::WriteLoop() {
  while (true) {
    std::string chunk;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        gone_ = true;
        queue_.clear();
        return;
      }
      chunk = queue_.substr(0, kChunk);
    }
    pollfd p{fd_, POLLOUT, 0};
    const int ready = poll(&p, 1, kPollMs);
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    ssize_t n = -1;
    if (ready > 0 && !(p.revents & (POLLERR | POLLNVAL))) {
      do {
        n = write(fd_, chunk.data(), chunk.size());
      } while (n < 0 && errno == EINTR);
    }
    absl::MutexLock lock(&mu_);
    if (n < 0) {  // the console went away (EPIPE, closed): nobody reads
      gone_ = true;
      queue_.clear();
      continue;
    }
    queue_.erase(0, static_cast<size_t>(n));
    written_ += static_cast<uint64_t>(n);
    // Caught up: say what was lost, once.
    if (unreported_drops_ > 0 && queue_.size() < limit_ / 2) {
      CloseOpenLine();
      absl::StrAppend(&queue_, "ctrun: ", unreported_drops_,
                      " lines of worker output were dropped: the console did "
                      "not keep up (--tee or --redirects keep every line in "
                      "--log_dir)\n");
      unreported_drops_ = 0;
    }
  }
}

}  // namespace ctrun
