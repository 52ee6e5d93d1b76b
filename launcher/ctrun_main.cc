// ctrun: the launcher. Parses torchrun's command line, hosts the
// rendezvous in-process for a single-node job, and runs the agent.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ctrun/environment.h"
#include "ctrun_version.h"
#include "launcher/agent.h"
#include "launcher/options/command_line.h"
#include "launcher/options/host_facts.h"
#include "launcher/options/rendezvous_plan.h"
#include "launcher/options/worker_command.h"
#include "launcher/workers/run_directory.h"
#include "launcher/workers/watchdog.h"
#include "launcher/workers/worker_process.h"
#include "rendezvous/client/status_report.h"
#include "rendezvous/ops/metrics.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/grpc_log.h"
#include "rendezvous/server/rendezvous_server.h"

extern char** environ;

namespace ctrun {
namespace {

constexpr int kUsageError = 2;

EnvMap ProcessEnvironment() {
  EnvMap env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = std::string(eq + 1);
  }
  return env;
}

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

int Fail(const std::string& message, int code) {
  std::cerr << "ctrun: " << message << "\n";
  return code;
}

// Signals are taken through the agent's signalfd, blocked before any thread
// exists so that no thread ever takes them; orphaned descendants come to
// ctrun, which ends them; the rendezvous' own log stays quiet.
void PrepareProcess(const sigset_t& signals) {
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // The agent is the in-process rendezvous' only client and says itself
  // what happened; the service's own log would repeat it, on stdout, which
  // belongs to the workers.
  auto logger = spdlog::stderr_color_mt("ctrun");
  logger->set_pattern("ctrun: %v");
  logger->set_level(spdlog::level::off);
  spdlog::set_default_logger(logger);
  RouteGrpcLogsToSpdlog();
}

// What this node proves itself to the rendezvous with, as the plan decided:
// a token (read from its file or the environment, or made up for a
// rendezvous nobody else reaches), or munge credentials inside Slurm.
struct Credentials {
  std::string token;
  std::optional<MungeAuth> munge;
};

absl::StatusOr<Credentials> ResolveCredentials(const LaunchOptions& options,
                                               const EnvMap& env,
                                               const RendezvousPlan& plan) {
  using Auth = RendezvousPlan::Auth;
  Credentials c;
  switch (plan.auth) {
    case Auth::kNone:
      break;
    case Auth::kTokenFile: {
      auto read = ReadTokenFile(options.token_file);
      if (!read.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--rdzv_conf token_file: ", read.status().message()));
      }
      c.token = *read;
      break;
    }
    case Auth::kTokenEnv:
      c.token = env.at(env::kRendezvousToken);
      break;
    case Auth::kFreshToken:
      c.token = GenerateToken();
      break;
    case Auth::kMunge:
      c.munge = MungeAuth{options.munge_socket, options.run_id};
      // Checked before anything starts, so that a node without munge says
      // so at once rather than as a refusal from the rendezvous.
      if (auto probe =
              MungeEncode(c.munge->socket, MungePayload(c.munge->job_id));
          !probe.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the Slurm rendezvous authenticates with munge, which fails "
            "here: ",
            probe.status().message(),
            "; or give every node the same token (--rdzv_conf "
            "token_file=FILE or ",
            env::kRendezvousToken, ")"));
      }
      break;
  }
  return c;
}

// The token workers get: one that admits their own job only, never the
// service's (a worker could reach every job on a shared ctrund with it).
std::string WorkerToken(const std::string& token, const std::string& job_id) {
  if (token.empty() || absl::StartsWith(token, "job.")) return token;
  return JobToken(token, job_id);
}

// A client of the rendezvous at `endpoint` (one or several, comma-separated)
// with this node's credentials.
absl::StatusOr<Connection> Connect(const std::string& endpoint,
                                   const Credentials& credentials,
                                   const LaunchOptions& options,
                                   LocalRendezvous* local = nullptr) {
  ConnectionOptions connection_options;
  connection_options.local = local;
  connection_options.endpoint = endpoint;
  connection_options.token = credentials.token;
  connection_options.munge = credentials.munge;
  connection_options.tls_ca_file = options.tls_ca;
  return Connection::Open(connection_options);
}

// What operators watch a run by: --event_log and --metrics_listen.
struct Operations {
  std::shared_ptr<EventLog> event_log;
  std::shared_ptr<RendezvousMetrics> metrics;  // with --metrics_listen
};

