#include "launcher/options/command_line.h"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ctrun/environment.h"
#include "launcher/options/slurm.h"
#include "rendezvous/core/failure_class.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/rpc/endpoint.h"

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

// Every flag, in the order --help lists them.
constexpr FlagSpec kFlags[] = {
    {"nnodes", 0, Kind::kValue, "1:1", "N|MIN:MAX",
     "number of nodes, or the range an elastic job may use"},
    {"nproc_per_node", 0, Kind::kValue, "1", "N|gpu|xpu|cpu|auto",
     "workers on this node: a count, one per visible NVIDIA GPU, one per "
     "Intel GPU, one per CPU, or GPUs if any, else XPUs, else CPUs"},
    {"rdzv_backend", 0, Kind::kValue, "static", "static|c10d|ctrun",
     "rendezvous backend"},
    {"rdzv_endpoint", 0, Kind::kValue, "", "HOST[:PORT][,HOST[:PORT]...]",
     "where the rendezvous is served (default port 29400); a list names "
     "the replicas of a ctrund on etcd, tried in order"},
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
    {"restart_on", 0, Kind::kValue, "default", "CLASS,...",
     "the worker failures that spend a restart: all, or user_error, oom, "
     "hardware, network, hang, signal, other (default: all but "
     "user_error, so that an ImportError or a typo stops the job at once)"},
    {"min_progress_seconds", 0, Kind::kValue, "0", "SECONDS",
     "for workers that send no progress signals: an attempt shorter than "
     "this made no progress (with signals: one without a step made none); "
     "three failed attempts in a row without progress stop the job with "
     "exit code 78, do not requeue (0: only by signals)"},
    {"preemption_grace", 0, Kind::kValue, "25", "SECONDS|off",
     "on SIGTERM, SIGUSR1 or SIGUSR2 to ctrun, when its workers call "
     "ctrun.should_stop(): the whole job agrees on one step at which every "
     "rank's should_stop() returns true, to checkpoint there and exit 0; "
     "after this long without an end the signal acts as without it (off: "
     "at once)"},
    {"health_check", 0, Kind::kValue, "", "CMD",
     "a shell command run before this node joins and before each rejoin, "
     "within 60 s (exit 0: healthy); on a GPU node NVML is asked too (as "
     "many GPUs as workers, no uncorrected ECC errors or pending retired "
     "pages, no other process holding over 1 GiB): a node that fails is "
     "not admitted and says why"},
    {"quarantine_seconds", 0, Kind::kValue, "600", "SECONDS",
     "how long the rendezvous refuses a host whose health check failed, "
     "for every job it serves (ctrund status lists them)"},
    {"spares", 0, Kind::kValue, "0", "K",
     "up to K nodes beyond --nnodes's maximum wait as hot spares, workers "
     "ready (warm Python, or parked in ctrun.wait_for_slot()); a lost "
     "node's rank goes to one of them, so the world and every other rank "
     "stay as they were (in Slurm: srun on N+K nodes)"},
    {"segment", 0, Kind::kValue, "", "LABEL",
     "this node's rack or NVLink domain: a lost node's slot goes to a "
     "spare of its segment when one waits"},
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
    {"run_path", 0, Kind::kBool, "0", "", "accepted for torchrun compatibility",
     "ctrun has no interpreter of its own: the script runs under Python "
     "as usual"},
    {"log_dir", 0, Kind::kValue, "", "DIR",
     "keep each worker's stdout, stderr and error file under "
     "DIR/RUN_ID_XXXXXX/attempt_N/LOCAL_RANK/"},
    {"redirects", 'r', Kind::kValue, "0", "STD|LR:STD,...",
     "send workers' streams to log files only: 1 stdout, 2 stderr, 3 both"},
    {"tee", 't', Kind::kValue, "0", "STD|LR:STD,...",
     "copy workers' streams to log files as well as the console"},
    {"local_ranks_filter", 0, Kind::kValue, "", "LR,...",
     "show only these local ranks' output on the console"},
    {"verbose", 'v', Kind::kBool, "0", "",
     "end the job with a line per rank (wall, peak RSS, GPU) rather than "
     "one per node"},
    {"duplicate_stdout_filters", 0, Kind::kValue, "", "TEXT,...",
     "also write the stdout lines of every local rank that contain one of "
     "these to attempt_N/filtered_stdout.log in the run directory"},
    {"duplicate_stderr_filters", 0, Kind::kValue, "", "TEXT,...",
     "the same for stderr, to attempt_N/filtered_stderr.log"},
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
    {"numa_binding", 0, Kind::kValue, "", "node|socket|exclusive|core-complex",
     "bind each worker to the CPUs near its GPU (LOCAL_RANK): its NUMA "
     "node's (and its memory there), its socket's, a share of the node's "
     "cores, or one core complex"},
    {"event_log_handler", 0, Kind::kValue, "null", "NAME",
     "accepted for torchrun compatibility",
     "torchelastic's event handlers are Python plugins; ctrun writes its "
     "events with --event_log FILE"},
    {"event_log", 0, Kind::kValue, "", "FILE",
     "append this node's events (assignment, each worker's start and exit, "
     "hang, restart, job end), and the rendezvous's when this node hosts "
     "it, to FILE: one JSON object per line (docs/events.md)"},
    {"metrics_listen", 0, Kind::kValue, "", "[HOST:]PORT",
     "when this node hosts the rendezvous, serve its Prometheus metrics at "
     "http://HOST:PORT/metrics (PORT alone: on 127.0.0.1)"},
    {"virtual_local_rank", 0, Kind::kBool, "0", "",
     "give each worker LOCAL_RANK=0 and only its own GPU in "
     "CUDA_VISIBLE_DEVICES"},
    {"signals_to_handle", 0, Kind::kValue, kDefaultSignals, "SIG,...",
     "signals forwarded to the workers before ctrun stops; SIGUSR1 and "
     "SIGUSR2 are always forwarded"},
    {"shutdown_timeout", 0, Kind::kValue, "30", "SECONDS",
     "how long stopped workers get before SIGKILL"},
    {"recovery", 0, Kind::kValue, "restart", "restart|inprocess",
     "what a worker failure or a node change does to the workers that still "
     "run: restart stops them all and starts new ones (torchrun's way); "
     "inprocess keeps those that run under ctrun.resilient, hands them the "
     "new world, and starts processes only for the ranks that lost theirs"},
    {"preload", 0, Kind::kValue, "", "MODULE,...|none",
     "start Python workers warm: one interpreter per node imports these "
     "once and each worker is forked from it (default: torch, when "
     "installed, with --recovery=inprocess or --spares; none otherwise)"},
    {"recovery_timeout", 0, Kind::kValue, "30", "SECONDS",
     "with --recovery=inprocess: how long a kept worker may take to take "
     "the new world before it is killed and started again"},
    {"hang_timeout", 0, Kind::kValue, "off", "SECONDS|auto|off",
     "a worker that sends no progress signal (ctrun.heartbeat(), a "
     "section) for this long is hung: every node collects its workers' "
     "stacks, then the job restarts as after a failure; auto learns it "
     "from the job's own steps"},
    {"hang_warmup", 0, Kind::kValue, "300", "SECONDS",
     "how long a worker may take to its first progress signal (start-up), "
     "and with --hang_timeout=auto to its first steps and in sections not "
     "timed yet"},
    {"hang_evidence_timeout", 0, Kind::kValue, "10", "SECONDS",
     "how long each node spends collecting stacks from a hung job before "
     "stopping it"},
    {"process_group_check", 0, Kind::kValue, "60", "SECONDS|off",
     "this long after the workers of a job of several ranks start, group "
     "rank 0's node says so if they formed no process group (nothing "
     "listens on MASTER_PORT, no worker uses ctrun's store): a script that "
     "never calls init_process_group trains each rank alone"},
    {"worker_tty", 0, Kind::kValue, "auto", "auto|yes|no",
     "give workers a pseudo-terminal for stdout and stderr: auto does for "
     "each stream that only ctrun's terminal shows, as torchrun's workers "
     "write to its terminal"},
    {"log_line_prefix_template", 0, Kind::kValue, kDefaultPrefix, "TEMPLATE",
     "prefix of every worker line: ${host} (the --local_addr given, else "
     "the hostname) ${rank} ${local_rank} ${group_rank} ${role_name}; empty "
     "for none"},
    {"dry_run", 0, Kind::kBool, "0", "",
     "print the launch plan with each value's source, start nothing"},
    {"allow_batch_step", 0, Kind::kBool, "0", "",
     "start a multi-node job in the batch step of a Slurm allocation, "
     "which runs on its first node only: for when the other nodes are "
     "started another way (by default ctrun stops with the srun line)"},
};

