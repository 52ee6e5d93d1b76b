#include "launcher/command_line.h"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "ctrun/environment.h"
#include "launcher/slurm.h"
#include "rendezvous/endpoint.h"
#include "rendezvous/job_settings.h"

namespace ctrun {
namespace {

enum class Kind { kValue, kBool };

// One flag: how it is spelled, parsed, documented and defaulted. The table
// below drives parsing, PET_* overrides, --help and --dry_run alike.
struct FlagSpec {
  const char* name;  // canonical spelling without dashes, e.g. nproc_per_node
  char short_name;   // 'r' for -r, or 0
  Kind kind;
  const char* value;  // default, as text
  const char* metavar;
  const char* help;
  // Set for torchrun flags that ctrun accepts but has no use for: why.
  const char* no_effect = nullptr;
};

constexpr char kDefaultSignals[] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
constexpr char kDefaultPrefix[] = "[${host}:${rank}]: ";

const std::vector<FlagSpec>& Flags() {
  static const std::vector<FlagSpec> flags = {
      {"nnodes", 0, Kind::kValue, "1:1", "N|MIN:MAX",
       "number of nodes, or the range an elastic job may use"},
      {"nproc_per_node", 0, Kind::kValue, "1", "N|gpu|cpu|auto",
       "workers on this node: a count, one per visible GPU, one per CPU, or "
       "GPUs if any else CPUs"},
      {"rdzv_backend", 0, Kind::kValue, "static", "static|c10d|ctrun",
       "rendezvous backend"},
      {"rdzv_endpoint", 0, Kind::kValue, "", "HOST[:PORT]",
       "where the rendezvous is served (default port 29400)"},
      {"rdzv_id", 0, Kind::kValue, "none", "ID",
       "the job's id, the same on all its nodes (one node: a fresh one when "
       "none)"},
      {"rdzv_conf", 0, Kind::kValue, "", "KEY=VALUE,...",
       "join_timeout, last_call_timeout, heartbeat_timeout, "
       "keep_alive_interval, reconnect_timeout (seconds); is_host=0|1; "
       "token_file, tls_ca, "
       "tls_cert, tls_key (paths)"},
      {"standalone", 0, Kind::kBool, "0", "",
       "one node: host the rendezvous in this process on a free loopback "
       "port with a fresh token"},
      {"max_restarts", 0, Kind::kValue, "0", "N",
       "restarts of all workers allowed after worker failures"},
      {"monitor_interval", 0, Kind::kValue, "0.1", "SECONDS",
       "accepted for torchrun compatibility",
       "ctrun reacts to worker exits at once, without polling"},
      {"start_method", 0, Kind::kValue, "spawn", "spawn|fork|forkserver",
       "accepted for torchrun compatibility",
       "workers are always separate processes started with exec, like "
       "torchrun's spawn"},
      {"role", 0, Kind::kValue, "default", "NAME", "the workers' ROLE_NAME"},
      {"module", 'm', Kind::kBool, "0", "",
       "run ENTRYPOINT as a Python module (python -m)"},
      {"no_python", 0, Kind::kBool, "0", "",
       "execute ENTRYPOINT directly, even if it ends in .py"},
      {"run_path", 0, Kind::kBool, "0", "",
       "accepted for torchrun compatibility",
       "ctrun has no interpreter of its own: the script runs under Python "
       "as usual"},
      {"log_dir", 0, Kind::kValue, "", "DIR",
       "keep each worker's stdout, stderr and error file under "
       "DIR/RUN_ID/attempt_N/LOCAL_RANK/"},
      {"redirects", 'r', Kind::kValue, "0", "STD|LR:STD,...",
       "send workers' streams to log files only: 1 stdout, 2 stderr, 3 both"},
      {"tee", 't', Kind::kValue, "0", "STD|LR:STD,...",
       "copy workers' streams to log files as well as the console"},
      {"local_ranks_filter", 0, Kind::kValue, "", "LR,...",
       "show only these local ranks' output on the console"},
      {"node_rank", 0, Kind::kValue, "0", "N",
       "this node's rank (static rendezvous)"},
      {"master_addr", 0, Kind::kValue, "127.0.0.1", "HOST",
       "MASTER_ADDR for a static rendezvous"},
      {"master_port", 0, Kind::kValue, "", "PORT",
       "fix MASTER_PORT (default: a port free on group rank 0's node; "
       "torchrun's is 29500)"},
      {"local_addr", 0, Kind::kValue, "", "ADDR",
       "the address other nodes reach this one by"},
      {"logs_specs", 0, Kind::kValue, "", "NAME",
       "accepted for torchrun compatibility",
       "log layout plugins are Python classes; use --log_dir"},
      {"numa_binding", 0, Kind::kValue, "", "POLICY",
       "accepted for torchrun compatibility",
       "NUMA binding is not implemented; bind with numactl in the "
       "entrypoint"},
      {"signals_to_handle", 0, Kind::kValue, kDefaultSignals, "SIG,...",
       "signals forwarded to the workers before ctrun stops; SIGUSR1 and "
       "SIGUSR2 are always forwarded"},
      {"shutdown_timeout", 0, Kind::kValue, "30", "SECONDS",
       "how long stopped workers get before SIGKILL"},
      {"log_line_prefix_template", 0, Kind::kValue, kDefaultPrefix, "TEMPLATE",
       "prefix of every worker line: ${host} ${rank} ${local_rank} "
       "${group_rank} ${role_name}; empty for none"},
      {"dry_run", 0, Kind::kBool, "0", "",
       "print the launch plan with each value's source, start nothing"},
  };
  return flags;
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const auto& f : Flags()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}
const FlagSpec* FindShortFlag(char c) {
  for (const auto& f : Flags()) {
    if (f.short_name == c) return &f;
  }
  return nullptr;
}

std::string PetName(const FlagSpec& f) {
  return absl::StrCat(env::kPetPrefix, absl::AsciiStrToUpper(f.name));
}

struct RawValue {
  std::string text;
  Source source = Source::kDefault;
};

// How to name a value in an error: as the user wrote it.
std::string Origin(const FlagSpec& f, const RawValue& v) {
  if (v.source == Source::kEnv) return absl::StrCat(PetName(f), "=", v.text);
  return absl::StrCat("--", f.name, "=", v.text);
}

absl::Status Bad(const FlagSpec& f, const RawValue& v, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(Origin(f, v), ": ", why));
}

std::optional<int> ToInt(absl::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

std::optional<bool> ToBool(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "1" || t == "true" || t == "yes") return true;
  if (t == "0" || t == "false" || t == "no" || t.empty()) return false;
  return std::nullopt;
}

std::optional<absl::Duration> ToSeconds(absl::string_view text) {
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || seconds < 0 || seconds > 1e7) {
    return std::nullopt;
  }
  return absl::Seconds(seconds);
}

