// ctrund: the standalone rendezvous daemon, and `ctrund status`.
//
// The daemon's first line on stdout is "ctrund listening on HOST:PORT" (with
// the real port when --listen asked for port 0), so scripts and tests can
// read where it is. Logs go to stderr. SIGTERM or SIGINT end it cleanly.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ctrun_version.h"
#include "rendezvous/client/client.h"
#include "rendezvous/client/status_report.h"
#include "rendezvous/core/job_settings.h"
#include "rendezvous/durable/journal.h"
#include "rendezvous/etcd/etcd_replica.h"
#include "rendezvous/ops/metrics.h"
#include "rendezvous/rpc/auth.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/grpc_log.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/server/standby_server.h"

namespace ctrun {
namespace {

constexpr int kUsageError = 2;

int Fail(const std::string& message, int code = 1) {
  std::cerr << "ctrund: " << message << "\n";
  return code;
}

// Reads --token-file into `token` (left empty without the flag). False,
// after saying why, when the file is unusable.
bool LoadToken(const std::string& path, std::string* token) {
  if (path.empty()) return true;
  auto read = ReadTokenFile(path);
  if (!read.ok()) {
    Fail(absl::StrCat("--token-file: ", read.status().message()));
    return false;
  }
  *token = *read;
  return true;
}

// Each agent holds a connection: allow as many as the hard limit permits.
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

struct DaemonFlags {
  std::string listen = "127.0.0.1:29400";
  std::string token_file;
  std::string tls_cert, tls_key, tls_client_ca;
  // Signed, so that a negative value is refused rather than wrapped.
  int64_t max_value_bytes = KvStoreLimits{}.max_value_bytes;
  int64_t max_keys = KvStoreLimits{}.max_keys;
  int64_t max_jobs = RendezvousLimits{}.max_jobs;
  int64_t max_job_store_bytes = KvStoreLimits{}.max_job_bytes;
  int64_t max_store_bytes = RendezvousLimits{}.max_store_bytes;
  std::string state_dir;
  std::string fsync = "batch";
  bool state_dir_repair = false;
  double reconnect_grace_s =
      absl::ToDoubleSeconds(ServerOptions{}.reconnect_grace);
  std::string log_level = "info";
  // Replicas on etcd.
  std::string etcd;
  std::string etcd_prefix = "/ctrund/";
  double etcd_lease_ttl_s = 5;
  std::string etcd_cacert, etcd_cert, etcd_key;
  int64_t etcd_max_request_bytes = 1536 << 10;  // etcd's own default
  std::string advertise;
  // Operations.
  std::string metrics_listen;
  std::string event_log;
};

struct StatusFlags {
  std::string endpoint = "127.0.0.1:29400";
  std::string token_file;
  std::string tls_ca, tls_server_name;
  std::string job;
  bool json = false;
  std::string etcd;
  std::string etcd_prefix = "/ctrund/";
  std::string etcd_cacert, etcd_cert, etcd_key;
};

// argv, for a replica that steps down to start itself again.
char** saved_argv = nullptr;
// A stop signal was taken (set by the thread that waits for them): a stop
// wins over every step-down.
std::atomic<bool> stopping{false};

// Ends leadership the only certain way: this process image goes, with every
// session and stream it served, and the same command starts again as a
// standby (same pid; a supervisor sees nothing). Unless a stop was asked
// for: then the replica just ends, having served nothing more.
[[noreturn]] void StepDown(const std::string& why) {
  sigset_t pending;
  sigpending(&pending);
  const bool stop_pending =
      sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1;
  if (stopping.load() || stop_pending) {
    spdlog::error("{}; stopping, as asked, instead of stepping down", why);
    spdlog::default_logger()->flush();
    _exit(0);
  }
  spdlog::error("stepping down: {}; starting again as a standby", why);
  spdlog::default_logger()->flush();
  // The listening socket and every connection must close, whether or not
  // gRPC marked them close-on-exec. Marked, not closed here: gRPC's threads
  // still run and abort on a descriptor closed under them.
  for (int fd = 3; fd < 65536; ++fd) {
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
  execv("/proc/self/exe", saved_argv);
  std::perror("ctrund: cannot start again");
  _exit(1);
}

// Checks the --etcd flags; fills the replica's options.
absl::Status ReplicaOptionsFrom(const DaemonFlags& flags,
                                const Endpoint& listen, ServerOptions* server,
                                ReplicaOptions* replica) {
  if (!flags.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "--state-dir and --etcd exclude each other: with --etcd the state "
        "lives in etcd");
  }
  if (listen.port == 0) {
    return absl::InvalidArgumentError(
        "--listen needs a fixed port with --etcd: clients list the "
        "replicas' addresses");
  }
  if (flags.etcd_prefix.empty() || flags.etcd_prefix.back() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-prefix '", flags.etcd_prefix,
                     "' must end with '/', e.g. /ctrund/ or /team-a/ctrund/"));
  }
  if (!(flags.etcd_lease_ttl_s >= 2 && flags.etcd_lease_ttl_s <= 300)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-lease-ttl ", flags.etcd_lease_ttl_s,
        " must be a number of seconds in [2, 300] (etcd's shortest lease "
        "is about 2 s)"));
  }
  constexpr int64_t kRoom = 64 << 10;  // for keys and the transaction
  if (flags.etcd_max_request_bytes < 2 * kRoom ||
      flags.etcd_max_request_bytes > (int64_t{2} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-max-request-bytes ", flags.etcd_max_request_bytes,
                     " must be in ", 2 * kRoom, "..", int64_t{2} << 30));
  }
  if (flags.max_value_bytes + kRoom > flags.etcd_max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-value-bytes ", flags.max_value_bytes,
        " does not fit in one etcd request of --etcd-max-request-bytes ",
        flags.etcd_max_request_bytes,
        " (etcd's --max-request-bytes); lower it, or raise both"));
  }
  // A store request must fit in one etcd write.
  server->max_message_bytes =
      static_cast<size_t>(flags.etcd_max_request_bytes - kRoom / 2);
  replica->etcd.endpoints = flags.etcd;
  replica->etcd.ca_file = flags.etcd_cacert;
  replica->etcd.cert_file = flags.etcd_cert;
  replica->etcd.key_file = flags.etcd_key;
  replica->prefix = flags.etcd_prefix;
  replica->lease_ttl = absl::Seconds(flags.etcd_lease_ttl_s);
  if (!flags.advertise.empty()) {
    auto advertised = ParseEndpoint(flags.advertise);
    if (!advertised.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--advertise: ", advertised.status().message()));
    }
    replica->address = advertised->ToString();
  } else if (listen.host == "0.0.0.0" || listen.host == "::") {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    replica->address = Endpoint{host, listen.port}.ToString();
  } else {
    replica->address = listen.ToString();
  }
  replica->step_down = StepDown;
  return absl::OkStatus();
}