absl::Span<const FlagSpec> Flags() { return kFlags; }

// What --help says after the flags: Slurm and the exit status.
constexpr char kHelpEpilogue[] =
    "Inside Slurm (an srun step of an allocation), flags left unset come "
    "from Slurm:\n"
    "the node count and node rank, the run id (slurm-JOB.STEP), the "
    "rendezvous on the\n"
    "step's first node at a port derived from the job id, the GPUs that\n"
    "--nproc_per_node=gpu counts (SLURM_GPUS_ON_NODE, "
    "CUDA_VISIBLE_DEVICES), and\n"
    "munge for authentication; --dry_run shows which. Run from the batch "
    "step of a\n"
    "multi-node allocation, ctrun stops with the srun line to use\n"
    "(--allow_batch_step starts anyway).\n\n"
    "Exit status: the first failed worker's own (128 + signal when "
    "killed); 124 when\n"
    "the job failed because a worker hung; 128 + signal when ctrun itself "
    "was stopped\n"
    "by one; 1 when the rendezvous failed or was lost; 2 for a bad command "
    "line; 0\n"
    "when every worker succeeded.\n";

// Edits (insertions, deletions, substitutions) that turn `a` into `b`.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const auto& f : Flags()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}
// The flag `name` (dashes already turned into underscores) stands for. Like
// torchrun's argparse, an unambiguous prefix of a flag is that flag
// (--nproc is --nproc_per_node). INVALID_ARGUMENT for an ambiguous prefix
// (naming the candidates) or an unknown flag (naming the nearest one).
absl::StatusOr<const FlagSpec*> LookUpFlag(absl::string_view name,
                                           absl::string_view as_given) {
  if (const FlagSpec* exact = FindFlag(name)) return exact;
  std::vector<const FlagSpec*> prefixed;
  for (const auto& f : Flags()) {
    if (!name.empty() && absl::StartsWith(f.name, name)) prefixed.push_back(&f);
  }
  if (prefixed.size() == 1) return prefixed.front();
  if (prefixed.size() > 1) {
    std::vector<std::string> names;
    for (const FlagSpec* f : prefixed)
      names.push_back(absl::StrCat("--", f->name));
    return absl::InvalidArgumentError(absl::StrCat("ambiguous flag '", as_given,
                                                   "': it could be ",
                                                   absl::StrJoin(names, ", ")));
  }
  const FlagSpec* nearest = nullptr;
  size_t best = 3;  // at most two edits away
  for (const auto& f : Flags()) {
    if (const size_t d = EditDistance(name, f.name); d < best) {
      best = d;
      nearest = &f;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown flag '", as_given, "'; ",
      nearest ? absl::StrCat("did you mean --", nearest->name, "? ") : "",
      "see ctrun --help (script flags go after the entrypoint)"));
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
  RawValue(std::string text = "", Source source = Source::kDefault,
           std::string variable = "")
      : text(std::move(text)), source(source), variable(std::move(variable)) {}

  std::string text;
  Source source;
  std::string variable;  // with kEnv: the variable that gave it
};

