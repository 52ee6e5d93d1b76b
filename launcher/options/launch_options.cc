#include "launcher/options/launch_options.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ctrun {

const char* NumaPolicyName(NumaPolicy policy) {
  switch (policy) {
    case NumaPolicy::kNode:
      return "node";
    case NumaPolicy::kSocket:
      return "socket";
    case NumaPolicy::kExclusive:
      return "exclusive";
    case NumaPolicy::kCoreComplex:
      return "core-complex";
  }
  return "?";
}

absl::StatusOr<NumaPolicy> ParseNumaPolicy(absl::string_view text) {
  if (text == "node") return NumaPolicy::kNode;
  if (text == "socket") return NumaPolicy::kSocket;
  if (text == "exclusive") return NumaPolicy::kExclusive;
  if (text == "core-complex") return NumaPolicy::kCoreComplex;
  return absl::InvalidArgumentError(
      "expected node, socket, exclusive or core-complex");
}

const char* SourceName(Source source) {
  switch (source) {
    case Source::kDefault:
      return "default";
    case Source::kFlag:
      return "flag";
    case Source::kEnv:
      return "PET_* env";
    case Source::kSlurm:
      return "Slurm";
    case Source::kDerived:
      return "derived";
  }
  return "?";
}

int StreamSelection::For(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? all : it->second;
}

absl::StatusOr<StreamSelection> ParseStreamSelection(const std::string& text) {
  const auto bad = absl::InvalidArgumentError(
      "expected 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,... "
      "(e.g. 0:3,1:1)");
  StreamSelection sel;
  int value = 0;
  if (absl::SimpleAtoi(text, &value)) {
    if (value < 0 || value > 3) return bad;
    sel.all = value;
    return sel;
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    int rank = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &rank) ||
        !absl::SimpleAtoi(kv[1], &value) || rank < 0 || value < 0 ||
        value > 3) {
      return bad;
    }
    sel.per_rank[rank] = value;
  }
  return sel;
}

std::string FormatLaunchPlan(const LaunchOptions& options,
                             const std::vector<std::string>& worker_argv) {
  std::string out = "ctrun launch plan (nothing started):\n";
  for (const auto& s : options.settings) {
    absl::StrAppendFormat(&out, "  %-26s %-36s %s%s\n", s.name,
                          s.value.empty() ? "(empty)" : s.value,
                          SourceName(s.source),
                          s.note.empty() ? "" : absl::StrCat("; ", s.note));
  }
  absl::StrAppend(&out, "  workers: ", options.local_world_size, " x ",
                  absl::StrJoin(worker_argv, " "), "\n");
  // What a launch would say first, said here too.
  for (const std::string& notice : options.notices) {
    absl::StrAppend(&out, "  note: ", notice, "\n");
  }
  return out;
}

absl::StatusOr<HangTimeout> HangTimeout::Parse(const std::string& text) {
  HangTimeout t;
  if (text.empty() || text == "off" || text == "0") return t;
  if (text == "auto") {
    t.mode = Mode::kAuto;
    return t;
  }
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 1e7) {
    return absl::InvalidArgumentError(
        "expected seconds > 0, auto (learned from the job's own steps) or "
        "off");
  }
  t.mode = Mode::kFixed;
  t.fixed = absl::Seconds(seconds);
  return t;
}

std::string HangTimeout::ToString() const {
  switch (mode) {
    case Mode::kOff:
      return "off";
    case Mode::kAuto:
      return "auto";
    case Mode::kFixed:
      return absl::FormatDuration(fixed);
  }
  return "off";
}

}  // namespace ctrun
