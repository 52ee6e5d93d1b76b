// StragglerWatch: names the rank of a job that is consistently slower than
// the others, from the paces its agents report (ProgressReport.paces), as a
// pure state machine owned by the rendezvous core; one per job.
//
// A rank's pace is its mean step time over its agent's last report period.
// Each pace is compared with the median of the other ranks' latest ones
// (fresh within kFresh, timed the same way: heartbeats or sections). A rank
// at least kFactor times slower in kStrikes reports in a row, over at least
// kMinSteps steps, is named once per round. Nothing is restarted for it.
#ifndef CTRUN_RENDEZVOUS_CORE_STRAGGLER_WATCH_H_
#define CTRUN_RENDEZVOUS_CORE_STRAGGLER_WATCH_H_

#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

class StragglerWatch {
 public:
  static constexpr double kFactor = 1.2;
  static constexpr int kStrikes = 3;
  static constexpr int64_t kMinSteps = 10;
  static constexpr absl::Duration kFresh = absl::Seconds(10);
  // Bounds of a believable pace (others are ignored).
  static constexpr int64_t kMaxSteps = int64_t{1} << 30;
  static constexpr int64_t kMaxStepUs = int64_t{86'400} * 1'000'000;
  // Named stragglers kept for status.
  static constexpr size_t kMaxNamed = 32;

  // A new round: its ranks start afresh (they may be other processes).
  void NewRound() { ranks_.clear(); }
  // `pace` of a rank run by node `node` ("host:pid"); the straggler to name
  // when this makes one.
  std::optional<v1::Straggler> Observe(const v1::RankPace& pace,
                                       const std::string& node, absl::Time now);
  // Those named so far, newest last.
  const std::deque<v1::Straggler>& named() const { return named_; }

 private:
  struct Rank {
    std::string node;
    int64_t mean_step_us = 0;
    bool sections = false;
    absl::Time at;
    int strikes = 0;
    int64_t slow_steps = 0;
    bool named = false;
  };
  std::map<int32_t, Rank> ranks_;
  std::deque<v1::Straggler> named_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_STRAGGLER_WATCH_H_