// How to name a value in an error: as the user wrote it.
std::string Origin(const FlagSpec& f, const RawValue& v) {
  if (v.source == Source::kEnv) return absl::StrCat(v.variable, "=", v.text);
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

// --rdzv_conf keys of torchrun's that mean nothing to ctrun's rendezvous,
// and why; each given is noted.
const std::map<std::string, const char*>& IgnoredRdzvConfKeys() {
  static const std::map<std::string, const char*> keys = {
      {"timeout", "join_timeout bounds the join"},
      {"read_timeout", "calls to ctrun's rendezvous carry their own deadlines"},
      {"close_timeout",
       "a round closes as soon as every node is back, or at the last call"},
      {"keep_alive_max_attempt", "a node is lost after heartbeat_timeout"},
      {"store_type", "workers reach ctrun's store through libctrun_worker"},
      {"use_libuv", "PyTorch's own TCPStore on MASTER_PORT is untouched"},
  };
  return keys;
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

// Flags that, given, make up the rendezvous instead of Slurm's defaults.
constexpr const char* kRendezvousFlags[] = {"standalone", "rdzv_endpoint",
                                            "rdzv_backend", "master_addr"};

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
      auto found = LookUpFlag(name, a.substr(0, eq));
      if (!found.ok()) return found.status();
      const FlagSpec* f = *found;
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

using Raw = std::map<std::string, RawValue>;

const FlagSpec& Spec(const char* name) { return *FindFlag(name); }

// A refusal of flag `name`'s value, named as the user gave it.
absl::Status BadValue(const Raw& raw, const char* name, absl::string_view why) {
  return Bad(Spec(name), raw.at(name), why);
}

absl::Status ConvertBool(const Raw& raw, const char* name, bool* out) {
  auto b = ToBool(raw.at(name).text);
  if (!b) return BadValue(raw, name, "expected 0 or 1");
  *out = *b;
  return absl::OkStatus();
}

absl::Status ConvertInt(const Raw& raw, const char* name, int lo, int hi,
                        int* out) {
  auto n = ToInt(raw.at(name).text);
  if (!n || *n < lo || *n > hi) {
    return BadValue(raw, name,
                    absl::StrCat("expected an integer in ", lo, "..", hi));
  }
  *out = *n;
  return absl::OkStatus();
}

absl::Status ConvertSeconds(const Raw& raw, const char* name,
                            absl::Duration* out) {
  auto d = ToSeconds(raw.at(name).text);
  if (!d) return BadValue(raw, name, "expected seconds >= 0");
  *out = *d;
  return absl::OkStatus();
}

// Seconds > 0, or "off" (empty).
absl::Status ConvertSecondsOrOff(const Raw& raw, const char* name,
                                 std::optional<absl::Duration>* out) {
  const std::string& text = raw.at(name).text;
  if (text == "off") {
    out->reset();
    return absl::OkStatus();
  }
  auto d = ToSeconds(text);
  if (!d || *d <= absl::ZeroDuration()) {
    return BadValue(raw, name, "expected seconds > 0, or off");
  }
  *out = *d;
  return absl::OkStatus();
}

#define CTRUN_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    if (absl::Status s = (expr); !s.ok()) return s; \
  } while (0)

// Every flag's text: the flag > its PET_* variable > the default.
Raw LayerSources(const Split& split, const EnvMap& env) {
  Raw raw;
  for (const auto& f : Flags()) {
    RawValue v{f.value, Source::kDefault};
    if (auto it = env.find(PetName(f)); it != env.end()) {
      v = RawValue{it->second, Source::kEnv, it->first};
    }
    if (auto it = split.values.find(f.name); it != split.values.end()) {
      v = it->second;
    }
    raw[f.name] = v;
  }
  // Variables of torchrun's that stand in for a flag nobody set.
  for (auto [flag, variable] :
       {std::pair{"log_line_prefix_template", env::kLogLinePrefixTemplate},
        std::pair{"shutdown_timeout", env::kTorchShutdownTimeout}}) {
    if (raw[flag].source != Source::kDefault) continue;
    if (auto it = env.find(variable); it != env.end()) {
      raw[flag] = RawValue{it->second, Source::kEnv, variable};
    }
  }
  return raw;
}

// What Slurm contributes once its defaults are applied.
struct SlurmContext {
  std::optional<SlurmFacts> facts;
  // Slurm's defaults make up the rendezvous (no rendezvous flag was given).
  bool rendezvous = false;
  HostFacts host;  // with Slurm's GPU count when nothing else saw GPUs
};

// Whether --nnodes, however given, needs more than one node to start.
bool NeedsOtherNodes(Raw& raw) {
  const std::vector<std::string> parts =
      absl::StrSplit(raw["nnodes"].text, ':');
  const std::optional<int> min = ToInt(parts.front());
  return min && *min > 1;
}

// Inside a Slurm job, fills what flags and PET_* left at their defaults:
// the run id and, for a multi-node step, the node count, node rank and
// rendezvous endpoint. Explicit rendezvous flags always win, as a whole.
// `status`: for `ctrun status`, which may run in any step, the batch step
// included, to find the rendezvous of the step that trains.
absl::StatusOr<SlurmContext> ApplySlurmDefaults(
    const std::vector<std::string>& args, const EnvMap& env,
    const HostFacts& host, Raw& raw, bool status) {
  auto read = ReadSlurmFacts(env);
  if (!read.ok()) return read.status();
  SlurmContext slurm;
  slurm.facts = std::move(*read);
  slurm.host = host;
  if (!slurm.facts) return slurm;
  const SlurmFacts& f = *slurm.facts;
  auto fill = [&raw](const char* name, std::string value) {
    if (raw[name].source == Source::kDefault) {
      raw[name] = RawValue{std::move(value), Source::kSlurm};
    }
  };
  fill("rdzv_id",
       absl::StrCat("slurm-", f.job_id, f.in_step() ? "." + f.step_id : ""));
  const bool explicit_rendezvous =
      std::any_of(std::begin(kRendezvousFlags), std::end(kRendezvousFlags),
                  [&raw](const char* name) {
                    return raw[name].source != Source::kDefault;
                  });
  // The batch step runs on the allocation's first node only: a job that
  // needs other nodes would wait there for its join timeout.
  const bool batch_step = f.num_nodes > 1 && !f.in_step() && !status;
  if (batch_step && (!explicit_rendezvous || NeedsOtherNodes(raw)) &&
      !ToBool(raw["allow_batch_step"].text).value_or(false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this is the batch step of a ", f.num_nodes,
        "-node Slurm allocation, which runs on its first node only; "
        "start one ctrun per node: srun --ntasks-per-node=1 ctrun ",
        absl::StrJoin(args, " "),
        explicit_rendezvous ? " (or, if the other nodes are started another "
                              "way, add --allow_batch_step)"
                            : ""));
  }
  if (f.num_nodes > 1 && !explicit_rendezvous) {
    slurm.rendezvous = true;
    // --spares=K: the allocation's last K nodes (by node id) are spares.
    const int spares = ToInt(raw["spares"].text).value_or(0);
    if (spares >= f.num_nodes && raw["nnodes"].source == Source::kDefault) {
      return BadValue(raw, "spares",
                      absl::StrCat("leaves none of the ", f.num_nodes,
                                   " nodes of Slurm job ", f.job_id,
                                   " to run; expected 0..", f.num_nodes - 1));
    }
    fill("nnodes", absl::StrCat(f.num_nodes - std::max(spares, 0)));
    // Group ranks follow Slurm's node order, not the order of arrival.
    fill("node_rank", absl::StrCat(f.node_id));
    fill("rdzv_backend", "c10d");
    fill("rdzv_endpoint",
         absl::StrCat(f.nodes.front(), ":", SlurmRendezvousPort(f.job_id)));
  }
  if (host.gpu_count == 0 && f.gpus_on_node > 0) {
    slurm.host.gpu_count = f.gpus_on_node;
    slurm.host.gpu_source = "SLURM_GPUS_ON_NODE";
  }
  return slurm;
}