// The in-process rendezvous of the hosting agent, which joins it through
// the ordinary client like every other agent, its session going in process
// (LocalRendezvous). Null when another agent here
// serves the inferred endpoint already.
absl::StatusOr<std::unique_ptr<RendezvousServer>> HostRendezvous(
    const LaunchOptions& options, const RendezvousPlan& plan,
    const Credentials& credentials, const Operations& operations) {
  ServerOptions server_options;
  server_options.metrics = operations.metrics;
  server_options.event_log = operations.event_log;
  server_options.listen = plan.endpoint;
  // This agent's own session goes in process (Connect): gRPC starts only
  // when a worker or another node connects.
  server_options.start_grpc_on_first_connection = true;
  server_options.token = credentials.token;
  server_options.munge = credentials.munge;
  if (!options.tls_cert.empty()) {
    server_options.tls = TlsServerFiles{options.tls_cert, options.tls_key, ""};
  }
  auto started = RendezvousServer::Start(server_options);
  if (started.ok()) return std::move(*started);
  // Another agent here, or a ctrund, serves it: join it like any node.
  if (plan.inferred && absl::IsUnavailable(started.status())) return nullptr;
  const std::string why =
      options.rdzv_backend == "static"
          ? absl::StrCat(plan.host_reason,
                         ", on --master_port+1 = ", plan.endpoint.port)
          : plan.host_reason;
  return absl::UnavailableError(absl::StrCat(
      "cannot host the rendezvous (", why, "): ", started.status().message()));
}

// Removes a temporary run directory unless a file in it has something to
// say (an error file, a log): then it stays, and ctrun says where.
void RemoveRunDirectory(const std::string& dir) {
  if (RemoveUnlessKept(dir)) {
    std::cerr << "ctrun: the workers' error files and logs are kept in " << dir
              << "\n";
  }
}

// The other nodes still talk to this rendezvous until they leave, unless this
// node was told to stop: then they lose it (a ctrund avoids that). A
// terminating signal still ends the wait; the others are ignored.
void ServeUntilIdle(RendezvousServer& server, const sigset_t& signals) {
  if (!server.WaitUntilIdle(absl::ZeroDuration())) {
    std::cerr << "ctrun: keeping the rendezvous at "
              << server.endpoint().ToString()
              << " up until the other nodes have left\n";
    const timespec poll{0, 0};
    while (!server.WaitUntilIdle(absl::Milliseconds(100))) {
      siginfo_t info;
      const int sig = sigtimedwait(&signals, &info, &poll);
      if (sig > 0 && sig != SIGCHLD && sig != SIGUSR1 && sig != SIGUSR2) break;
    }
  }
}

// Each worker holds two pipes open in the agent for as long as it runs,
// with gRPC, the log files and the epoll set beside them: a low `ulimit -n`
// would fail a spawn halfway through, reading as a worker that exited 127.
// The soft limit is raised to what is needed when the hard one allows;
// otherwise the launch is refused up front, saying what to do.
absl::Status EnsureFileLimit(int local_world_size) {
  const rlim_t needed = static_cast<rlim_t>(local_world_size) * 4 + 256;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) {
    return absl::OkStatus();
  }
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    limit.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("--nproc_per_node=", local_world_size, " needs about ",
                   needed, " open files, but ulimit -n allows ", limit.rlim_cur,
                   " (at most ", limit.rlim_max,
                   " without privileges); raise the limit or run fewer "
                   "workers per node"));
}

// A fresh value for env::kContainmentMark.
std::string ContainmentMark() {
  std::random_device rd;
  return absl::StrCat(getpid(), ".", absl::Hex(rd()), absl::Hex(rd()));
}

// The rendezvous as this agent reaches it: served here when the plan says
// so (unless another agent here serves the inferred endpoint already), and
// the connection every agent uses, the hosting one included.
struct Rendezvous {
  std::unique_ptr<RendezvousServer> server;
  std::string endpoint;
  Connection connection;
};

absl::StatusOr<Rendezvous> ReachRendezvous(const LaunchOptions& options,
                                           const RendezvousPlan& plan,
                                           const Credentials& credentials,
                                           const Operations& operations) {
  std::unique_ptr<RendezvousServer> server;
  if (plan.host) {
    auto hosted = HostRendezvous(options, plan, credentials, operations);
    if (!hosted.ok()) return hosted.status();
    server = std::move(*hosted);
  }
  if (!server && plan.endpoints.size() == 1) {
    // A hosting agent started at the same moment listens within
    // milliseconds; gRPC would retry a refused connection only after 100.
    // Beyond a second the session's own wait takes over.
    WaitUntilListening(plan.endpoint, absl::Seconds(1));
  }
  const std::string endpoint =
      server ? server->endpoint().ToString() : JoinEndpoints(plan.endpoints);
  // The hosting agent's own session needs no transport: unless a worker
  // uses the store or another node joins, nothing here starts gRPC.
  auto connection = Connect(endpoint, credentials, options,
                            server ? server->local() : nullptr);
  if (!connection.ok()) return connection.status();
  return Rendezvous{std::move(server), endpoint, std::move(*connection)};
}