// One replica of a ctrund on etcd: stands by until it leads, then serves
// until a signal (handing leadership over) or until it must step down.
int RunReplica(const DaemonFlags& flags, ServerOptions options,
               ReplicaOptions replica_options, const sigset_t& stop_signals) {
  auto replica = EtcdReplica::Create(std::move(replica_options));
  if (!replica.ok()) {
    return Fail(absl::StrCat("--etcd: ", replica.status().message()),
                kUsageError);
  }
  if (auto s = (*replica)->CheckPrefix(); absl::IsFailedPrecondition(s)) {
    return Fail(absl::StrCat("--etcd-prefix: ", s.message()), 1);
  } else if (!s.ok()) {
    spdlog::warn("cannot check --etcd-prefix {} yet: {}", flags.etcd_prefix,
                 std::string(s.message()));
  }
  // Listening from the start, not only once leading: clients that reach a
  // standby are sent on to the leader at once, named from the first answer.
  (*replica)->LookUpLeader();
  auto standby =
      StandbyServer::Start({options.listen, options.tls,
                            [r = replica->get()] { return r->Leader(); }});
  if (!standby.ok()) return Fail(std::string(standby.status().message()));
  const std::string listen = options.listen.ToString();
  std::printf("ctrund standing by to serve %s (etcd %s)\n", listen.c_str(),
              (*replica)->client().endpoints().c_str());
  std::fflush(stdout);
  absl::Notification stop;
  std::unique_ptr<RendezvousServer> server;
  absl::Mutex server_mu;
  std::thread leader([&] {
    if (!(*replica)->Campaign(&stop)) return;
    (*standby)->Shutdown();  // the port is the leader's now
    options.state_log = (*replica)->LogOpener(
        static_cast<size_t>(flags.etcd_max_request_bytes));
    options.state_where = "etcd";
    options.may_serve = [r = replica->get()] { return r->MayServe(); };
    auto started = RendezvousServer::Start(std::move(options));
    if (!started.ok() && absl::IsFailedPrecondition(started.status())) {
      // Keys that do not restore stay so: campaigning again would lead,
      // fail and step down every lease period, for ever.
      spdlog::critical(
          "cannot serve: {}; this does not heal by itself: "
          "stopping (exit 1)",
          std::string(started.status().message()));
      (*replica)->Resign();
      spdlog::default_logger()->flush();
      _exit(1);
    }
    if (!started.ok()) {
      absl::SleepFor(absl::Seconds(1));  // not a hot loop when etcd fails
      StepDown(absl::StrCat("cannot serve: ", started.status().message()));
    }
    absl::MutexLock lock(&server_mu);
    server = *std::move(started);
    std::printf("ctrund listening on %s\n",
                server->endpoint().ToString().c_str());
    std::fflush(stdout);
    spdlog::info("serving on {}{}{}", server->endpoint().ToString(),
                 flags.token_file.empty() ? ", no token" : ", token required",
                 flags.tls_cert.empty() ? "" : ", TLS");
  });
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  stopping = true;
  spdlog::info("stopping on {}", strsignal(signal_number));
  stop.Notify();
  leader.join();
  (*standby)->Shutdown();
  absl::MutexLock lock(&server_mu);
  if (server) {
    server->Shutdown();
    (*replica)->Resign();
  }
  spdlog::info("stopped");
  return 0;
}