// --nnodes and --nproc_per_node.
absl::Status ConvertNodes(const Raw& raw, const HostFacts& host,
                          LaunchOptions& o) {
  {
    const auto& v = raw.at("nnodes");
    std::vector<std::string> parts = absl::StrSplit(v.text, ':');
    std::optional<int> lo, hi;
    if (parts.size() == 1) lo = hi = ToInt(parts[0]);
    if (parts.size() == 2) {
      lo = ToInt(parts[0]);
      hi = ToInt(parts[1]);
    }
    if (!lo || !hi || *lo < 1 || *hi > 65536) {
      return BadValue(raw, "nnodes",
                      "expected N or MIN:MAX with 1 <= MIN <= MAX <= 65536");
    }
    if (*lo > *hi) {
      return BadValue(raw, "nnodes",
                      "MIN exceeds MAX; expected N or MIN:MAX with MIN <= MAX");
    }
    o.min_nodes = *lo;
    o.max_nodes = *hi;
  }
  const std::string t = absl::AsciiStrToLower(raw.at("nproc_per_node").text);
  if (t == "gpu") {
    if (host.gpu_count == 0) {
      return BadValue(raw, "nproc_per_node",
                      absl::StrCat("no GPU is visible (", host.gpu_source,
                                   "); use a count, cpu or auto"));
    }
    o.local_world_size = host.gpu_count;
  } else if (t == "xpu") {
    if (host.xpu_count == 0) {
      return BadValue(
          raw, "nproc_per_node",
          absl::StrCat("no Intel GPU (XPU) is visible (", host.xpu_source,
                       "); use a count, gpu, cpu or auto"));
    }
    o.local_world_size = host.xpu_count;
  } else if (t == "cpu") {
    o.local_world_size = host.cpu_count;
  } else if (t == "auto") {
    o.local_world_size = host.gpu_count > 0   ? host.gpu_count
                         : host.xpu_count > 0 ? host.xpu_count
                                              : host.cpu_count;
  } else {
    auto n = ToInt(t);
    if (!n || *n < 1 || *n > 65536) {
      return BadValue(raw, "nproc_per_node",
                      "expected a count in 1..65536, gpu, xpu, cpu or auto");
    }
    o.local_world_size = *n;
  }
  return absl::OkStatus();
}