// Asks the rendezvous at `endpoint` about job `run_id` (every job it holds
// when empty, described as `which`) and prints the answer; 0, or 1 having
// said why not.
int AskStatus(const std::string& endpoint, const Credentials& credentials,
              const LaunchOptions& options, const std::string& run_id,
              const std::string& which, bool json, bool slurm) {
  auto connection = Connect(endpoint, credentials, options);
  if (!connection.ok()) {
    return Fail(absl::StrCat("status: ", connection.status().message()),
                kUsageError);
  }
  spdlog::set_level(spdlog::level::off);
  RouteGrpcLogsToSpdlog();
  AdminClient admin(*connection);
  auto jobs = FetchJobs(admin, run_id);
  if (absl::IsNotFound(jobs.status()) || (jobs.ok() && jobs->jobs().empty())) {
    return Fail(absl::StrCat("status: the rendezvous at ", endpoint,
                             " holds no ", which, " (not started yet, ended",
                             slurm ? ")" : ", or another --rdzv_id)"),
                1);
  }
  if (absl::IsDeadlineExceeded(jobs.status())) {
    // Something listens there, but it does not speak gRPC to us.
    return Fail(absl::StrCat("status: ", endpoint,
                             " did not answer as a ctrun rendezvous (a ctrund "
                             "or a ctrun agent) in time; is this its address, "
                             "and is TLS set up alike on both sides?"),
                1);
  }
  if (!jobs.ok()) {
    return Fail(absl::StrCat("status: cannot ask the rendezvous at ", endpoint,
                             " about ", which, ": ", jobs.status().message()),
                1);
  }
  PrintJobs(*jobs, json, *connection, endpoint, std::cout, std::cerr);
  return 0;
}

// `ctrun status` without a rendezvous flag: the jobs whose rendezvous an
// agent of this user hosts on this machine (--standalone ones), found
// through the note each leaves in its run folder.
int LocalStatus(const CommandLine& command) {
  const std::vector<NotedRendezvous> found =
      FindNotedRendezvous(TemporaryDirectory());
  if (found.empty()) {
    return Fail(
        absl::StrCat("status: no rendezvous to ask: no --standalone job of "
                     "yours runs on this machine (their ctrun notes them under "
                     "$TMPDIR, or /tmp); for a job that meets at a "
                     "rendezvous, give its --rdzv_endpoint=HOST:PORT and "
                     "--rdzv_id"),
        kUsageError);
  }
  int code = 0;
  for (const NotedRendezvous& r : found) {
    if (!command.json) {
      std::cout << "# --standalone job '" << r.run_id << "' of ctrun pid "
                << r.agent << " (its run folder: " << r.folder << ")\n";
    }
    Credentials credentials;
    credentials.token = r.token;
    code = std::max(
        code, AskStatus(r.endpoint, credentials, command.options, r.run_id,
                        absl::StrCat("job '", r.run_id, "'"), command.json,
                        /*slurm=*/false));
  }
  return code;
}

// `ctrun status`: the job as its rendezvous holds it, reached and
// authenticated as the job's own agents reach it.
int RunStatus(const CommandLine& command, const EnvMap& env) {
  const LaunchOptions& options = command.options;
  if (options.rdzv_endpoint.empty()) return LocalStatus(command);
  auto plan = PlanRendezvous(options, Hostname(), env);
  if (!plan.ok()) {
    return Fail(absl::StrCat("status: ", plan.status().message()), kUsageError);
  }
  auto credentials = ResolveCredentials(options, env, *plan);
  if (!credentials.ok()) {
    return Fail(absl::StrCat("status: ", credentials.status().message()),
                kUsageError);
  }
  // Another step's credential may read the status, not join the job.
  if (command.slurm_job && credentials->munge) credentials->munge->job_id = "";
  // The allocation's rendezvous serves the step that trains, whose id this
  // step does not know: it shows what it holds.
  return AskStatus(JoinEndpoints(plan->endpoints), *credentials, options,
                   command.slurm_job ? std::string() : options.run_id,
                   command.slurm_job
                       ? std::string("job of this Slurm allocation")
                       : absl::StrCat("job '", options.run_id, "'"),
                   command.json, command.slurm_job);
}

