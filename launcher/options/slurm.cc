#include "launcher/options/slurm.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ctrun/environment.h"

namespace ctrun {
namespace {

constexpr size_t kMaxHosts = 1'000'000;

absl::Status Malformed(const std::string& list, size_t at,
                       absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("hostlist '", list.substr(0, 200), "' at character ", at + 1,
                   ": ", why, " (expected e.g. node[01-04,07],gpu-[1-2]-ib)"));
}

// The values of one bracket's body, e.g. "01-04,07", as padded strings.
absl::StatusOr<std::vector<std::string>> ExpandRanges(const std::string& list,
                                                      size_t at,
                                                      absl::string_view body) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(body, ',')) {
    if (part.empty()) return Malformed(list, at, "an empty range");
    const size_t dash = part.find('-');
    absl::string_view lo_text = part.substr(0, dash);
    absl::string_view hi_text =
        dash == absl::string_view::npos ? lo_text : part.substr(dash + 1);
    uint64_t lo = 0, hi = 0;
    auto digits = [](absl::string_view t) {
      return !t.empty() &&
             t.find_first_not_of("0123456789") == absl::string_view::npos;
    };
    if (!digits(lo_text) || !digits(hi_text) ||
        !absl::SimpleAtoi(lo_text, &lo) || !absl::SimpleAtoi(hi_text, &hi)) {
      return Malformed(list, at, absl::StrCat("'", part, "' is not N or N-M"));
    }
    if (hi < lo) {
      return Malformed(list, at,
                       absl::StrCat("range ", part, " runs backwards"));
    }
    if (hi - lo >= kMaxHosts - out.size()) {
      return Malformed(list, at, "too many hosts");
    }
    const size_t width = lo_text.size();
    // Counted from lo: `v <= hi` would never end for hi = 2^64 - 1.
    for (uint64_t n = 0; n <= hi - lo; ++n) {
      std::string s = absl::StrCat(lo + n);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
    }
  }
  return out;
}

// One hostlist item without top-level commas: text and bracket groups.
absl::Status ExpandItem(const std::string& list, size_t start,
                        absl::string_view item,
                        std::vector<std::string>* hosts) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < item.size()) {
    const size_t open = item.find('[', i);
    const size_t close_before = item.find(']', i);
    if (close_before != absl::string_view::npos &&
        (open == absl::string_view::npos || close_before < open)) {
      return Malformed(list, start + close_before, "']' without '['");
    }
    const absl::string_view text =
        item.substr(i, open == absl::string_view::npos ? open : open - i);
    for (auto& p : partial) absl::StrAppend(&p, text);
    if (open == absl::string_view::npos) break;
    const size_t close = item.find(']', open);
    if (close == absl::string_view::npos) {
      return Malformed(list, start + open, "'[' without ']'");
    }
    auto values = ExpandRanges(list, start + open,
                               item.substr(open + 1, close - open - 1));
    if (!values.ok()) return values.status();
    if (partial.size() * values->size() > kMaxHosts) {
      return Malformed(list, start + open, "too many hosts");
    }
    std::vector<std::string> next;
    for (const auto& p : partial) {
      for (const auto& v : *values) next.push_back(p + v);
    }
    partial = std::move(next);
    i = close + 1;
  }
  for (auto& p : partial) {
    if (p.empty()) return Malformed(list, start, "an empty host name");
    hosts->push_back(std::move(p));
  }
  return absl::OkStatus();
}

std::string Get(const EnvMap& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(
    const std::string& list) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Malformed(list, i, "']' without '['");
    if (depth > 1) return Malformed(list, i, "nested '['");
    if (c == ',' && depth == 0) {
      if (i == start) return Malformed(list, i, "an empty host name");
      if (auto s = ExpandItem(list, start,
                              absl::string_view(list).substr(start, i - start),
                              &hosts);
          !s.ok()) {
        return s;
      }
      if (hosts.size() > kMaxHosts) return Malformed(list, i, "too many hosts");
      start = i + 1;
    }
  }
  if (depth != 0) return Malformed(list, list.size(), "'[' without ']'");
  return hosts;
}