int SignalNumber(absl::string_view name) {
  std::string n = absl::AsciiStrToUpper(name);
  if (!absl::StartsWith(n, "SIG")) n = "SIG" + n;
  static const std::map<std::string, int> kSignals = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
      {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
      {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ}, {"SIGALRM", SIGALRM},
      {"SIGPWR", SIGPWR},
  };
  auto it = kSignals.find(n);
  return it == kSignals.end() ? 0 : it->second;
}

std::string GenerateRunId() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd());
  return absl::StrCat("ctrun-", absl::Hex(rng(), absl::kZeroPad16));
}

const std::set<std::string>& RdzvConfKeys() {
  static const std::set<std::string> keys = {
      "join_timeout",
      "last_call_timeout",
      "close_timeout",
      "heartbeat_timeout",
      "keep_alive_interval",
      "keep_alive_max_attempt",
      "read_timeout",
      "reconnect_timeout",
      "timeout",
      "is_host",
      "token_file",
      "tls_ca",
      "tls_cert",
      "tls_key",
      "store_type",
      "use_libuv",
  };
  return keys;
}

// Splits the command line into flag values and the entrypoint with its
// arguments.
struct Split {
  std::map<std::string, RawValue> values;
  bool help = false;
  bool version = false;
  std::string entrypoint;
  std::vector<std::string> script_args;
  bool has_entrypoint = false;
};

