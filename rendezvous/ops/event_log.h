// EventLog: what happened to jobs, one JSON object per line (--event_log).
//
// ctrun and ctrund both write one (an agent that hosts the rendezvous
// writes the events of both, told apart by `source`); the lines follow
// v1::Event (event.proto) in protobuf's JSON mapping with its field names, so
// `jq` reads them. docs/events.md lists the events.
//
// Thread-safe. Each line is one write(2) to a file opened with O_APPEND:
// processes sharing a file (the agents of one node) never cut each other's
// lines.
#ifndef CTRUN_RENDEZVOUS_OPS_EVENT_LOG_H_
#define CTRUN_RENDEZVOUS_OPS_EVENT_LOG_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ctrun/v1/event.pb.h"

namespace ctrun {

class EventLog {
 public:
  // Where the one line about a failed write goes (the binary's own
  // stderr: ctrun's log is off, ctrund's is spdlog).
  using Warn = std::function<void(const std::string& line)>;

  // Opens `path` for appending, creating it (0644), without ever waiting: a
  // FIFO that nobody reads is refused rather than waited for, and a write
  // that would block (a reader that stopped reading) fails like a full
  // disk. INVALID_ARGUMENT naming the file and the reason when it cannot be
  // opened.
  static absl::StatusOr<std::unique_ptr<EventLog>> Open(const std::string& path,
                                                        Warn warn);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Writes `event` from `source` ("rendezvous" or "agent"), stamped with
  // `time` (wall clock). The first failed write is reported through `warn`;
  // the job carries on.
  void Write(const char* source, v1::Event event,
             absl::Time time = absl::Now());

  const std::string& path() const { return path_; }

 private:
  EventLog(int fd, std::string path, Warn warn)
      : fd_(fd), path_(std::move(path)), warn_(std::move(warn)) {}

  const int fd_;
  const std::string path_;
  const Warn warn_;
  absl::Mutex mu_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// One event as its log line, without the newline: the JSON object.
std::string EventToJson(const v1::Event& event);

// RFC 3339 in UTC with microseconds, as event times are written.
std::string FormatEventTime(absl::Time time);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_OPS_EVENT_LOG_H_
