#include "launcher/policy/file_timers.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace ctrun {

absl::StatusOr<FileTimerRequest> ParseFileTimerRequest(absl::string_view line) {
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(std::string(line), &root)
           .ok()) {
    return absl::InvalidArgumentError("not a JSON object");
  }
  const auto& f = root.fields();
  auto number = [&](const char* name) -> absl::StatusOr<double> {
    auto it = f.find(name);
    if (it == f.end() || !it->second.has_number_value() ||
        !std::isfinite(it->second.number_value())) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" is missing or not a number"));
    }
    return it->second.number_value();
  };
  FileTimerRequest r;
  auto version = number("version");
  if (!version.ok()) return version.status();
  if (*version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("version ", *version, " (only 1 is known)"));
  }
  auto pid = number("pid");
  if (!pid.ok()) return pid.status();
  if (*pid < 1 || *pid > 4194304) {
    return absl::InvalidArgumentError(absl::StrCat("pid ", *pid));
  }
  r.pid = static_cast<pid_t>(*pid);
  auto scope = f.find("scope_id");
  if (scope == f.end() || !scope->second.has_string_value()) {
    return absl::InvalidArgumentError("\"scope_id\" is missing");
  }
  r.scope = scope->second.string_value();
  auto expiration = number("expiration_time");
  if (!expiration.ok()) return expiration.status();
  r.expiration_time = *expiration;
  auto signal = number("signal");
  if (!signal.ok()) return signal.status();
  if (*signal > 64) {
    return absl::InvalidArgumentError(absl::StrCat("signal ", *signal));
  }
  r.signal = static_cast<int>(*signal);
  return r;
}

absl::Status FileTimers::Apply(const FileTimerRequest& r, absl::Time now,
                               absl::Time wall_now) {
  const auto key = std::make_pair(r.pid, r.scope);
  if (r.expiration_time < 0) {
    timers_.erase(key);
    return absl::OkStatus();
  }
  if (!timers_.contains(key) && timers_.size() >= kMaxTimers) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kMaxTimers, " file timers are held already"));
  }
  const absl::Duration left =
      absl::Seconds(r.expiration_time) - (wall_now - absl::UnixEpoch());
  timers_[key] = Timer{now + left, r.signal};
  return absl::OkStatus();
}

std::vector<FileTimers::Expired> FileTimers::TakeExpired(absl::Time now) {
  // Per process, the earliest expired timer that has a signal.
  std::map<pid_t, std::pair<absl::Time, Expired>> first;
  for (auto it = timers_.begin(); it != timers_.end();) {
    const auto& [key, timer] = *it;
    if (timer.expires > now) {
      ++it;
      continue;
    }
    if (timer.signal > 0) {
      auto [f, added] =
          first.try_emplace(key.first, timer.expires,
                            Expired{key.first, key.second, timer.signal});
      if (!added && timer.expires < f->second.first) {
        f->second = {timer.expires,
                     Expired{key.first, key.second, timer.signal}};
      }
    }
    it = timers_.erase(it);
  }
  std::vector<Expired> expired;
  for (auto& [pid, f] : first) {
    expired.push_back(std::move(f.second));
    for (auto it = timers_.lower_bound({pid, std::string()});
         it != timers_.end() && it->first.first == pid;) {
      it = timers_.erase(it);
    }
  }
  return expired;
}

absl::Time FileTimers::NextExpiry() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [key, timer] : timers_) next = std::min(next, timer.expires);
  return next;
}

}  // namespace ctrun