absl::StatusOr<Split> SplitArgs(const std::vector<std::string>& args) {
  Split split;
  size_t i = 0;
  auto set = [&](const FlagSpec& f, std::string value) {
    split.values[f.name] = RawValue{std::move(value), Source::kFlag};
  };
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      split.help = true;
      continue;
    }
    if (a == "--version") {
      split.version = true;
      continue;
    }
    if (absl::StartsWith(a, "--")) {
      const size_t eq = a.find('=');
      const std::string name = absl::StrReplaceAll(
          a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2),
          {{"-", "_"}});
      const FlagSpec* f = FindFlag(name);
      if (f == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown flag '", a.substr(0, eq),
            "'; see ctrun --help (script flags go after the entrypoint)"));
      }
      if (f->kind == Kind::kBool) {
        if (eq != std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", f->name, " takes no value, got '", a, "'"));
        }
        set(*f, "1");
      } else if (eq != std::string::npos) {
        set(*f, a.substr(eq + 1));
      } else if (i + 1 < args.size()) {
        set(*f, args[++i]);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", f->name, " needs a value (", f->metavar, ")"));
      }
      continue;
    }
    if (a.size() >= 2 && a[0] == '-') {
      const FlagSpec* f = FindShortFlag(a[1]);
      if (f == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag '", a, "'; see ctrun --help"));
      }
      if (f->kind == Kind::kBool) {
        if (a.size() > 2) {
          return absl::InvalidArgumentError(
              absl::StrCat("-", std::string(1, f->short_name),
                           " takes no value, got '", a, "'"));
        }
        set(*f, "1");
      } else if (a.size() > 2) {
        set(*f, a.substr(a[2] == '=' ? 3 : 2));
      } else if (i + 1 < args.size()) {
        set(*f, args[++i]);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("-", std::string(1, f->short_name), " needs a value (",
                         f->metavar, ")"));
      }
      continue;
    }
    break;  // the entrypoint
  }
  if (i < args.size()) {
    split.has_entrypoint = true;
    split.entrypoint = args[i];
    split.script_args.assign(args.begin() + i + 1, args.end());
  }
  return split;
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(
    const std::vector<std::string>& args, const EnvMap& env,
    const HostFacts& host) {
  auto split = SplitArgs(args);
  if (!split.ok()) return split.status();
  CommandLine result;
  if (split->help) {
    result.action = CommandLine::Action::kHelp;
    return result;
  }
  if (split->version) {
    result.action = CommandLine::Action::kVersion;
    return result;
  }

  // Flag > PET_* > default.
  std::map<std::string, RawValue> raw;
  for (const auto& f : Flags()) {
    RawValue v{f.value, Source::kDefault};
    if (auto it = env.find(PetName(f)); it != env.end()) {
      v = RawValue{it->second, Source::kEnv};
    }
    if (auto it = split->values.find(f.name); it != split->values.end()) {
      v = it->second;
    }
    raw[f.name] = v;
  }
  // Slurm fills what flags and PET_* left at their defaults.
  auto slurm = ReadSlurmFacts(env);
  if (!slurm.ok()) return slurm.status();
  bool slurm_rendezvous = false;
  bool parent_signals_workers = false;
  if (*slurm) {
    const SlurmFacts& f = **slurm;
    auto fill = [&](const char* name, std::string value) {
      if (raw[name].source == Source::kDefault) {
        raw[name] = RawValue{std::move(value), Source::kSlurm};
      }
    };
    fill("rdzv_id",
         absl::StrCat("slurm-", f.job_id, f.in_step() ? "." + f.step_id : ""));
    // Explicit rendezvous flags always win, as a whole.
    bool explicit_rendezvous = false;
    for (const char* name :
         {"standalone", "rdzv_endpoint", "rdzv_backend", "master_addr"}) {
      explicit_rendezvous |= raw[name].source != Source::kDefault;
    }
    if (f.num_nodes > 1 && !explicit_rendezvous) {
      if (!f.in_step()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "this is the batch step of a ", f.num_nodes,
            "-node Slurm allocation, which runs on its first node only; "
            "start one ctrun per node: srun --ntasks-per-node=1 ctrun ",
            absl::StrJoin(args, " ")));
      }
      slurm_rendezvous = true;
      fill("nnodes", absl::StrCat(f.num_nodes));
      // Group ranks follow Slurm's node order, not the order of arrival.
      fill("node_rank", absl::StrCat(f.node_id));
      fill("rdzv_backend", "c10d");
      fill("rdzv_endpoint",
           absl::StrCat(f.nodes.front(), ":", SlurmRendezvousPort(f.job_id)));
    }
  }
  if (*slurm && (*slurm)->in_step()) {
    parent_signals_workers = SlurmSignalsWholeStep(env);
  }
  HostFacts host_facts = host;
  if (*slurm && host.gpu_count == 0 && (*slurm)->gpus_on_node > 0) {
    host_facts.gpu_count = (*slurm)->gpus_on_node;
    host_facts.gpu_source = "SLURM_GPUS_ON_NODE";
  }

  if (raw["log_line_prefix_template"].source == Source::kDefault) {
    if (auto it = env.find(env::kLogLinePrefixTemplate); it != env.end()) {
      raw["log_line_prefix_template"] = RawValue{it->second, Source::kEnv};
    }
  }

  LaunchOptions& o = result.options;
  auto spec = [](const char* name) -> const FlagSpec& {
    return *FindFlag(name);
  };
  auto boolean = [&](const char* name, bool* out) -> absl::Status {
    auto b = ToBool(raw[name].text);
    if (!b) return Bad(spec(name), raw[name], "expected 0 or 1");
    *out = *b;
    return absl::OkStatus();
  };
  auto integer = [&](const char* name, int lo, int hi,
                     int* out) -> absl::Status {
    auto n = ToInt(raw[name].text);
    if (!n || *n < lo || *n > hi) {
      return Bad(spec(name), raw[name],
                 absl::StrCat("expected an integer in ", lo, "..", hi));
    }
    *out = *n;
    return absl::OkStatus();
  };
  auto seconds = [&](const char* name, absl::Duration* out) -> absl::Status {
    auto d = ToSeconds(raw[name].text);
    if (!d) return Bad(spec(name), raw[name], "expected seconds >= 0");
    *out = *d;
    return absl::OkStatus();
  };