// --rdzv_conf: KEY=VALUE items, the timeouts among them, is_host, the token
// file and the TLS files.
absl::Status ConvertRdzvConf(const Raw& raw, LaunchOptions& o) {
  const auto& v = raw.at("rdzv_conf");
  auto bad = [&raw](absl::string_view why) {
    return BadValue(raw, "rdzv_conf", why);
  };
  for (absl::string_view item :
       absl::StrSplit(v.text, ',', absl::SkipWhitespace())) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return bad(absl::StrCat("'", item, "' is not KEY=VALUE"));
    }
    std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(item.substr(eq + 1)));
    if (!RdzvConfKeys().contains(key)) {
      return bad(absl::StrCat("unknown key '", key, "'; known keys: ",
                              absl::StrJoin(RdzvConfKeys(), ", ")));
    }
    if (auto it = IgnoredRdzvConfKeys().find(key);
        it != IgnoredRdzvConfKeys().end()) {
      o.notices.push_back(absl::StrCat("--rdzv_conf ", key, "=", value,
                                       " has no effect: ", it->second));
    }
    o.rdzv_conf[key] = value;
  }
  for (auto [key, out] :
       {std::pair{"join_timeout", &o.join_timeout},
        std::pair{"last_call_timeout", &o.last_call_timeout},
        std::pair{"heartbeat_timeout", &o.heartbeat_timeout},
        std::pair{"keep_alive_interval", &o.keep_alive_interval},
        std::pair{"reconnect_timeout", &o.reconnect_timeout}}) {
    auto it = o.rdzv_conf.find(key);
    if (it == o.rdzv_conf.end()) continue;
    auto d = ToSeconds(it->second);
    if (!d || *d <= absl::ZeroDuration()) {
      return bad(absl::StrCat(key, "=", it->second,
                              " is not a number of seconds > 0"));
    }
    *out = *d;
  }
  if (o.keep_alive_interval * 2 > o.heartbeat_timeout) {
    return bad("keep_alive_interval must be at most half of heartbeat_timeout");
  }
  if (auto it = o.rdzv_conf.find("is_host"); it != o.rdzv_conf.end()) {
    auto b = ToBool(it->second);
    if (!b) return bad(absl::StrCat("is_host=", it->second, " is not 0 or 1"));
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
    return bad("tls_cert and tls_key go together");
  }
  return absl::OkStatus();
}

// The rendezvous flags, each on its own.
absl::Status ConvertRendezvous(Raw& raw, LaunchOptions& o) {
  CTRUN_RETURN_IF_ERROR(ConvertBool(raw, "standalone", &o.standalone));
  const std::string backend = absl::AsciiStrToLower(raw["rdzv_backend"].text);
  if (backend != "static" && backend != "c10d" && backend != "ctrun") {
    return BadValue(raw, "rdzv_backend",
                    "expected static, c10d or ctrun (etcd is not supported: "
                    "serve the rendezvous with ctrund or an agent)");
  }
  o.rdzv_backend = backend == "ctrun" ? "c10d" : backend;
  if (const auto& v = raw["rdzv_endpoint"]; !v.text.empty()) {
    auto eps = ParseEndpointList(v.text, 29400);
    if (!eps.ok()) {
      return BadValue(raw, "rdzv_endpoint", eps.status().message());
    }
    o.rdzv_endpoint = JoinEndpoints(*eps);
  }
  const auto& id = raw["rdzv_id"];
  if (auto s = CheckJobId(id.text); !s.ok()) {
    return BadValue(raw, "rdzv_id", s.message());
  }
  // "none" (torchrun's default) is fine for one node, which gets a fresh
  // id; nodes of one job must agree on it, so for several nodes it stays
  // "none" unless the static master names the job.
  o.run_id = id.text;
  if (id.text == "none") {
    const auto& nnodes = raw["nnodes"].text;
    if (nnodes == "1" || nnodes == "1:1" || raw["standalone"].text == "1") {
      o.run_id = GenerateRunId();
      raw["rdzv_id"] = RawValue{o.run_id, Source::kDerived};
    }
  }
  CTRUN_RETURN_IF_ERROR(ConvertRdzvConf(raw, o));
  CTRUN_RETURN_IF_ERROR(ConvertInt(raw, "spares", 0, kMaxSpares, &o.spares));
  o.segment = raw["segment"].text;
  if (auto s = CheckSegment(o.segment); !s.ok()) {
    return BadValue(raw, "segment", s.message());
  }
  CTRUN_RETURN_IF_ERROR(ConvertInt(raw, "node_rank", 0, 65535, &o.node_rank));
  o.master_addr = raw["master_addr"].text;
  if (o.master_addr.empty()) {
    return BadValue(raw, "master_addr", "must not be empty");
  }
  if (auto s = ValidateHost(o.master_addr); !s.ok()) {
    return BadValue(raw, "master_addr", s.message());
  }
  if (!raw["master_port"].text.empty()) {
    CTRUN_RETURN_IF_ERROR(
        ConvertInt(raw, "master_port", 1, 65535, &o.master_port));
  }
  o.local_addr = raw["local_addr"].text;
  if (!o.local_addr.empty()) {  // torchrun takes an empty one as none
    if (auto s = ValidateHost(o.local_addr); !s.ok()) {
      return BadValue(raw, "local_addr", s.message());
    }
  }
  return absl::OkStatus();
}

// Hang detection; torchrun's file timers come with the environment.
absl::Status ConvertHang(const Raw& raw, LaunchOptions& o) {
  auto hang = HangTimeout::Parse(raw.at("hang_timeout").text);
  if (!hang.ok()) return BadValue(raw, "hang_timeout", hang.status().message());
  o.hang_timeout = *hang;
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "hang_warmup", &o.hang_timeout.warmup));
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "hang_evidence_timeout", &o.hang_evidence_timeout));
  CTRUN_RETURN_IF_ERROR(
      ConvertSecondsOrOff(raw, "process_group_check", &o.process_group_check));
  if (o.hang_evidence_timeout > absl::Minutes(10)) {
    return BadValue(raw, "hang_evidence_timeout", "expected seconds in 0..600");
  }
  return absl::OkStatus();
}

