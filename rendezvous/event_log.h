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
#ifndef CTRUN_RENDEZVOUS_EVENT_LOG_H_
#define CTRUN_RENDEZVOUS_EVENT_LOG_H_

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
  // Opens `path` for appending, creating it (0644). INVALID_ARGUMENT naming
  // the file and the reason when it cannot be.
  static absl::StatusOr<std::unique_ptr<EventLog>> Open(
      const std::string& path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Writes `event` from `source` ("rendezvous" or "agent"), stamped with
  // `time` (wall clock). A failed write is reported once on stderr; the job
  // carries on.
  void Write(const char* source, v1::Event event,
             absl::Time time = absl::Now());

  const std::string& path() const { return path_; }

 private:
  EventLog(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  const int fd_;
  const std::string path_;
  absl::Mutex mu_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// One event as its log line, without the newline: the JSON object.
std::string EventToJson(const v1::Event& event);

// RFC 3339 in UTC with microseconds, as event times are written.
std::string FormatEventTime(absl::Time time);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_EVENT_LOG_H_
