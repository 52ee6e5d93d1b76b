// LaunchOptions: everything `ctrun` was asked to do, resolved and validated.
//
// Filled by ParseCommandLine (command_line.h) from flags, PET_* environment
// overrides, what Slurm says, and defaults, in that order of precedence; each
// setting remembers where its value came from, for --dry_run.
#ifndef CTRUN_LAUNCHER_OPTIONS_LAUNCH_OPTIONS_H_
#define CTRUN_LAUNCHER_OPTIONS_LAUNCH_OPTIONS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rendezvous/rpc/endpoint.h"

namespace ctrun {

// Where a setting's value came from.
enum class Source { kDefault, kFlag, kEnv, kSlurm, kDerived };
const char* SourceName(Source source);

// --numa_binding's policies (launcher/policy/numa_binding.h plans them).
enum class NumaPolicy { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive", "core-complex".
const char* NumaPolicyName(NumaPolicy policy);

// INVALID_ARGUMENT naming the accepted values.
absl::StatusOr<NumaPolicy> ParseNumaPolicy(absl::string_view text);

// Which of a worker's streams go to a log file: torchrun's Std (0 none,
// 1 stdout, 2 stderr, 3 both), for all local ranks or per local rank.
struct StreamSelection {
  int all = 0;                    // for ranks not in `per_rank`
  std::map<int, int> per_rank;    // local rank -> 0..3
  int For(int local_rank) const;  // 0..3
};

// "3" or "0:1,1:2" (torchrun's --redirects/--tee). INVALID_ARGUMENT names
// the accepted forms.
absl::StatusOr<StreamSelection> ParseStreamSelection(const std::string& text);

// --worker_tty: whether a worker's stdout and stderr are pseudo-terminals.
// kAuto: a stream is one when ctrun's own stream is a terminal and the
// worker's stream goes only there (not to a log file, not filtered out),
// which is when torchrun's worker would write to the terminal itself.
enum class WorkerTty { kAuto, kYes, kNo };

// --recovery: what a new round does with the workers that still run.
// kRestart (torchrun's): stops them all and starts new ones. kInProcess:
// keeps those that run under ctrun.resilient (or worker_lib's re-creatable
// communicator), hands them the new world, and starts processes only for
// the ranks that have none.
enum class Recovery { kRestart, kInProcess };

// --hang_timeout: when a worker that sends no progress signal is hung
// (progress_monitor.h says how each mode counts).
struct HangTimeout {
  enum class Mode { kOff, kFixed, kAuto };
  Mode mode = Mode::kOff;
  absl::Duration fixed = absl::ZeroDuration();  // kFixed
  // Each worker's first signal, and with kAuto its first steps and a
  // section not timed yet, may take this long (--hang_warmup).
  absl::Duration warmup = absl::Seconds(300);

  // "off", "auto" or a number of seconds > 0; INVALID_ARGUMENT names the
  // accepted forms.
  static absl::StatusOr<HangTimeout> Parse(const std::string& text);
  std::string ToString() const;
};

struct LaunchOptions {
  // Nodes and workers.
  int min_nodes = 1;
  int max_nodes = 1;
  int local_world_size = 1;  // --nproc_per_node, resolved to a count
  // --numa_binding: each worker bound to its GPU's CPUs (and memory).
  std::optional<NumaPolicy> numa_binding;

  // Rendezvous.
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;  // HOST:PORT; empty: hosted in-process
  std::string run_id;         // --rdzv_id; generated when "none"
  std::map<std::string, std::string> rdzv_conf;
  bool standalone = false;
  int node_rank = -1;  // -1: no hint (only a static rendezvous uses it)
  // --rdzv_conf is_host: host the rendezvous here (true), join one (false),
  // or let PlanRendezvous decide (nullopt).
  std::optional<bool> is_host;
  std::string token_file;  // --rdzv_conf token_file
  // In a rendezvous made up from Slurm's variables: this node's SLURM_NODEID
  // (node 0 hosts), and the socket of the munged that authenticates agents
  // and workers when no token is given (empty: munge's default).
  std::optional<int> slurm_node_id;
  std::string munge_socket;
  // In a Slurm step whose signals reach every process: a signal from the
  // parent (slurmstepd) has reached the workers already, so it is not
  // forwarded again.
  bool parent_signals_workers = false;
  // SLURM_JOB_ID inside an allocation: after a coordinated stop on SIGUSR1,
  // group rank 0's agent asks Slurm to requeue the job.
  std::string slurm_job_id;
  // --rdzv_conf tls_ca (to verify the rendezvous), tls_cert and tls_key
  // (to serve it, on the hosting node).
  std::string tls_ca, tls_cert, tls_key;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free port found by group rank 0
  std::string local_addr;  // advertised address; empty: derived