// --listen, --token-file and the TLS flags. This and the Take* below
// fill their part of `options` from the flags: 0, or the exit code after
// saying what is wrong.
int TakeTransport(const DaemonFlags& flags, ServerOptions* options) {
  auto listen = ParseEndpoint(flags.listen);
  if (!listen.ok()) {
    return Fail(absl::StrCat("--listen: ", listen.status().message()),
                kUsageError);
  }
  options->listen = *listen;
  if (!LoadToken(flags.token_file, &options->token)) return kUsageError;
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return Fail("--tls-cert and --tls-key go together", kUsageError);
  }
  if (!flags.tls_cert.empty()) {
    options->tls =
        TlsServerFiles{flags.tls_cert, flags.tls_key, flags.tls_client_ca};
  } else if (!flags.tls_client_ca.empty()) {
    return Fail("--tls-client-ca needs --tls-cert and --tls-key", kUsageError);
  }
  return 0;
}

// The store and job limits.
int TakeLimits(const DaemonFlags& flags, ServerOptions* options) {
  constexpr int64_t kMaxBytes = int64_t{1} << 50;
  struct Limit {
    const char* flag;
    int64_t value;
    int64_t max;
  };
  // A value must fit in one gRPC message (2 GiB) twice over.
  for (const Limit& l :
       {Limit{"--max-value-bytes", flags.max_value_bytes, int64_t{512} << 20},
        Limit{"--max-keys", flags.max_keys, 100'000'000},
        Limit{"--max-jobs", flags.max_jobs, 1'000'000},
        Limit{"--max-job-store-bytes", flags.max_job_store_bytes, kMaxBytes},
        Limit{"--max-store-bytes", flags.max_store_bytes, kMaxBytes}}) {
    if (l.value < 1 || l.value > l.max) {
      return Fail(absl::StrCat(l.flag, " ", l.value, " must be in 1..", l.max),
                  kUsageError);
    }
  }
  options->limits.store.max_value_bytes =
      static_cast<size_t>(flags.max_value_bytes);
  options->limits.store.max_keys = static_cast<size_t>(flags.max_keys);
  options->limits.max_jobs = static_cast<size_t>(flags.max_jobs);
  options->limits.store.max_job_bytes =
      static_cast<size_t>(flags.max_job_store_bytes);
  options->limits.max_store_bytes = static_cast<size_t>(flags.max_store_bytes);
  return 0;
}

