#include "launcher/policy/job_recap.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ctrun {

std::string FormatWall(absl::Duration wall) {
  return wall < absl::Minutes(1)
             ? absl::StrFormat("%.1fs", absl::ToDoubleSeconds(wall))
             : absl::FormatDuration(absl::Trunc(wall, absl::Seconds(1)));
}

void JobRecap::Start(absl::Time now) { start_ = now; }

void JobRecap::RoundEnded(absl::Time now) {
  if (ended_) return;
  ended_ = now;
  restarted_.reset();
}

void JobRecap::RoundStarted(int64_t round, int32_t restarts_used,
                            int32_t max_restarts, int new_processes,
                            absl::Time now) {
  if (first_round_ < 0) {
    first_round_ = round;
  } else {
    new_processes_ += new_processes;
  }
  last_round_ = round;
  restarts_used_ = restarts_used;
  max_restarts_ = max_restarts;
  if (ended_ && !restarted_) restarted_ = now;
}

void JobRecap::Stepped(uint64_t steps, absl::Time now) {
  const bool more = steps > steps_;
  steps_ = steps;
  if (!more) return;
  stepped_ever_ = true;
  // A step in a later round ends the loss (a step of the old round, still
  // running here while it ends, does not).
  if (ended_ && restarted_) {
    lost_ += now - *ended_;
    ended_.reset();
    restarted_.reset();
  }
}

std::string JobRecap::Line(int exit_code, absl::Time now) const {
  absl::Duration lost = lost_;
  bool approximate = false;
  if (ended_ && restarted_) {  // no step came after the last round change
    lost += *restarted_ - *ended_;
    approximate = true;
  }
  const int64_t rounds = first_round_ < 0 ? 0 : last_round_ - first_round_ + 1;
  std::string line = absl::StrCat(
      "job ended with exit ", exit_code, " after ", FormatWall(now - start_),
      ": ", rounds, rounds == 1 ? " round" : " rounds", ", restarts used ",
      restarts_used_, "/", max_restarts_, ", ", new_processes_,
      new_processes_ == 1 ? " process" : " processes", " started anew, ",
      absl::StrFormat("%.2fs", absl::ToDoubleSeconds(lost)),
      " lost to failures");
  if (approximate || (!stepped_ever_ && lost > absl::ZeroDuration())) {
    absl::StrAppend(&line,
                    " (to the next round's start: no step was signalled "
                    "after it)");
  }
  return line;
}

}  // namespace ctrun