// The job's and the workers' flags.
absl::Status ConvertWorkers(const Raw& raw, LaunchOptions& o) {
  CTRUN_RETURN_IF_ERROR(
      ConvertInt(raw, "max_restarts", 0, 1'000'000, &o.max_restarts));
  auto restart_on = ParseRestartOn(raw.at("restart_on").text);
  if (!restart_on.ok()) {
    return BadValue(raw, "restart_on", restart_on.status().message());
  }
  o.restart_on = *restart_on;
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "min_progress_seconds", &o.min_progress));
  CTRUN_RETURN_IF_ERROR(
      ConvertSecondsOrOff(raw, "preemption_grace", &o.preemption_grace));
  o.health_check = raw.at("health_check").text;
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "quarantine_seconds", &o.quarantine));
  if (o.quarantine > absl::Hours(24)) {
    return BadValue(raw, "quarantine_seconds", "expected seconds in 0..86400");
  }
  absl::Duration unused_interval;
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "monitor_interval", &unused_interval));
  const std::string& method = raw.at("start_method").text;
  if (method != "spawn" && method != "fork" && method != "forkserver") {
    return BadValue(raw, "start_method", "expected spawn, fork or forkserver");
  }
  if (const std::string& numa = raw.at("numa_binding").text; !numa.empty()) {
    auto policy = ParseNumaPolicy(numa);
    if (!policy.ok()) {
      return BadValue(raw, "numa_binding", policy.status().message());
    }
    o.numa_binding = *policy;
  }
  CTRUN_RETURN_IF_ERROR(
      ConvertBool(raw, "virtual_local_rank", &o.virtual_local_rank));
  CTRUN_RETURN_IF_ERROR(
      ConvertBool(raw, "allow_batch_step", &o.allow_batch_step));
  o.role = raw.at("role").text;
  if (o.role.empty()) return BadValue(raw, "role", "must not be empty");
  CTRUN_RETURN_IF_ERROR(ConvertBool(raw, "module", &o.module));
  CTRUN_RETURN_IF_ERROR(ConvertBool(raw, "no_python", &o.no_python));
  CTRUN_RETURN_IF_ERROR(ConvertBool(raw, "verbose", &o.verbose));
  bool unused_run_path = false;
  CTRUN_RETURN_IF_ERROR(ConvertBool(raw, "run_path", &unused_run_path));
  if (o.module && o.no_python) {
    return absl::InvalidArgumentError(
        "-m/--module and --no_python cannot be combined: a module needs "
        "Python");
  }
  const auto& signals = raw.at("signals_to_handle").text;
  for (absl::string_view name :
       absl::StrSplit(signals, ',', absl::SkipWhitespace())) {
    const int sig = SignalNumber(absl::StripAsciiWhitespace(name));
    if (sig == 0) {
      return BadValue(raw, "signals_to_handle",
                      absl::StrCat("unknown signal '", name,
                                   "'; expected names like SIGTERM,SIGINT"));
    }
    o.signals_to_handle.push_back(sig);
  }
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "shutdown_timeout", &o.shutdown_timeout));
  CTRUN_RETURN_IF_ERROR(
      ConvertSeconds(raw, "recovery_timeout", &o.recovery_timeout));
  return ConvertHang(raw, o);
}

// Logs, redirects, tee, the rank filter and the line prefix.
absl::Status ConvertOutput(const Raw& raw, LaunchOptions& o) {
  o.log_dir = raw.at("log_dir").text;
  o.event_log = raw.at("event_log").text;
  if (const auto& metrics = raw.at("metrics_listen").text; !metrics.empty()) {
    auto listen = ParseMetricsListen(metrics);
    if (!listen.ok()) {
      return BadValue(raw, "metrics_listen", listen.status().message());
    }
    o.metrics_listen = *listen;
  }
  for (const char* name : {"redirects", "tee"}) {
    auto sel = ParseStreamSelection(raw.at(name).text);
    if (!sel.ok()) return BadValue(raw, name, sel.status().message());
    (std::string(name) == "tee" ? o.tee : o.redirects) = *sel;
  }
  if (const auto& filter = raw.at("local_ranks_filter").text; !filter.empty()) {
    std::vector<int> ranks;
    for (absl::string_view r :
         absl::StrSplit(filter, ',', absl::SkipWhitespace())) {
      auto n = ToInt(absl::StripAsciiWhitespace(r));
      if (!n || *n < 0 || *n >= o.local_world_size) {
        return BadValue(
            raw, "local_ranks_filter",
            absl::StrCat("expected local ranks in 0..", o.local_world_size - 1,
                         ", comma-separated"));
      }
      ranks.push_back(*n);
    }
    o.local_ranks_filter = ranks;
  }
  o.log_line_prefix_template = raw.at("log_line_prefix_template").text;
  const std::string& tty = raw.at("worker_tty").text;
  if (tty == "auto") {
    o.worker_tty = WorkerTty::kAuto;
  } else if (tty == "yes") {
    o.worker_tty = WorkerTty::kYes;
  } else if (tty == "no") {
    o.worker_tty = WorkerTty::kNo;
  } else {
    return BadValue(raw, "worker_tty", "expected auto, yes or no");
  }
  if (const std::string& preload = raw.at("preload").text; !preload.empty()) {
    std::vector<std::string> modules;
    if (preload != "none") {
      for (absl::string_view m : absl::StrSplit(preload, ',')) {
        const bool valid =
            !m.empty() && std::all_of(m.begin(), m.end(), [](char c) {
              return absl::ascii_isalnum(c) || c == '_' || c == '.';
            });
        if (!valid) {
          return BadValue(raw, "preload",
                          "expected Python module names, comma-separated "
                          "(torch,numpy), or none");
        }
        modules.emplace_back(m);
      }
    }
    o.preload = std::move(modules);
  }
  const std::string& recovery = raw.at("recovery").text;
  if (recovery == "restart") {
    o.recovery = Recovery::kRestart;
  } else if (recovery == "inprocess") {
    o.recovery = Recovery::kInProcess;
    if (o.max_restarts == 0) {
      // torchrun's default budget: the first failure ends the job.
      o.notices.push_back(
          "--recovery=inprocess with --max_restarts=0 (the default): a "
          "worker's failure ends the job; only lost and new nodes are "
          "recovered in process. Give --max_restarts=N to recover N "
          "failures");
    }
  } else {
    return BadValue(raw, "recovery", "expected restart or inprocess");
  }
  for (auto [name, out] :
       {std::pair{"duplicate_stdout_filters", &o.duplicate_filters[0]},
        std::pair{"duplicate_stderr_filters", &o.duplicate_filters[1]}}) {
    *out = absl::StrSplit(raw.at(name).text, ',', absl::SkipEmpty());
  }
  return ConvertBool(raw, "dry_run", &o.dry_run);
}