// --fsync, --state-dir and --reconnect-grace.
int TakeState(const DaemonFlags& flags, ServerOptions* options) {
  auto fsync = ParseFsyncPolicy(flags.fsync);
  if (!fsync.ok()) {
    return Fail(absl::StrCat("--fsync: ", fsync.status().message()),
                kUsageError);
  }
  if (flags.state_dir.empty() && flags.state_dir_repair) {
    return Fail("--state-dir-repair needs --state-dir", kUsageError);
  }
  options->fsync = *fsync;
  if (!(flags.reconnect_grace_s > 0 && flags.reconnect_grace_s <= 86400)) {
    return Fail(absl::StrCat("--reconnect-grace ", flags.reconnect_grace_s,
                             " must be a number of seconds in (0, 86400]"),
                kUsageError);
  }
  if (!flags.state_dir.empty()) {
    auto files = StateFilesFromEnvironment();
    if (!files.ok()) return Fail(std::string(files.status().message()));
    options->state_log = JournalOpener(flags.state_dir, flags.state_dir_repair,
                                       *std::move(files));
    options->state_where = absl::StrCat(flags.state_dir, "/journal (fsync ",
                                        FsyncPolicyName(options->fsync), ")");
  }
  options->reconnect_grace = absl::Seconds(flags.reconnect_grace_s);
  return 0;
}

// --metrics-listen and --event-log. With the former, Prometheus metrics in
// `options` and `*metrics`, the address to serve them on in `*listen`.
int TakeOps(const DaemonFlags& flags, ServerOptions* options,
            std::shared_ptr<RendezvousMetrics>* metrics,
            std::optional<Endpoint>* listen) {
  if (!flags.metrics_listen.empty()) {
    auto parsed = ParseMetricsListen(flags.metrics_listen);
    if (!parsed.ok()) {
      return Fail(absl::StrCat("--metrics-listen=", flags.metrics_listen, ": ",
                               parsed.status().message()),
                  kUsageError);
    }
    *listen = *parsed;
    *metrics = std::make_shared<RendezvousMetrics>();
    options->metrics = *metrics;
  }
  if (!flags.event_log.empty()) {
    auto log = EventLog::Open(flags.event_log, [](const std::string& line) {
      spdlog::error("{}", line);
    });
    if (!log.ok()) {
      return Fail(absl::StrCat("--event-log: ", log.status().message()),
                  kUsageError);
    }
    options->event_log = *std::move(log);
  }
  return 0;
}

// Serves until a stop signal: the metrics endpoint first, then the service
// or, with --etcd, a replica.
int Serve(const DaemonFlags& flags, spdlog::level::level_enum level,
          ServerOptions options, ReplicaOptions replica,
          std::shared_ptr<const RendezvousMetrics> prometheus,
          const std::optional<Endpoint>& metrics_listen) {
  auto logger = spdlog::stderr_color_mt("ctrund");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [ctrund] [%l] %v");
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  RouteGrpcLogsToSpdlog();
  RaiseFileLimit();

  // Signals are taken by sigwait below, never by a handler; blocked before
  // any thread starts so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Up before the service, and on standby replicas too: a scrape tells a
  // standby from a dead replica.
  std::unique_ptr<MetricsEndpoint> metrics;
  if (metrics_listen) {
    auto started = MetricsEndpoint::Start(*metrics_listen, *prometheus);
    if (!started.ok()) {
      return Fail(
          absl::StrCat("--metrics-listen: ", started.status().message()));
    }
    metrics = *std::move(started);
    spdlog::info("metrics on http://{}/metrics",
                 metrics->endpoint().ToString());
    if (!ResolvesToLoopbackOnly(metrics->endpoint().host)) {
      spdlog::warn(
          "--metrics-listen {} serves job and node names beyond this "
          "machine, without a token",
          metrics->endpoint().ToString());
    }
  }
  if (!flags.etcd.empty()) {
    return RunReplica(flags, std::move(options), std::move(replica),
                      stop_signals);
  }
  auto server = RendezvousServer::Start(std::move(options));
  if (!server.ok()) return Fail(std::string(server.status().message()));
  std::printf("ctrund listening on %s\n",
              (*server)->endpoint().ToString().c_str());
  std::fflush(stdout);
  spdlog::info("serving on {}{}{}", (*server)->endpoint().ToString(),
               flags.token_file.empty() ? ", no token" : ", token required",
               flags.tls_cert.empty() ? "" : ", TLS");

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("stopping on {}", strsignal(signal_number));
  (*server)->Shutdown();
  spdlog::info("stopped");
  return 0;
}

