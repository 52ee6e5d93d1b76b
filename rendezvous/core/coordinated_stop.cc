#include "rendezvous/core/coordinated_stop.h"

#include <algorithm>

namespace ctrun {

std::optional<v1::StopAt> CoordinatedStop::Ask(int64_t round,
                                               const std::string& reason,
                                               int32_t signal,
                                               absl::Duration hold,
                                               absl::Time now) {
  if (asked_) return std::nullopt;  // one stop per round: the first asks
  asked_ = true;
  deadline_ = now + std::clamp(hold, absl::ZeroDuration(), kMaxHold);
  stop_.set_round(round);
  stop_.set_reason(reason);
  stop_.set_signal(signal);
  return stop_;
}

std::optional<v1::StopAt> CoordinatedStop::Held(uint64_t node, int64_t step,
                                                size_t members) {
  if (!asked_ || decided_) return std::nullopt;
  held_.insert(node);
  step_ = std::max(step_, step);
  if (held_.size() < members) return std::nullopt;
  return Decide();
}

std::optional<v1::StopAt> CoordinatedStop::Tick(absl::Time now) {
  if (!asked_ || decided_ || now < deadline_) return std::nullopt;
  return Decide();
}

v1::StopAt CoordinatedStop::Decide() {
  decided_ = true;
  stop_.set_decided(true);
  stop_.set_step(std::max<int64_t>(step_, 0));
  return stop_;
}

}  // namespace ctrun