// What the flags mean together for the rendezvous: standalone, a static
// rendezvous's endpoint and job id, Slurm's node identity and munge. Whether
// this node hosts it, and how it authenticates, PlanRendezvous decides.
absl::Status ResolveRendezvous(const SlurmContext& slurm, const EnvMap& env,
                               Raw& raw, LaunchOptions& o) {
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
  if (slurm.facts && slurm.facts->in_step()) {
    o.parent_signals_workers = SlurmSignalsWholeStep(env);
  }
  if (slurm.facts) o.slurm_job_id = slurm.facts->job_id;
  if (slurm.rendezvous) {
    o.slurm_node_id = slurm.facts->node_id;
    o.munge_socket = MungeSocketFor(env);
  }
  if (o.rdzv_backend == "static" && o.spares > 0) {
    return BadValue(raw, "spares",
                    "a static rendezvous fixes every node's rank and keeps "
                    "no spares; use --rdzv_backend=c10d");
  }
  if (o.rdzv_backend == "static" && o.node_rank >= o.max_nodes) {
    return BadValue(raw, "node_rank",
                    absl::StrCat("expected a node rank below --nnodes=",
                                 o.max_nodes, " (0..", o.max_nodes - 1, ")"));
  }
  if (o.rdzv_backend == "static" && o.max_nodes > 1) {
    // Every node knows the master from its flags; node 0 hosts the
    // rendezvous one port above MASTER_PORT, which stays the workers'.
    if (o.min_nodes != o.max_nodes) {
      return BadValue(raw, "nnodes",
                      "a static rendezvous needs a fixed node count; use "
                      "--rdzv_backend=c10d for MIN:MAX");
    }
    if (o.master_port == 0) o.master_port = 29500;  // torchrun's default
    if (o.master_port == 65535) {
      return BadValue(raw, "master_port",
                      "a static rendezvous uses MASTER_PORT+1; use a lower "
                      "port");
    }
    if (o.rdzv_endpoint.empty()) {
      auto ep = ParseEndpoint(o.master_addr, o.master_port + 1);
      if (!ep.ok()) return BadValue(raw, "master_addr", ep.status().message());
      ep->port = o.master_port + 1;
      o.rdzv_endpoint = ep->ToString();
    }
    if (o.run_id == "none") {
      o.run_id = absl::StrCat("static-", o.rdzv_endpoint);
      raw["rdzv_id"] = RawValue{o.run_id, Source::kDerived};
    }
    return absl::OkStatus();
  }
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
  return absl::OkStatus();
}

// The values that flags only imply, as --dry_run shows them after the flags.
void RecordResolved(const Raw& raw, const HostFacts& host, LaunchOptions& o) {
  auto resolved = [&o](const char* name, std::string value) {
    o.settings.push_back({absl::StrCat(name, " (resolved)"), std::move(value),
                          Source::kDerived, ""});
  };
  const std::string nproc =
      absl::AsciiStrToLower(raw.at("nproc_per_node").text);
  if (nproc == "gpu" || (nproc == "auto" && host.gpu_count > 0)) {
    resolved("nproc_per_node",
             absl::StrCat(o.local_world_size, ", from ", host.gpu_source));
  } else if (nproc == "xpu" || (nproc == "auto" && host.xpu_count > 0)) {
    resolved("nproc_per_node",
             absl::StrCat(o.local_world_size, ", from ", host.xpu_source));
  } else if (nproc == "cpu" || nproc == "auto") {
    resolved("nproc_per_node",
             absl::StrCat(o.local_world_size, ", the CPU count"));
  }
  if (raw.at("rdzv_endpoint").text.empty() && !o.rdzv_endpoint.empty()) {
    resolved("rdzv_endpoint",
             absl::StrCat(o.rdzv_endpoint, " (MASTER_ADDR:MASTER_PORT+1)"));
  }
  if (raw.at("master_port").text.empty()) {
    resolved("master_port",
             o.master_port > 0
                 ? absl::StrCat(o.master_port, " (torchrun's default)")
                 : "a free port on group rank 0's node");
  }
  resolved(
      "timeouts",
      absl::StrCat("join ", absl::FormatDuration(o.join_timeout),
                   ", last call ", absl::FormatDuration(o.last_call_timeout),
                   ", heartbeat ", absl::FormatDuration(o.heartbeat_timeout),
                   ", keep-alive ", absl::FormatDuration(o.keep_alive_interval),
                   ", reconnect ", absl::FormatDuration(o.reconnect_timeout),
                   ", shutdown ", absl::FormatDuration(o.shutdown_timeout)));
  if (o.rdzv_backend == "static") {
    const int first = o.node_rank * o.local_world_size;
    resolved("RANK",
             o.max_nodes == 1
                 ? absl::StrCat("0..", o.local_world_size - 1)
                 : absl::StrCat(first, "..", first + o.local_world_size - 1,
                                " if every node runs ", o.local_world_size));
  } else {
    resolved("RANK", o.max_nodes == 1
                         ? absl::StrCat("0..", o.local_world_size - 1)
                         : "assigned by the rendezvous");
  }
}

