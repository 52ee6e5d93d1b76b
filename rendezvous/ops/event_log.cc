#include "rendezvous/ops/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace ctrun {

absl::StatusOr<std::unique_ptr<EventLog>> EventLog::Open(
    const std::string& path, Warn warn) {
  // Non-blocking: opening a FIFO for writing waits for a reader, and both
  // binaries open the log with their stop signals already blocked.
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK,
           0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot open ", path, " for appending: ",
        errno == ENXIO ? "it is a FIFO that nobody reads (start its reader "
                         "first, or name a regular file)"
                       : strerror(errno)));
  }
  return std::unique_ptr<EventLog>(new EventLog(fd, path, std::move(warn)));
}

EventLog::~EventLog() { close(fd_); }

void EventLog::Write(const char* source, v1::Event event, absl::Time time) {
  event.set_time(FormatEventTime(time));
  event.set_source(source);
  const std::string line = EventToJson(event) + "\n";
  std::string warning;
  {
    absl::MutexLock lock(&mu_);
    ssize_t n;
    do {
      n = write(fd_, line.data(), line.size());
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(line.size()) || failed_) return;
    // A full disk must not stop a job; saying so once is enough.
    failed_ = true;
    const char* why = n >= 0            ? "short write"
                      : errno == EAGAIN ? "its reader does not keep up"
                                        : strerror(errno);
    warning = absl::StrCat("event log ", path_, ": write failed (", why,
                           "); later events may be lost");
  }
  if (warn_) warn_(warning);
}

std::string EventToJson(const v1::Event& event) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  // Only fails for messages that JSON cannot represent; Event has none.
  (void)google::protobuf::util::MessageToJsonString(event, &json, options);
  return json;
}

std::string FormatEventTime(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
}

}  // namespace ctrun