// Runs the agent with the console on threads of its own; returns its exit
// code and whether a signal stopped it.
std::pair<int, bool> RunAgent(AgentConfig config) {
  Console out(STDOUT_FILENO), err(STDERR_FILENO);
  Agent agent(std::move(config), &out, &err);
  const int code = agent.Run();
  return {code, agent.stopped_by_signal()};
}

// DESIGN.md's flow of one job, after the command line and the plan:
// contain, authenticate, host or reach the rendezvous, then the agent runs
// the job to its end; a hosting agent serves the others until they leave.
int Launch(LaunchOptions options, const RendezvousPlan& plan,
           std::vector<std::string> worker_argv, EnvMap env) {
  for (const auto& notice : options.notices) {
    std::cerr << "ctrun: note: " << notice << "\n";
  }
  if (!plan.notice.empty()) std::cerr << "ctrun: note: " << plan.notice << "\n";
  if (auto s = EnsureFileLimit(options.local_world_size); !s.ok()) {
    return Fail(std::string(s.message()), kUsageError);
  }
  const sigset_t signals = AgentSignals(options.signals_to_handle);
  PrepareProcess(signals);
  const bool temporary = options.log_dir.empty();
  if (temporary) {
    if (const std::vector<std::string> stale =
            RemoveStaleRunDirectories(TemporaryDirectory());
        !stale.empty()) {
      std::cerr << "ctrun: removed " << stale.size()
                << (stale.size() == 1 ? " run folder" : " run folders")
                << " left by ctrun agents killed before they could clean up ("
                << stale.front() << (stale.size() > 1 ? ", ..." : "") << ")\n";
    }
  }
  auto run_dir = MakeRunDirectory(options.log_dir, options.run_id);
  if (!run_dir.ok()) {
    return Fail(std::string(run_dir.status().message()),
                absl::IsInvalidArgument(run_dir.status()) ? kUsageError : 1);
  }
  if (temporary) {
    if (auto s = MarkRunDirectory(*run_dir); !s.ok()) {
      return Fail(std::string(s.message()), 1);
    }
  }
  if (!temporary) {
    std::cerr << "ctrun: this run's logs go to " << *run_dir << "\n";
  }
  const std::string mark = ContainmentMark();
  // The watchdog removes a temporary run directory even after kill -9.
  auto watchdog = Watchdog::Start(mark, temporary ? *run_dir : "");
  if (!watchdog.ok()) return Fail(std::string(watchdog.status().message()), 1);
  auto credentials = ResolveCredentials(options, env, plan);
  if (!credentials.ok()) {
    return Fail(std::string(credentials.status().message()), kUsageError);
  }
  Operations operations;
  if (!options.event_log.empty()) {
    auto log = EventLog::Open(options.event_log, [](const std::string& line) {
      // One write: the agent's console threads share stderr.
      const std::string text = absl::StrCat("ctrun: ", line, "\n");
      (void)!write(STDERR_FILENO, text.data(), text.size());
    });
    if (!log.ok()) {
      return Fail(absl::StrCat("--event_log: ", log.status().message()),
                  kUsageError);
    }
    operations.event_log = *std::move(log);
  }
  if (options.metrics_listen) {
    operations.metrics = std::make_shared<RendezvousMetrics>();
  }
  auto rendezvous = ReachRendezvous(options, plan, *credentials, operations);
  if (!rendezvous.ok()) {
    return Fail(std::string(rendezvous.status().message()),
                absl::IsInvalidArgument(rendezvous.status()) ? kUsageError : 1);
  }
  // `ctrun status` with no flag finds a rendezvous only this agent knows
  // the address and token of (a --standalone job's: a port the OS chose, a
  // token made up here).
  if (rendezvous->server && temporary &&
      plan.auth == RendezvousPlan::Auth::kFreshToken) {
    if (auto s = NoteRendezvous(*run_dir, {rendezvous->endpoint, options.run_id,
                                           credentials->token});
        !s.ok()) {
      std::cerr << "ctrun: note: " << s.message()
                << "; `ctrun status` will not find this job\n";
    }
  }
  std::unique_ptr<MetricsEndpoint> metrics;
  if (options.metrics_listen && rendezvous->server) {
    auto started =
        MetricsEndpoint::Start(*options.metrics_listen, *operations.metrics);
    if (!started.ok()) {
      return Fail(
          absl::StrCat("--metrics_listen: ", started.status().message()), 1);
    }
    metrics = *std::move(started);
    std::cerr << "ctrun: metrics of the rendezvous at http://"
              << metrics->endpoint().ToString() << "/metrics\n";
    if (!ResolvesToLoopbackOnly(metrics->endpoint().host)) {
      std::cerr << "ctrun: note: --metrics_listen "
                << metrics->endpoint().ToString()
                << " serves job and node names beyond this machine, without "
                   "a token\n";
    }
  } else if (options.metrics_listen) {
    std::cerr << "ctrun: note: --metrics_listen: this node does not host "
                 "the rendezvous (it is at "
              << rendezvous->endpoint
              << "); the node that hosts it, or its ctrund, serves the "
                 "metrics\n";
  }
  AgentConfig config;
  WorkerGroupConfig& w = config.workers;
  w.store = StoreAccess{rendezvous->endpoint,
                        WorkerToken(credentials->token, options.run_id),
                        credentials->munge, options.tls_ca};
  w.options = std::move(options);
  w.worker_argv = std::move(worker_argv);
  w.env = std::move(env);
  w.env[env::kContainmentMark] = mark;
  w.hostname = Hostname();
  w.name = plan.name;
  w.address = plan.address;
  w.run_dir = *run_dir;
  w.watchdog = &*watchdog;
  config.connection = rendezvous->connection;
  config.event_log = operations.event_log;
  const auto [code, signalled] = RunAgent(std::move(config));
  if (rendezvous->server) {
    if (!signalled) ServeUntilIdle(*rendezvous->server, signals);
    rendezvous->server->Shutdown();
  }
  if (temporary) RemoveRunDirectory(*run_dir);
  return code;
}