#define CTRUN_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    if (absl::Status s = (expr); !s.ok()) return s; \
  } while (0)

  // Nodes.
  {
    const auto& v = raw["nnodes"];
    std::vector<std::string> parts = absl::StrSplit(v.text, ':');
    std::optional<int> lo, hi;
    if (parts.size() == 1) lo = hi = ToInt(parts[0]);
    if (parts.size() == 2) {
      lo = ToInt(parts[0]);
      hi = ToInt(parts[1]);
    }
    if (!lo || !hi || *lo < 1 || *hi > 65536) {
      return Bad(spec("nnodes"), v,
                 "expected N or MIN:MAX with 1 <= MIN <= MAX <= 65536");
    }
    if (*lo > *hi) {
      return Bad(spec("nnodes"), v,
                 "MIN exceeds MAX; expected N or MIN:MAX with MIN <= MAX");
    }
    o.min_nodes = *lo;
    o.max_nodes = *hi;
  }
  {
    const auto& v = raw["nproc_per_node"];
    const std::string t = absl::AsciiStrToLower(v.text);
    if (t == "gpu") {
      if (host_facts.gpu_count == 0) {
        return Bad(spec("nproc_per_node"), v,
                   absl::StrCat("no GPU is visible (", host_facts.gpu_source,
                                "); use a count, cpu or auto"));
      }
      o.local_world_size = host_facts.gpu_count;
    } else if (t == "cpu") {
      o.local_world_size = host_facts.cpu_count;
    } else if (t == "auto") {
      o.local_world_size = host_facts.gpu_count > 0 ? host_facts.gpu_count
                                                    : host_facts.cpu_count;
    } else {
      auto n = ToInt(t);
      if (!n || *n < 1 || *n > 65536) {
        return Bad(spec("nproc_per_node"), v,
                   "expected a count in 1..65536, gpu, cpu or auto");
      }
      o.local_world_size = *n;
    }
  }

  // Rendezvous.
  CTRUN_RETURN_IF_ERROR(boolean("standalone", &o.standalone));
  {
    const auto& v = raw["rdzv_backend"];
    const std::string b = absl::AsciiStrToLower(v.text);
    if (b != "static" && b != "c10d" && b != "ctrun") {
      return Bad(spec("rdzv_backend"), v,
                 "expected static, c10d or ctrun (etcd is not supported: "
                 "serve the rendezvous with ctrund or an agent)");
    }
    o.rdzv_backend = b == "ctrun" ? "c10d" : b;
  }
  {
    const auto& v = raw["rdzv_endpoint"];
    if (!v.text.empty()) {
      auto ep = ParseEndpoint(v.text, 29400);
      if (!ep.ok()) {
        return Bad(spec("rdzv_endpoint"), v, ep.status().message());
      }
      o.rdzv_endpoint = ep->ToString();
    }
  }
  {
    const auto& v = raw["rdzv_id"];
    if (auto s = CheckJobId(v.text); !s.ok()) {
      return Bad(spec("rdzv_id"), v, s.message());
    }
    // "none" (torchrun's default) is fine for one node, which gets a
    // fresh id; nodes of one job must agree on it, so for several nodes it
    // stays "none" unless the static master names the job.
    o.run_id = v.text;
    if (v.text == "none") {
      const auto& nnodes = raw["nnodes"].text;
      const bool one_node = nnodes == "1" || nnodes == "1:1";
      if (one_node || raw["standalone"].text == "1") {
        o.run_id = GenerateRunId();
        raw["rdzv_id"] = RawValue{o.run_id, Source::kDerived};
      }
    }
  }
  {
    const auto& v = raw["rdzv_conf"];
    for (absl::string_view item :
         absl::StrSplit(v.text, ',', absl::SkipWhitespace())) {
      const size_t eq = item.find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return Bad(spec("rdzv_conf"), v,
                   absl::StrCat("'", item, "' is not KEY=VALUE"));
      }
      std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
      std::string value(absl::StripAsciiWhitespace(item.substr(eq + 1)));
      if (!RdzvConfKeys().contains(key)) {
        return Bad(spec("rdzv_conf"), v,
                   absl::StrCat("unknown key '", key, "'; known keys: ",
                                absl::StrJoin(RdzvConfKeys(), ", ")));
      }
      o.rdzv_conf[key] = value;
    }
    struct TimeKey {
      const char* key;
      absl::Duration* out;
    };
    for (const TimeKey& t :
         {TimeKey{"join_timeout", &o.join_timeout},
          TimeKey{"last_call_timeout", &o.last_call_timeout},
          TimeKey{"heartbeat_timeout", &o.heartbeat_timeout},
          TimeKey{"keep_alive_interval", &o.keep_alive_interval},
          TimeKey{"reconnect_timeout", &o.reconnect_timeout}}) {
      auto it = o.rdzv_conf.find(t.key);
      if (it == o.rdzv_conf.end()) continue;
      auto d = ToSeconds(it->second);
      if (!d || *d <= absl::ZeroDuration()) {
        return Bad(spec("rdzv_conf"), v,
                   absl::StrCat(t.key, "=", it->second,
                                " is not a number of seconds > 0"));
      }
      *t.out = *d;
    }
    if (o.keep_alive_interval * 2 > o.heartbeat_timeout) {
      return Bad(spec("rdzv_conf"), v,
                 "keep_alive_interval must be at most half of "
                 "heartbeat_timeout");
    }
  }
  CTRUN_RETURN_IF_ERROR(integer("node_rank", 0, 65535, &o.node_rank));
  o.master_addr = raw["master_addr"].text;
  if (o.master_addr.empty()) {
    return Bad(spec("master_addr"), raw["master_addr"], "must not be empty");
  }
  if (auto s = ValidateHost(o.master_addr); !s.ok()) {
    return Bad(spec("master_addr"), raw["master_addr"], s.message());
  }
  if (!raw["master_port"].text.empty()) {
    CTRUN_RETURN_IF_ERROR(integer("master_port", 1, 65535, &o.master_port));
  }
  o.local_addr = raw["local_addr"].text;
  if (!o.local_addr.empty()) {  // torchrun takes an empty one as none
    if (auto s = ValidateHost(o.local_addr); !s.ok()) {
      return Bad(spec("local_addr"), raw["local_addr"], s.message());
    }
  }

  // Job and workers.
  CTRUN_RETURN_IF_ERROR(integer("max_restarts", 0, 1'000'000, &o.max_restarts));
  {
    absl::Duration unused;
    CTRUN_RETURN_IF_ERROR(seconds("monitor_interval", &unused));
    const auto& v = raw["start_method"];
    if (v.text != "spawn" && v.text != "fork" && v.text != "forkserver") {
      return Bad(spec("start_method"), v, "expected spawn, fork or forkserver");
    }
  }
  o.role = raw["role"].text;
  if (o.role.empty())
    return Bad(spec("role"), raw["role"], "must not be empty");
  CTRUN_RETURN_IF_ERROR(boolean("module", &o.module));
  CTRUN_RETURN_IF_ERROR(boolean("no_python", &o.no_python));
  {
    bool run_path = false;
    CTRUN_RETURN_IF_ERROR(boolean("run_path", &run_path));
  }
  if (o.module && o.no_python) {
    return absl::InvalidArgumentError(
        "-m/--module and --no_python cannot be combined: a module needs "
        "Python");
  }
  {
    const auto& v = raw["signals_to_handle"];
    for (absl::string_view name :
         absl::StrSplit(v.text, ',', absl::SkipWhitespace())) {
      const int sig = SignalNumber(absl::StripAsciiWhitespace(name));
      if (sig == 0) {
        return Bad(spec("signals_to_handle"), v,
                   absl::StrCat("unknown signal '", name,
                                "'; expected names like SIGTERM,SIGINT"));
      }
      o.signals_to_handle.push_back(sig);
    }
  }
  CTRUN_RETURN_IF_ERROR(seconds("shutdown_timeout", &o.shutdown_timeout));

  // Output.
  o.log_dir = raw["log_dir"].text;
  for (const char* name : {"redirects", "tee"}) {
    auto sel = ParseStreamSelection(raw[name].text);
    if (!sel.ok()) return Bad(spec(name), raw[name], sel.status().message());
    (std::string(name) == "tee" ? o.tee : o.redirects) = *sel;
  }
  {
    const auto& v = raw["local_ranks_filter"];
    if (!v.text.empty()) {
      std::vector<int> ranks;
      for (absl::string_view r :
           absl::StrSplit(v.text, ',', absl::SkipWhitespace())) {
        auto n = ToInt(absl::StripAsciiWhitespace(r));
        if (!n || *n < 0 || *n >= o.local_world_size) {
          return Bad(spec("local_ranks_filter"), v,
                     absl::StrCat("expected local ranks in 0..",
                                  o.local_world_size - 1, ", comma-separated"));
        }
        ranks.push_back(*n);
      }
      o.local_ranks_filter = ranks;
    }
  }
  o.log_line_prefix_template = raw["log_line_prefix_template"].text;
  CTRUN_RETURN_IF_ERROR(boolean("dry_run", &o.dry_run));
