// RepeatedWarning: one log line for a failure that repeats (etcd out of
// reach, a lease that cannot be renewed), instead of one per attempt.
//
// The first failure is said at once; while it goes on, one line per
// `every` with the number of failures since the last line; when it ends,
// one line saying after how many. Pure: fed `now`, answers the line to log
// (or nothing). Not thread-safe.
#ifndef CTRUN_RENDEZVOUS_CORE_REPEATED_WARNING_H_
#define CTRUN_RENDEZVOUS_CORE_REPEATED_WARNING_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ctrun {

class RepeatedWarning {
 public:
  explicit RepeatedWarning(absl::Duration every = absl::Minutes(1))
      : every_(every) {}

  // One more failure (`what`, e.g. "cannot renew the etcd lease: ...");
  // the line to log now, if any.
  std::optional<std::string> Failed(absl::string_view what, absl::Time now);
  // The failures ended; the line to log, if any failure was said.
  std::optional<std::string> Succeeded(absl::string_view what_works);

  // Failures in a row so far (0 after a success).
  int64_t failures() const { return failures_; }

 private:
  const absl::Duration every_;
  int64_t failures_ = 0;
  int64_t unsaid_ = 0;  // failures since the last line
  absl::Time said_at_ = absl::InfinitePast();
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_REPEATED_WARNING_H_