// Ends the process once a launch has cleaned up after itself. Static
// destructors (gRPC's, protobuf's, the C++ runtime's) would only free memory
// the kernel takes back anyway, and running them pages in code the run never
// used: half a MiB of the agent's peak memory.
[[noreturn]] void ExitSkippingDestructors(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  // What exit would have checked: everything a launch allocated is freed.
  __lsan_do_leak_check();
#endif
  _exit(code);
}

}  // namespace
}  // namespace ctrun

int main(int argc, char** argv) {
  using namespace ctrun;
  KeepDescriptorsFromWorkers();
  // Debian's Abseil checks lock order on every acquisition; tests keep that
  // on, the launcher does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A console that goes away (ctrun ... | head) must not kill the agent
  // while it has workers; workers get the default disposition back.
  signal(SIGPIPE, SIG_IGN);
  // ctrun never reads the terminal. When local rank 0 (in ctrun's process
  // group) reads it in the background, the kernel stops the whole group:
  // ctrun stays awake to stop and continue the job as one (agent_policy.h).
  signal(SIGTTIN, SIG_IGN);
  signal(SIGTTOU, SIG_IGN);
  EnvMap env = ProcessEnvironment();
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto command = ParseCommandLine(args, env, DetectHostFacts(env));
  if (!command.ok())
    return Fail(std::string(command.status().message()), kUsageError);
  if (command->action == CommandLine::Action::kHelp) {
    std::cout << HelpText();
    return 0;
  }
  if (command->action == CommandLine::Action::kVersion) {
    std::cout << "ctrun " << kCtrunVersion << "\n";
    return 0;
  }
  if (command->action == CommandLine::Action::kStatusHelp) {
    std::cout << StatusHelpText();
    return 0;
  }
  if (command->action == CommandLine::Action::kStatus) {
    return RunStatus(*command, env);
  }
  LaunchOptions& options = command->options;
  const std::string ctrun_dir = OwnExecutableDirectory();
  auto worker_argv = ResolveWorkerCommand(options, env, ctrun_dir);
  if (!worker_argv.ok()) {
    return Fail(std::string(worker_argv.status().message()), kUsageError);
  }
  auto plan = PlanRendezvous(options, Hostname(), env);
  if (!plan.ok()) {
    return Fail(std::string(plan.status().message()), kUsageError);
  }
  if (options.dry_run) {
    std::cout << FormatLaunchPlan(options, *worker_argv);
    if (const PythonChoice python = FindPython(env, ctrun_dir);
        !python.path.empty() && (*worker_argv)[0] == python.path) {
      std::cout << "  python: " << python.path << " (from " << python.source
                << ")\n";
    }
    std::cout << FormatRendezvousPlan(options, *plan);
    return 0;
  }
  const int code = Launch(std::move(options), *plan, std::move(*worker_argv),
                          std::move(env));
  ExitSkippingDestructors(code);
}