// Every flag's final value and source for --dry_run, and a notice for each
// flag given that has no effect in ctrun.
void RecordSources(const Raw& raw, const HostFacts& host, LaunchOptions& o) {
  for (const auto& f : Flags()) {
    const RawValue& v = raw.at(f.name);
    std::string note;
    if (f.no_effect != nullptr && v.source != Source::kDefault) {
      note = f.no_effect;
      o.notices.push_back(absl::StrCat(Origin(f, v), " has no effect: ", note));
    }
    o.settings.push_back({f.name, v.text, v.source, note});
  }
  RecordResolved(raw, host, o);
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(
    const std::vector<std::string>& all_args, const EnvMap& env,
    const HostFacts& host) {
  CommandLine result;
  const bool status = !all_args.empty() && all_args[0] == "status";
  std::vector<std::string> args;
  for (size_t i = status ? 1 : 0; i < all_args.size(); ++i) {
    // --json is status's own; after the program, it is the program's.
    if (status && all_args[i] == "--json") {
      result.json = true;
      continue;
    }
    args.push_back(all_args[i]);
  }
  auto split = SplitArgs(args);
  if (!split.ok()) return split.status();
  if (split->help || split->version) {
    result.action = split->help ? (status ? CommandLine::Action::kStatusHelp
                                          : CommandLine::Action::kHelp)
                                : CommandLine::Action::kVersion;
    return result;
  }
  if (status && split->has_entrypoint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "status takes flags only, got '", split->entrypoint,
        "'; to run a program named status: ctrun [FLAGS] -- status"));
  }
  Raw raw = LayerSources(*split, env);
  auto slurm = ApplySlurmDefaults(args, env, host, raw, status);
  if (!slurm.ok()) return slurm.status();
  LaunchOptions& o = result.options;
  if (status) {
    // How many workers this node would start is no concern of status, which
    // may run where the job's --nproc_per_node=gpu finds no GPU.
    raw["nproc_per_node"] = RawValue{"1", Source::kDefault};
  }
  CTRUN_RETURN_IF_ERROR(ConvertNodes(raw, slurm->host, o));
  CTRUN_RETURN_IF_ERROR(ConvertRendezvous(raw, o));
  CTRUN_RETURN_IF_ERROR(ConvertWorkers(raw, o));
  CTRUN_RETURN_IF_ERROR(ConvertOutput(raw, o));
  CTRUN_RETURN_IF_ERROR(ResolveRendezvous(*slurm, env, raw, o));
  if (auto it = env.find(env::kEnableFileTimer); it != env.end()) {
    o.file_timers = it->second == "1";
  }
  if (status) {
    result.action = CommandLine::Action::kStatus;
    result.slurm_job =
        slurm->rendezvous && raw["rdzv_id"].source == Source::kSlurm;
    return result;
  }
  if (!split->has_entrypoint) {
    return absl::InvalidArgumentError(
        "missing the program to run: ctrun [FLAGS] ENTRYPOINT [ARGS...] "
        "(see ctrun --help)");
  }
  o.entrypoint = split->entrypoint;
  o.script_args = split->script_args;
  RecordSources(raw, slurm->host, o);
  return result;
}
#undef CTRUN_RETURN_IF_ERROR

std::string StatusHelpText() {
  return "usage: ctrun status [FLAGS] [--json]\n"
         "       ctrun status --rdzv_endpoint=node0:29400 --rdzv_id=job42\n\n"
         "Shows a running job as its rendezvous sees it: its round, nodes, "
         "ranks and\ntheir state, restarts and the last failure. FLAGS are "
         "the job's own launch\nflags: those that say where its rendezvous "
         "is and how to prove oneself to it\ncount (--rdzv_endpoint, "
         "--rdzv_id, --rdzv_backend, --nnodes, --master_addr,\n"
         "--rdzv_conf token_file=FILE or $CTRUN_RDZV_TOKEN, tls_ca); the "
         "others are\naccepted and ignored. Inside a Slurm allocation it "
         "needs none. A --standalone\njob's rendezvous lives inside its "
         "ctrun and cannot be asked.\n\n"
         "  --json\n      print the job as JSON (proto field names)\n"
         "  -h, --help\n      this text\n\n"
         "Exit status: 0 when the job was shown, 1 when the rendezvous could "
         "not be\nreached or does not hold the job, 2 for a bad command "
         "line.\n";
}

std::string HelpText() {
  std::string out = absl::StrCat(
      "usage: ctrun [FLAGS] ENTRYPOINT [ARGS...]\n"
      "       ctrun status [FLAGS] [--json]   (a running job, see ctrun "
      "status --help)\n"
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
                  "  --version\n      print the version\n\n",
                  kHelpEpilogue);
  return out;
}

}  // namespace ctrun
