// ctrun: the launcher. Parses torchrun's command line, hosts the
// rendezvous in-process for a single-node job, and runs the agent.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ctrun/environment.h"
#include "launcher/agent.h"
#include "launcher/command_line.h"
#include "launcher/host_facts.h"
#include "launcher/rendezvous_plan.h"
#include "launcher/watchdog.h"
#include "launcher/worker_command.h"
#include "rendezvous/auth.h"
#include "rendezvous/grpc_log.h"
#include "rendezvous/rendezvous_server.h"

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

int Launch(LaunchOptions options, std::vector<std::string> worker_argv,
           EnvMap env) {
  for (const auto& notice : options.notices) {
    std::cerr << "ctrun: note: " << notice << "\n";
  }
  // Signals are taken through the agent's signalfd; blocked before any
  // thread exists so that no thread ever takes them.
  const sigset_t signals = AgentSignals(options.signals_to_handle);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Orphaned grandchildren come to ctrun, which ends them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  auto watchdog = Watchdog::Start();
  if (!watchdog.ok()) return Fail(std::string(watchdog.status().message()), 1);

  // The agent is the in-process rendezvous' only client and says itself
  // what happened; the service's own log would repeat it, on stdout, which
  // belongs to the workers.
  auto logger = spdlog::stderr_color_mt("ctrun");
  logger->set_pattern("ctrun: %v");
  logger->set_level(spdlog::level::off);
  spdlog::set_default_logger(logger);
  RouteGrpcLogsToSpdlog();

  auto plan = PlanRendezvous(options, Hostname());
  if (!plan.ok())
    return Fail(std::string(plan.status().message()), kUsageError);
  std::string token;
  if (!options.token_file.empty()) {
    auto read = ReadTokenFile(options.token_file);
    if (!read.ok()) {
      return Fail(
          absl::StrCat("--rdzv_conf token_file: ", read.status().message()),
          kUsageError);
    }
    token = *read;
  } else if (auto it = env.find(env::kRendezvousToken);
             it != env.end() && !it->second.empty()) {
    token = it->second;
  } else if (plan->host && plan->endpoint.port == 0) {
    token = GenerateToken();  // nobody else needs to know it
  }
  std::optional<MungeAuth> munge;
  if (options.munge_auth) {
    munge = MungeAuth{options.munge_socket, options.run_id};
    // Checked before anything starts, so that a node without munge says so
    // at once rather than as a refusal from the rendezvous.
    if (auto probe = MungeEncode(munge->socket, MungePayload(munge->job_id));
        !probe.ok()) {
      return Fail(absl::StrCat("the Slurm rendezvous authenticates with "
                               "munge, which fails here: ",
                               probe.status().message(),
                               "; or give every node the same token "
                               "(--rdzv_conf token_file=FILE or ",
                               env::kRendezvousToken, ")"),
                  kUsageError);
    }
  }

  // The hosting agent serves the rendezvous in-process and talks to it
  // through the ordinary client, like every other agent.
  std::unique_ptr<RendezvousServer> server;
  if (plan->host) {
    ServerOptions server_options;
    server_options.listen = plan->endpoint;
    server_options.token = token;
    server_options.munge = munge;
    if (!options.tls_cert.empty()) {
      server_options.tls =
          TlsServerFiles{options.tls_cert, options.tls_key, ""};
    }
    auto started = RendezvousServer::Start(server_options);
    if (started.ok()) {
      server = std::move(*started);
    } else if (plan->inferred && absl::IsUnavailable(started.status())) {
      std::cerr << "ctrun: note: " << plan->endpoint.ToString()
                << " is already served here; joining it\n";
    } else {
      return Fail(absl::StrCat("cannot host the rendezvous: ",
                               started.status().message()),
                  1);
    }
  }
  const std::string endpoint =
      server ? server->endpoint().ToString() : plan->endpoint.ToString();
  if (!server) {
    // A hosting agent started at the same moment listens within
    // milliseconds; gRPC would retry a refused connection only after 100.
    // Beyond a second the session's own wait takes over.
    WaitUntilListening(plan->endpoint, absl::Seconds(1));
  }
  ConnectionOptions connection_options;
  connection_options.endpoint = endpoint;
  connection_options.token = token;
  connection_options.munge = munge;
  connection_options.tls_ca_file = options.tls_ca;
  auto connection = Connection::Open(connection_options);
  if (!connection.ok()) {
    return Fail(std::string(connection.status().message()), kUsageError);
  }

  // Per-attempt logs and error files: under --log_dir/RUN_ID, or in a
  // temporary directory ($TMPDIR or /tmp) removed when the job succeeds.
  std::string run_dir;
  bool temporary = false;
  if (!options.log_dir.empty()) {
    run_dir = absl::StrCat(options.log_dir, "/", options.run_id);
    std::error_code ec;
    std::filesystem::create_directories(run_dir, ec);
    if (ec) {
      return Fail(absl::StrCat("--log_dir: cannot create ", run_dir, ": ",
                               ec.message()),
                  kUsageError);
    }
  } else {
    const char* tmp = getenv("TMPDIR");
    std::string dir = absl::StrCat(
        tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/ctrun-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return Fail(absl::StrCat("cannot create a temporary directory like ", dir,
                               ": ", strerror(errno)),
                  1);
    }
    run_dir = dir;
    temporary = true;
  }

  AgentConfig config;
  config.store = StoreAccess{endpoint, token, munge, options.tls_ca};
  config.options = std::move(options);
  config.worker_argv = std::move(worker_argv);
  config.env = std::move(env);
  config.hostname = Hostname();
  config.address = plan->address;
  config.connection = *connection;
  config.run_dir = run_dir;
  config.watchdog = &*watchdog;
  int code;
  bool signalled;
  {
    Agent agent(std::move(config));
    code = agent.Run();
    signalled = agent.stopped_by_signal();
  }
  if (server) {
    // The other nodes still talk to this rendezvous until they leave, unless
    // this node was told to stop: then they lose it (a ctrund avoids that).
    if (!signalled && !server->WaitUntilIdle(absl::ZeroDuration())) {
      std::cerr << "ctrun: keeping the rendezvous at " << endpoint
                << " up until the other nodes have left\n";
      // A terminating signal still ends the wait; the others are ignored.
      const timespec poll{0, 0};
      while (!server->WaitUntilIdle(absl::Milliseconds(100))) {
        siginfo_t info;
        const int sig = sigtimedwait(&signals, &info, &poll);
        if (sig > 0 && sig != SIGCHLD && sig != SIGUSR1 && sig != SIGUSR2) {
          break;
        }
      }
    }
    server->Shutdown();
  }
  // A failed job keeps its error files: the summary points at them.
  if (temporary && code == 0) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
  }
  return code;
}

}  // namespace
}  // namespace ctrun

int main(int argc, char** argv) {
  using namespace ctrun;
  // Debian's Abseil checks lock order on every acquisition; tests keep that
  // on, the launcher does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A console that goes away (ctrun ... | head) must not kill the agent
  // while it has workers; workers get the default disposition back.
  signal(SIGPIPE, SIG_IGN);
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
  LaunchOptions& options = command->options;
  auto worker_argv = ResolveWorkerCommand(options, env);
  if (!worker_argv.ok()) {
    return Fail(std::string(worker_argv.status().message()), kUsageError);
  }
  if (options.dry_run) {
    std::cout << FormatLaunchPlan(options, *worker_argv);
    return 0;
  }
  return Launch(std::move(options), std::move(*worker_argv), std::move(env));
}