int RunDaemon(const DaemonFlags& flags) {
  auto level = spdlog::level::from_str(flags.log_level);
  if (level == spdlog::level::off && flags.log_level != "off") {
    return Fail(absl::StrCat("--log-level '", flags.log_level,
                             "' is not one of trace, debug, info, warn, "
                             "error, off"),
                kUsageError);
  }
  ServerOptions options;
  std::shared_ptr<RendezvousMetrics> prometheus;
  std::optional<Endpoint> metrics_listen;
  if (int code = TakeTransport(flags, &options)) return code;
  if (int code = TakeLimits(flags, &options)) return code;
  if (int code = TakeState(flags, &options)) return code;
  if (int code = TakeOps(flags, &options, &prometheus, &metrics_listen)) {
    return code;
  }
  ReplicaOptions replica;
  if (!flags.etcd.empty()) {
    if (auto s = ReplicaOptionsFrom(flags, options.listen, &options, &replica);
        !s.ok()) {
      return Fail(std::string(s.message()), kUsageError);
    }
  }
  return Serve(flags, level, std::move(options), std::move(replica),
               std::move(prometheus), metrics_listen);
}

struct JobTokenFlags {
  std::string token_file;
  std::string job;
};

int RunJobToken(const JobTokenFlags& flags) {
  std::string secret;
  if (!LoadToken(flags.token_file, &secret)) return kUsageError;
  if (auto s = CheckJobId(flags.job); !s.ok()) {
    return Fail(absl::StrCat("--job: ", s.message()), kUsageError);
  }
  std::cout << JobToken(secret, flags.job) << "\n";
  return 0;
}

// Says which replica of a ctrund on etcd leads, and since when; sets
// `*endpoint` to it unless --endpoint was given. False (having said why)
// when etcd cannot say.
bool PrintLeader(const StatusFlags& flags, bool endpoint_given,
                 std::string* endpoint) {
  EtcdOptions options;
  options.endpoints = flags.etcd;
  options.ca_file = flags.etcd_cacert;
  options.cert_file = flags.etcd_cert;
  options.key_file = flags.etcd_key;
  auto client = EtcdClient::Open(options);
  if (!client.ok()) {
    Fail(absl::StrCat("--etcd: ", client.status().message()));
    return false;
  }
  auto leader = ReadLeader(**client, flags.etcd_prefix);
  if (!leader.ok()) {
    Fail(absl::StrCat("cannot read who leads: ", leader.status().message()));
    return false;
  }
  if (!leader->has_value()) {
    Fail(absl::StrCat("no replica leads (etcd at ", flags.etcd, " has no ",
                      flags.etcd_prefix,
                      "leader key): are the replicas running, with this "
                      "--etcd-prefix?"));
    return false;
  }
  const LeaderRecord& record = **leader;
  std::cout << "leader: " << record.address << ", since "
            << absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", record.since,
                                absl::UTCTimeZone())
            << " ("
            << absl::FormatDuration(
                   absl::Trunc(absl::Now() - record.since, absl::Seconds(1)))
            << ")\n";
  if (!endpoint_given) *endpoint = record.address;
  return true;
}

