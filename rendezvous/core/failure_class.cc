#include "rendezvous/core/failure_class.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ctrun {

namespace {

struct ClassInfo {
  v1::FailureClass value;
  const char* name;
  const char* words;
};

constexpr ClassInfo kClasses[] = {
    {v1::USER_ERROR, "user_error", "a user error"},
    {v1::OUT_OF_MEMORY, "oom", "out of memory"},
    {v1::HARDWARE, "hardware", "a hardware or driver fault"},
    {v1::NETWORK, "network", "a communication failure"},
    {v1::HANG, "hang", "a hang"},
    {v1::SIGNAL, "signal", "a signal from outside"},
    {v1::OTHER, "other", "a failure"},
};

const ClassInfo& Info(v1::FailureClass c) {
  for (const ClassInfo& info : kClasses) {
    if (info.value == c) return info;
  }
  return kClasses[std::size(kClasses) - 1];  // other
}

uint32_t Bit(v1::FailureClass c) { return uint32_t{1} << Info(c).value; }

std::string Names() {
  std::vector<std::string> names = {"all", "default"};
  for (const ClassInfo& info : kClasses) names.push_back(info.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

const char* FailureClassName(v1::FailureClass c) { return Info(c).name; }
const char* FailureClassWords(v1::FailureClass c) { return Info(c).words; }

uint32_t RestartOnAll() {
  uint32_t all = 0;
  for (const ClassInfo& info : kClasses) all |= Bit(info.value);
  return all;
}

uint32_t RestartOnDefault() { return RestartOnAll() & ~Bit(v1::USER_ERROR); }

absl::StatusOr<uint32_t> ParseRestartOn(absl::string_view list) {
  uint32_t set = 0;
  for (absl::string_view word : absl::StrSplit(list, ',')) {
    word = absl::StripAsciiWhitespace(word);
    if (word == "all") {
      set |= RestartOnAll();
      continue;
    }
    if (word == "default") {
      set |= RestartOnDefault();
      continue;
    }
    bool known = false;
    for (const ClassInfo& info : kClasses) {
      if (word == info.name) {
        set |= Bit(info.value);
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", word, "' is not a failure class; use a comma-",
                       "separated list of ", Names()));
    }
  }
  return set;
}

std::string FormatRestartOn(uint32_t set) {
  if (set == 0) set = RestartOnDefault();
  if ((set & RestartOnAll()) == RestartOnAll()) return "all";
  if (set == RestartOnDefault()) return "default";
  std::vector<std::string> names;
  for (const ClassInfo& info : kClasses) {
    if (set & Bit(info.value)) names.push_back(info.name);
  }
  return absl::StrJoin(names, ",");
}

bool RestartsOn(uint32_t restart_on, v1::FailureClass c) {
  if (restart_on == 0) restart_on = RestartOnDefault();
  return (restart_on & Bit(c)) != 0;
}

}  // namespace ctrun
