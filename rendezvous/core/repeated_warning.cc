#include "rendezvous/core/repeated_warning.h"

#include "absl/strings/str_cat.h"

namespace ctrun {

std::optional<std::string> RepeatedWarning::Failed(absl::string_view what,
                                                   absl::Time now) {
  ++failures_;
  if (failures_ == 1) {
    said_at_ = now;
    unsaid_ = 0;
    return std::string(what);
  }
  ++unsaid_;
  if (now - said_at_ < every_) return std::nullopt;
  std::string line = absl::StrCat(what, " (", unsaid_, " more failures in ",
                                  absl::FormatDuration(now - said_at_), ")");
  said_at_ = now;
  unsaid_ = 0;
  return line;
}

std::optional<std::string> RepeatedWarning::Succeeded(
    absl::string_view what_works) {
  const int64_t failures = failures_;
  failures_ = unsaid_ = 0;
  if (failures == 0) return std::nullopt;
  return absl::StrCat(what_works, " again, after ", failures,
                      failures == 1 ? " failure" : " failures");
}

}  // namespace ctrun