int RunStatus(const StatusFlags& flags, bool endpoint_given) {
  std::string endpoint = flags.endpoint;
  if (!flags.etcd.empty() && !PrintLeader(flags, endpoint_given, &endpoint)) {
    return 1;
  }
  ConnectionOptions options;
  options.endpoint = endpoint;
  options.tls_ca_file = flags.tls_ca;
  options.tls_server_name = flags.tls_server_name;
  if (!LoadToken(flags.token_file, &options.token)) return kUsageError;
  auto connection = Connection::Open(options);
  if (!connection.ok()) {
    return Fail(absl::StrCat("--endpoint: ", connection.status().message()),
                kUsageError);
  }
  AdminClient admin(*connection);
  auto jobs = FetchJobs(admin, flags.job);
  if (!jobs.ok()) {
    return Fail(absl::StrCat(
        flags.job.empty()
            ? std::string("cannot list jobs")
            : absl::StrCat("cannot describe job '", flags.job, "'"),
        " at ", endpoint, ": ", jobs.status().ToString()));
  }
  PrintJobs(*jobs, flags.json, *connection, endpoint, std::cout, std::cerr);
  return 0;
}

// ctrund's own flags, into `daemon`.
void AddDaemonFlags(CLI::App& app, DaemonFlags& daemon) {
  app.add_option("--listen", daemon.listen,
                 "HOST:PORT to serve on; port 0 picks a free one")
      ->capture_default_str();
  app.add_option("--token-file", daemon.token_file,
                 "file holding the shared secret every client must send "
                 "(required beyond loopback)");
  app.add_option("--tls-cert", daemon.tls_cert, "PEM certificate chain (TLS)");
  app.add_option("--tls-key", daemon.tls_key, "PEM private key (TLS)");
  app.add_option("--tls-client-ca", daemon.tls_client_ca,
                 "PEM CA that client certificates must chain to (mutual TLS)");
  app.add_option("--max-value-bytes", daemon.max_value_bytes,
                 "largest store value")
      ->capture_default_str();
  app.add_option("--max-keys", daemon.max_keys, "most store keys per job")
      ->capture_default_str();
  app.add_option("--max-jobs", daemon.max_jobs, "most jobs at once")
      ->capture_default_str();
  app.add_option("--max-job-store-bytes", daemon.max_job_store_bytes,
                 "most bytes (keys plus values) in one job's store")
      ->capture_default_str();
  app.add_option("--max-store-bytes", daemon.max_store_bytes,
                 "most bytes (keys plus values) in the stores of all jobs")
      ->capture_default_str();
  app.add_option("--state-dir", daemon.state_dir,
                 "directory to keep jobs and store contents in, so that a "
                 "restarted daemon resumes them (one daemon per directory)");
  app.add_option("--fsync", daemon.fsync,
                 "when changes reach the disk before they are answered: "
                 "always (each on its own), batch (concurrent ones share a "
                 "sync) or never (they outlive a crash of ctrund, not of the "
                 "machine)")
      ->capture_default_str();
  app.add_flag("--state-dir-repair", daemon.state_dir_repair,
               "start from a journal damaged before its end: keep a copy of "
               "it, drop the damaged records and restore the whole ones");
  app.add_option("--reconnect-grace", daemon.reconnect_grace_s,
                 "seconds that agents of restored jobs have to come back "
                 "before they count as lost")
      ->capture_default_str();
  app.add_option("--log-level", daemon.log_level,
                 "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_option("--etcd", daemon.etcd,
                 "HOST:PORT[,HOST:PORT...] of etcd (v3 API): run as one of "
                 "several replicas that keep the state in etcd; one leads "
                 "and serves, the others stand by and take over when it is "
                 "lost (clients list every replica: --rdzv_endpoint="
                 "h1:29400,h2:29400,h3:29400)");
  app.add_option("--etcd-prefix", daemon.etcd_prefix,
                 "etcd key prefix of this deployment, so that several can "
                 "share one etcd")
      ->capture_default_str();
  app.add_option("--etcd-lease-ttl", daemon.etcd_lease_ttl_s,
                 "seconds a leader's etcd lease lasts unrenewed: a standby "
                 "takes over about this long after the leader is lost, and "
                 "a leader that cannot renew stops serving after two thirds "
                 "of it")
      ->capture_default_str();
  app.add_option("--etcd-cacert", daemon.etcd_cacert,
                 "PEM CA to verify etcd with (TLS to etcd)");
  app.add_option("--etcd-cert", daemon.etcd_cert,
                 "PEM client certificate for etcd");
  app.add_option("--etcd-key", daemon.etcd_key, "PEM client key for etcd");
  app.add_option("--etcd-max-request-bytes", daemon.etcd_max_request_bytes,
                 "the largest request etcd accepts (etcd's "
                 "--max-request-bytes); bounds store requests")
      ->capture_default_str();
  app.add_option("--advertise", daemon.advertise,
                 "HOST:PORT at which clients reach this replica, as "
                 "`ctrund status` shows the leader (default: --listen)");
  app.add_option("--metrics-listen,--metrics_listen", daemon.metrics_listen,
                 "HOST:PORT (or PORT, on 127.0.0.1) to serve Prometheus "
                 "metrics on, at /metrics (docs/metrics.md)");
  app.add_option("--event-log,--event_log", daemon.event_log,
                 "file to append the jobs' events to, one JSON object per "
                 "line (docs/events.md)");
}