  // Job.
  int max_restarts = 0;
  // --restart_on: the failure classes that restart (failure_class.h); 0:
  // the default.
  uint32_t restart_on = 0;
  // --min_progress_seconds: for workers without progress signals, an
  // attempt shorter than this made no progress; zero: never so.
  absl::Duration min_progress = absl::ZeroDuration();
  // --preemption_grace: how long a coordinated stop (SIGTERM, SIGUSR1,
  // SIGUSR2 to ctrun, workers calling the stop check) may take before the
  // signal acts as without it; empty: off, signals act at once.
  std::optional<absl::Duration> preemption_grace = absl::Seconds(25);
  // --health_check: a shell command run before each join and rejoin (exit 0:
  // healthy); --quarantine_seconds: how long the rendezvous then refuses
  // this host.
  std::string health_check;
  absl::Duration quarantine = absl::Seconds(600);
  // --spares: nodes beyond max_nodes the job keeps ready to take a lost
  // node's slot; --segment: this node's label for choosing among them.
  int spares = 0;
  std::string segment;
  std::string role = "default";
  absl::Duration join_timeout = absl::Seconds(600);
  absl::Duration last_call_timeout = absl::Seconds(30);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  absl::Duration keep_alive_interval = absl::Seconds(1);
  // How long an agent whose session broke keeps its workers running while
  // it reconnects, when the rendezvous keeps state across restarts.
  absl::Duration reconnect_timeout = absl::Seconds(60);

  // Workers.
  std::string entrypoint;
  std::vector<std::string> script_args;
  bool module = false;     // -m: python -m ENTRYPOINT
  bool no_python = false;  // execute ENTRYPOINT directly
  // -v: the end-of-job usage line of every rank, not one per node.
  bool verbose = false;
  // LOCAL_RANK=0 for every worker, each seeing only its own GPU.
  bool virtual_local_rank = false;
  // Start a multi-node job in a Slurm allocation's batch step anyway (the
  // other nodes are started some other way).
  bool allow_batch_step = false;
  std::vector<int> signals_to_handle;
  absl::Duration shutdown_timeout = absl::Seconds(30);
  Recovery recovery = Recovery::kRestart;
  // --preload: the modules a template interpreter imports once, so that
  // Python workers are forked from it warm (template_spawner.h). Unset:
  // torch, when installed, with --recovery=inprocess or --spares; none
  // otherwise.
  std::optional<std::vector<std::string>> preload;
  // With kInProcess: how long a kept worker may take to take the new world
  // before it is killed and started again.
  absl::Duration recovery_timeout = absl::Seconds(30);
  // Hangs: the timeout, and how long every node then spends collecting its
  // workers' stacks before stopping them.
  HangTimeout hang_timeout;
  absl::Duration hang_evidence_timeout = absl::Seconds(10);
  // How long after a start group rank 0's node waits for the job's ranks
  // to form a process group before it says that they did not; nullopt:
  // never (--process_group_check=off).
  std::optional<absl::Duration> process_group_check = absl::Seconds(60);
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torchrun's file timers.
  bool file_timers = false;

  // Output.
  std::string log_dir;    // empty: a temporary one, removed at exit
  std::string event_log;  // --event_log FILE; empty: none
  // Where the hosted rendezvous serves its metrics; none when unset.
  std::optional<Endpoint> metrics_listen;
  StreamSelection redirects;
  StreamSelection tee;
  std::optional<std::vector<int>> local_ranks_filter;  // nullopt: all
  // --duplicate_std{out,err}_filters: [0] stdout, [1] stderr; empty: none.
  std::vector<std::string> duplicate_filters[2];
  std::string log_line_prefix_template;
  WorkerTty worker_tty = WorkerTty::kAuto;

  bool dry_run = false;

  // Every setting's final value as text and where it came from, in the
  // order --help lists them; for --dry_run.
  struct Setting {
    std::string name;
    std::string value;
    Source source;
    std::string note;  // e.g. why a torchrun flag has no effect in ctrun
  };
  std::vector<Setting> settings;
  // One line each for flags given that ctrun accepts but has no use for.
  std::vector<std::string> notices;
};

// The launch plan as --dry_run prints it: every setting, its value and its
// source, then the worker command line.
std::string FormatLaunchPlan(const LaunchOptions& options,
                             const std::vector<std::string>& worker_argv);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_LAUNCH_OPTIONS_H_