#undef CTRUN_RETURN_IF_ERROR

  // Across flags.
  if (o.standalone) {
    if (o.max_nodes > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--standalone runs one node, but --nnodes=", raw["nnodes"].text,
          " asks for more; give --rdzv_endpoint=HOST:PORT for a multi-node "
          "job"));
    }
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint.clear();
  }
  if (auto it = o.rdzv_conf.find("is_host"); it != o.rdzv_conf.end()) {
    auto b = ToBool(it->second);
    if (!b) {
      return Bad(spec("rdzv_conf"), raw["rdzv_conf"],
                 absl::StrCat("is_host=", it->second, " is not 0 or 1"));
    }
    o.is_host = *b;
  }
  for (auto [key, out] :
       {std::pair{"token_file", &o.token_file}, std::pair{"tls_ca", &o.tls_ca},
        std::pair{"tls_cert", &o.tls_cert}, std::pair{"tls_key", &o.tls_key}}) {
    if (auto it = o.rdzv_conf.find(key); it != o.rdzv_conf.end()) {
      *out = it->second;
    }
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Bad(spec("rdzv_conf"), raw["rdzv_conf"],
               "tls_cert and tls_key go together");
  }
  if (slurm_rendezvous && !o.is_host) {
    // Slurm's own node identity decides, not IP matching (nodes may share
    // an address, or have several).
    o.is_host = (*slurm)->node_id == 0;
  }
  const auto env_token = env.find(env::kRendezvousToken);
  if (slurm_rendezvous && o.token_file.empty() &&
      (env_token == env.end() || env_token->second.empty())) {
    // Slurm's own authentication: nothing for the user to set up, no
    // secret to hand around.
    o.munge_auth = true;
    o.munge_socket = MungeSocketFor(env);
  }
  o.parent_signals_workers = parent_signals_workers;
  const bool static_multi_node = o.rdzv_backend == "static" && o.max_nodes > 1;
  if (static_multi_node) {
    // Every node knows the master from its flags; node 0 hosts the
    // rendezvous one port above MASTER_PORT, which stays the workers'.
    if (o.min_nodes != o.max_nodes) {
      return Bad(spec("nnodes"), raw["nnodes"],
                 "a static rendezvous needs a fixed node count; use "
                 "--rdzv_backend=c10d for MIN:MAX");
    }
    if (o.master_port == 0) o.master_port = 29500;  // torchrun's default
    if (o.master_port == 65535) {
      return Bad(spec("master_port"), raw["master_port"],
                 "a static rendezvous uses MASTER_PORT+1; use a lower port");
    }
    if (o.rdzv_endpoint.empty()) {
      auto ep = ParseEndpoint(o.master_addr, o.master_port + 1);
      if (!ep.ok()) {
        return Bad(spec("master_addr"), raw["master_addr"],
                   ep.status().message());
      }
      ep->port = o.master_port + 1;
      o.rdzv_endpoint = ep->ToString();
    }
    if (!o.is_host) o.is_host = o.node_rank == 0;
    if (o.run_id == "none") {
      o.run_id = absl::StrCat("static-", o.rdzv_endpoint);
      raw["rdzv_id"] = RawValue{o.run_id, Source::kDerived};
    }
  } else {
    // torchrun's c10d ignores --node_rank; ranks come from the rendezvous,
    // which orders nodes by the hint that Slurm's node id gives.
    if (raw["node_rank"].source != Source::kSlurm) o.node_rank = -1;
    if (o.max_nodes > 1 && o.rdzv_endpoint.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nnodes=", raw["nnodes"].text,
          " needs --rdzv_endpoint=HOST:PORT (a ctrund, or the node that "
          "hosts the rendezvous)"));
    }
    if (o.max_nodes == 1 && raw["master_addr"].source != Source::kDefault &&
        o.local_addr.empty()) {
      // A single node is its own master: MASTER_ADDR is the address given.
      o.local_addr = o.master_addr;
      raw["local_addr"] = RawValue{o.local_addr, Source::kDerived};
    }
  }
  if (!split->has_entrypoint) {
    return absl::InvalidArgumentError(
        "missing the program to run: ctrun [FLAGS] ENTRYPOINT [ARGS...] "
        "(see ctrun --help)");
  }
  o.entrypoint = split->entrypoint;
  o.script_args = split->script_args;

  for (const auto& f : Flags()) {
    const RawValue& v = raw[f.name];
    std::string note;
    if (f.no_effect != nullptr && v.source != Source::kDefault) {
      note = f.no_effect;
      o.notices.push_back(absl::StrCat(Origin(f, v), " has no effect: ", note));
    }
    o.settings.push_back({f.name, v.text, v.source, note});
  }
  if (raw["master_port"].text.empty()) {
    o.settings.push_back({"master_port (resolved)",
                          "a free port on group rank 0's node",
                          Source::kDerived, ""});
  }
  return result;
}