// `ctrund status` and its flags, into `status`.
CLI::App* AddStatusCommand(CLI::App& app, StatusFlags& status) {
  CLI::App* status_cmd = app.add_subcommand(
      "status", "print the jobs, rounds and nodes of a running rendezvous");
  status_cmd
      ->add_option("--endpoint", status.endpoint, "HOST:PORT of the service")
      ->capture_default_str();
  status_cmd->add_option("--job", status.job, "show only this job");
  status_cmd->add_flag("--json", status.json, "print JSON instead of a table");
  status_cmd->add_option("--token-file", status.token_file,
                         "file holding the service's token");
  status_cmd->add_option("--tls-ca", status.tls_ca,
                         "PEM roots to verify the service (TLS)");
  status_cmd->add_option("--tls-server-name", status.tls_server_name,
                         "name to check in the service's certificate");
  status_cmd->add_option("--etcd", status.etcd,
                         "HOST:PORT[,...] of the etcd of ctrund replicas: "
                         "say which replica leads and since when, and ask "
                         "it (unless --endpoint is given)");
  status_cmd
      ->add_option("--etcd-prefix", status.etcd_prefix,
                   "the replicas' etcd key prefix")
      ->capture_default_str();
  status_cmd->add_option("--etcd-cacert", status.etcd_cacert,
                         "PEM CA to verify etcd with");
  status_cmd->add_option("--etcd-cert", status.etcd_cert,
                         "PEM client certificate for etcd");
  status_cmd->add_option("--etcd-key", status.etcd_key,
                         "PEM client key for etcd");
  return status_cmd;
}

// `ctrund job-token` and its flags, into `job_token`.
CLI::App* AddJobTokenCommand(CLI::App& app, JobTokenFlags& job_token) {
  CLI::App* job_token_cmd = app.add_subcommand(
      "job-token",
      "print a token that admits one job only (its agents and workers "
      "cannot reach other jobs), derived from the service's token");
  job_token_cmd
      ->add_option("--token-file", job_token.token_file,
                   "file holding the service's token")
      ->required();
  job_token_cmd->add_option("--job", job_token.job, "the job's rendezvous id")
      ->required();
  return job_token_cmd;
}

}  // namespace
}  // namespace ctrun

int main(int argc, char** argv) {
  using namespace ctrun;
  saved_argv = argv;
  // Debian's Abseil checks every lock order at run time, which costs more
  // than the locking itself with thousands of sessions; tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{
      "ctrund: the ctrun rendezvous daemon. Agents (ctrun "
      "--rdzv_endpoint=HOST:PORT) meet here to get their ranks; workers use "
      "its key-value store."};
  app.set_version_flag("--version", absl::StrCat("ctrund ", kCtrunVersion));
  DaemonFlags daemon;
  AddDaemonFlags(app, daemon);
  StatusFlags status;
  CLI::App* status_cmd = AddStatusCommand(app, status);
  JobTokenFlags job_token;
  CLI::App* job_token_cmd = AddJobTokenCommand(app, job_token);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ctrund: " << e.what() << " (see ctrund --help)\n";
    return kUsageError;
  }
  if (status_cmd->parsed()) {
    return RunStatus(status, status_cmd->count("--endpoint") > 0);
  }
  if (job_token_cmd->parsed()) return RunJobToken(job_token);
  return RunDaemon(daemon);
}