absl::StatusOr<std::optional<SlurmFacts>> ReadSlurmFacts(const EnvMap& env) {
  SlurmFacts f;
  f.job_id = Get(env, "SLURM_JOB_ID");
  if (f.job_id.empty()) f.job_id = Get(env, "SLURM_JOBID");
  if (f.job_id.empty()) return std::nullopt;
  f.step_id = Get(env, "SLURM_STEP_ID");
  if (f.step_id.empty()) f.step_id = Get(env, "SLURM_STEPID");
  // Slurm marks the batch script's step with a reserved number.
  if (f.step_id == "4294967294" || f.step_id == "batch") f.step_id.clear();

  auto number = [&](const char* name, int* out) -> absl::Status {
    const std::string v = Get(env, name);
    if (!absl::SimpleAtoi(v, out) || *out < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inside Slurm job ", f.job_id, ", ", name,
          v.empty() ? " is not set" : absl::StrCat("=", v, " is not a number"),
          "; pass --nnodes, --node_rank and --rdzv_endpoint yourself"));
    }
    return absl::OkStatus();
  };
  const char* nodes_var = f.in_step() && env.contains("SLURM_STEP_NUM_NODES")
                              ? "SLURM_STEP_NUM_NODES"
                          : env.contains("SLURM_JOB_NUM_NODES")
                              ? "SLURM_JOB_NUM_NODES"
                              : "SLURM_NNODES";
  if (auto s = number(nodes_var, &f.num_nodes); !s.ok()) return s;
  if (auto s = number("SLURM_NODEID", &f.node_id); !s.ok()) return s;
  const char* list_var = f.in_step() && env.contains("SLURM_STEP_NODELIST")
                             ? "SLURM_STEP_NODELIST"
                             : "SLURM_JOB_NODELIST";
  auto nodes = ExpandHostlist(Get(env, list_var));
  if (!nodes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(list_var, ": ", nodes.status().message()));
  }
  f.nodes = std::move(*nodes);
  if (static_cast<int>(f.nodes.size()) != f.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(list_var, " names ", f.nodes.size(), " nodes but ",
                     nodes_var, "=", f.num_nodes));
  }
  if (f.node_id >= f.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_NODEID=", f.node_id,
                                                   " is not below ", nodes_var,
                                                   "=", f.num_nodes));
  }
  int gpus = 0;
  if (absl::SimpleAtoi(Get(env, "SLURM_GPUS_ON_NODE"), &gpus)) {
    f.gpus_on_node = gpus;
  }
  return f;
}

std::string SlurmConfValue(const EnvMap& env, absl::string_view key) {
  std::string conf = Get(env, "SLURM_CONF");
  if (conf.empty()) conf = "/etc/slurm/slurm.conf";
  // Only a regular file: SLURM_CONF=/dev/zero must not read forever.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(conf, ec)) return "";
  std::ifstream in(conf);
  for (std::string line; std::getline(in, line);) {
    absl::string_view l = line;
    l = l.substr(0, l.find('#'));
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos ||
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(l.substr(0, eq)),
                                key)) {
      continue;
    }
    absl::string_view value = absl::StripAsciiWhitespace(l.substr(eq + 1));
    absl::ConsumePrefix(&value, "\"");
    absl::ConsumeSuffix(&value, "\"");
    return std::string(value);
  }
  return "";
}

std::string MungeSocketFor(const EnvMap& env) {
  if (std::string s = Get(env, env::kMungeSocket); !s.empty()) return s;
  for (absl::string_view option :
       absl::StrSplit(SlurmConfValue(env, "AuthInfo"), ',')) {
    option = absl::StripAsciiWhitespace(option);
    if (absl::ConsumePrefix(&option, "socket=")) return std::string(option);
  }
  return "";
}

bool SlurmSignalsWholeStep(const EnvMap& env) {
  // proctrack/cgroup (the default) and proctrack/linuxproc signal every
  // process of the step; proctrack/pgid only the task's process group.
  return SlurmConfValue(env, "ProctrackType") != "proctrack/pgid";
}

int SlurmRendezvousPort(const std::string& job_id) {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(job_id.substr(0, job_id.find('_')), &id)) {
    id = std::hash<std::string>{}(job_id);
  }
  return 20000 + static_cast<int>(id % 12000);  // 20000..31999
}

}  // namespace ctrun