std::string HelpText() {
  std::string out = absl::StrCat(
      "usage: ctrun [FLAGS] ENTRYPOINT [ARGS...]\n"
      "       ctrun --standalone --nproc_per_node=4 train.py --lr 0.1\n\n"
      "Starts ENTRYPOINT once per worker with torchrun's environment (RANK, "
      "LOCAL_RANK,\nWORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). ENTRYPOINT "
      "ending in .py runs with\n$PYTHON_EXEC or python3 -u; -m runs a module; "
      "anything else is executed directly.\nARGS go to the script untouched. "
      "Every flag has a PET_<FLAG> environment override\nand may be spelled "
      "with - or _ (--nproc-per-node).\n\nflags:\n");
  for (const auto& f : Flags()) {
    std::string names = absl::StrCat("--", f.name);
    if (f.short_name != 0) {
      names = absl::StrCat("-", std::string(1, f.short_name), ", ", names);
    }
    if (f.kind == Kind::kValue) absl::StrAppend(&names, " ", f.metavar);
    absl::StrAppend(&out, "  ", names, "\n      ", f.help);
    if (f.kind == Kind::kValue && f.value[0] != '\0') {
      absl::StrAppend(&out, " (default ", f.value, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out,
                  "  -h, --help\n      this text\n"
                  "  --version\n      print the version\n\n"
                  "Exit status: the first failed worker's own (128 + signal "
                  "when killed), 2 for a\nbad command line, 0 when every "
                  "worker succeeded.\n");
  return out;
}

}  // namespace ctrun
