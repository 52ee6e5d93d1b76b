#include "rendezvous/core/straggler_watch.h"

#include <algorithm>
#include <vector>

namespace ctrun {

std::optional<v1::Straggler> StragglerWatch::Observe(const v1::RankPace& pace,
                                                     const std::string& node,
                                                     absl::Time now) {
  // A pace is a mean over a few seconds: more steps than this, or a step
  // longer than a day, is not one.
  if (pace.steps() <= 0 || pace.steps() > kMaxSteps ||
      pace.mean_step_us() <= 0 || pace.mean_step_us() > kMaxStepUs) {
    return std::nullopt;
  }
  Rank& r = ranks_[pace.rank()];
  r.node = node;
  r.mean_step_us = pace.mean_step_us();
  r.sections = pace.sections();
  r.at = now;
  std::vector<int64_t> others;
  for (const auto& [rank, o] : ranks_) {
    if (rank != pace.rank() && o.sections == r.sections &&
        now - o.at <= kFresh) {
      others.push_back(o.mean_step_us);
    }
  }
  if (others.empty()) return std::nullopt;
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  const double median =
      n % 2 == 1 ? static_cast<double>(others[n / 2])
                 : (static_cast<double>(others[n / 2 - 1]) + others[n / 2]) / 2;
  const double ratio = static_cast<double>(r.mean_step_us) / median;
  if (ratio < kFactor) {
    r.strikes = 0;
    r.slow_steps = 0;
    return std::nullopt;
  }
  ++r.strikes;
  r.slow_steps += pace.steps();
  if (r.named || r.strikes < kStrikes || r.slow_steps < kMinSteps) {
    return std::nullopt;
  }
  r.named = true;
  v1::Straggler s;
  s.set_rank(pace.rank());
  s.set_node(node);
  s.set_ratio(ratio);
  s.set_steps(r.slow_steps);
  s.set_mean_step_us(r.mean_step_us);
  s.set_median_step_us(static_cast<int64_t>(median));
  s.set_sections(r.sections);
  named_.push_back(s);
  if (named_.size() > kMaxNamed) named_.pop_front();
  return s;
}

}  // namespace ctrun
