// rdzv_bench: load generator for one ctrund.
//
//   rdzv_bench rendezvous --ctrund PATH --agents N
//       N simulated agents, each on its own TCP connection, join one job of
//       N nodes. Reports the time from the first join to the last
//       assignment, the daemon's CPU seconds over the run and its peak RSS.
//   rdzv_bench store --ctrund PATH --clients C --seconds S
//       C clients (threads, own connections) doing blocking get (then set)
//       in a loop; reports operations per second.
//   rdzv_bench fsync --ctrund PATH --clients C --seconds S --state-dir DIR
//       blocking sets, as `store` does, against a daemon without state and
//       one with DIR for each --fsync policy (never, batch, always).
//   rdzv_bench broadcast --ctrund PATH --waiters N
//       N waiting gets parked on one key, then one set; reports the time
//       from the set to the last waiter's answer.
//   rdzv_bench demo --ctrund PATH --agents N
//       rendezvous of N agents that prints every assignment.
//   rdzv_bench etcd-floor --clients C --seconds S --etcd ENDPOINTS
//       The floor of the store on etcd: C clients (threads, own channels)
//       each putting 64-byte values to its own key in a loop, straight to
//       etcd, waiting for each answer; reports puts per second. A set that
//       is answered only once it is in etcd cannot be faster per client.
//   rdzv_bench failover --ctrund PATH --agents N --etcd ENDPOINTS
//       two replicas on etcd; N agents join, the leader is killed (-9), and
//       each agent resumes its session, as ctrun does, on the endpoint
//       list. Reports the time from the kill to the last agent resumed.
//
// With --etcd ENDPOINTS (a running etcd), the rendezvous and store modes
// run against a ctrund replica on it (alone, so leading) instead of a
// daemon without state, each run under its own key prefix.
//
// Each run starts its own daemon on 127.0.0.1:0 and ends it by pid. Output:
// one JSON object per line, for bench/run-all.sh and bench/report.py.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "launcher/workers/proc.h"
#include "rendezvous/client/client.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/rpc/endpoint.h"

namespace ctrun::bench {
namespace {

[[noreturn]] void Die(const std::string& message) {
  std::cerr << "rdzv_bench: " << message << "\n";
  std::exit(1);
}

void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// --etcd: the etcd that daemons keep their state in, when set.
std::string etcd_endpoints;

int FreePort() {
  auto port = BindFreePort("127.0.0.1");
  if (!port.ok()) Die(port.status().ToString());
  return *port;
}

// A ctrund process on 127.0.0.1:0 (with --etcd: a replica on a free port,
// under a key prefix of its own unless `prefix` is given), killed on
// destruction.
class DaemonProcess {
 public:
  explicit DaemonProcess(const std::string& path,
                         std::vector<std::string> extra = {},
                         const std::string& prefix = "") {
    static int made = 0;
    std::vector<std::string> argv = {path, "--log-level", "warn"};
    if (etcd_endpoints.empty()) {
      listen_ = "127.0.0.1:0";
      argv.insert(argv.end(), {"--listen", listen_});
    } else {
      listen_ = absl::StrCat("127.0.0.1:", FreePort());
      argv.insert(argv.end(),
                  {"--listen", listen_, "--etcd", etcd_endpoints,
                   "--etcd-lease-ttl", "2", "--etcd-prefix",
                   prefix.empty() ? absl::StrCat("/rdzv-bench/", getpid(), "-",
                                                 made++, "/")
                                  : prefix});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) Die("pipe failed");
    pid_ = fork();
    if (pid_ < 0) Die("fork failed");
    if (pid_ == 0) {
      // The daemon must not outlive a bench that crashed or was killed.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(out[1], STDOUT_FILENO);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, STDERR_FILENO);
      close(out[0]);
      execv(path.c_str(), args.data());
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
  }

  // Waits for the "listening" line: at once for a daemon alone, when it
  // leads for a replica.
  void WaitServing() {
    const std::string prefix = "ctrund listening on ";
    while (endpoint_.empty()) {
      std::string line;
      char c;
      while (read(out_, &c, 1) == 1 && c != '\n') line += c;
      if (line.empty()) Die("ctrund ended before it served");
      if (line.rfind(prefix, 0) == 0) endpoint_ = line.substr(prefix.size());
    }
  }
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }

  const std::string& endpoint() const { return endpoint_; }
  // --listen as given: a replica's address before it serves.
  const std::string& listen() const { return listen_; }

  // utime + stime in seconds, from /proc.
  double CpuSeconds() const {
    const std::string stat =
        ReadProcFile(absl::StrCat("/proc/", pid_, "/stat"));
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    long utime = 0, stime = 0;
    for (int i = 3; fields >> f; ++i) {
      if (i == 14) utime = std::stol(f);
      if (i == 15) {
        stime = std::stol(f);
        break;
      }
    }
    return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
  }
  // Peak resident set size in MiB.
  double PeakRssMiB() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) {
        return std::stod(line.substr(6)) / 1024.0;
      }
    }
    return 0;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string listen_;
  std::string endpoint_;
};

// A daemon that serves (see WaitServing).
std::unique_ptr<DaemonProcess> ServingDaemon(
    const std::string& path, std::vector<std::string> extra = {}) {
  auto daemon = std::make_unique<DaemonProcess>(path, std::move(extra));
  daemon->WaitServing();
  return daemon;
}

Connection Connect(const std::string& endpoint) {
  ConnectionOptions options;
  options.endpoint = endpoint;
  options.own_tcp_connection = true;
  auto c = Connection::Open(options);
  if (!c.ok()) Die(c.status().ToString());
  c->channel()->WaitForConnected(
      absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return *c;
}

v1::Join MakeJoin(const std::string& job, int i, int nodes) {
  v1::Join join;
  join.set_job_id(job);
  join.mutable_node()->set_hostname(absl::StrCat("sim-", i));
  join.mutable_node()->set_pid(getpid());
  join.mutable_node()->set_incarnation(static_cast<uint64_t>(i) + 1);
  join.set_address("127.0.0.1");
  join.set_local_world_size(8);
  join.set_node_rank_hint(-1);
  join.set_master_port_candidate(29500);
  join.mutable_settings()->set_min_nodes(nodes);
  join.mutable_settings()->set_max_nodes(nodes);
  // Simulated agents do not heartbeat; the runs are far shorter than this.
  join.mutable_settings()->set_heartbeat_timeout_ms(600'000);
  return join;
}

int Rendezvous(const std::string& ctrund, int agents, bool print) {
  auto serving = ServingDaemon(ctrund);
  DaemonProcess& daemon = *serving;
  const absl::Time connect_start = absl::Now();
  std::vector<Connection> connections;
  connections.reserve(agents);
  for (int i = 0; i < agents; ++i) {
    connections.push_back(Connect(daemon.endpoint()));
  }
  const absl::Duration connect_time = absl::Now() - connect_start;

  absl::Mutex mu;
  int assigned = 0;
  absl::Time last;
  std::vector<v1::Assignment> assignments(agents);
  const double cpu_before = daemon.CpuSeconds();
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<SessionStream>> streams;
  streams.reserve(agents);
  for (int i = 0; i < agents; ++i) {
    SessionStream::Handlers handlers;
    handlers.on_message = [&, i](const v1::ServerMessage& m) {
      if (!m.has_assignment()) return;
      absl::MutexLock lock(&mu);
      assignments[i] = m.assignment();
      ++assigned;
      last = absl::Now();
    };
    streams.push_back(SessionStream::Start(
        connections[i], MakeJoin("bench", i, agents), handlers));
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return assigned == agents;
    };
    if (!mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(120))) {
      Die(absl::StrCat("only ", assigned, " of ", agents,
                       " agents were assigned within 120 s"));
    }
  }
  const double cpu = daemon.CpuSeconds() - cpu_before;
  if (print) {
    std::printf("ctrund on %s: %d agents of 8 workers joined job 'bench'\n",
                daemon.endpoint().c_str(), agents);
    for (int i = 0; i < agents; ++i) {
      const auto& a = assignments[i];
      std::printf(
          "agent sim-%d: group rank %d of %d, ranks %d-%d of world %d, "
          "master %s:%d\n",
          i, a.group_rank(), a.group_world_size(), a.first_global_rank(),
          a.first_global_rank() + 7, a.world_size(), a.master_addr().c_str(),
          a.master_port());
    }
  }
  for (auto& s : streams) s->Close();
  for (auto& s : streams) s->Wait().IgnoreError();
  if (print) return 0;
  std::printf(
      "{\"bench\":\"rendezvous\",\"agents\":%d,\"all_assigned_ms\":%.2f,"
      "\"connect_ms\":%.2f,\"daemon_cpu_s\":%.3f,\"daemon_peak_rss_mib\":%.1f}"
      "\n",
      agents, absl::ToDoubleMilliseconds(last - start),
      absl::ToDoubleMilliseconds(connect_time), cpu, daemon.PeakRssMiB());
  return 0;
}

// A one-node job so that the store has a scope; returns its session.
std::unique_ptr<SessionStream> OpenJob(const Connection& c) {
  absl::Notification assigned;
  SessionStream::Handlers handlers;
  handlers.on_message = [&assigned](const v1::ServerMessage& m) {
    if (m.has_assignment() && !assigned.HasBeenNotified()) assigned.Notify();
  };
  auto stream = SessionStream::Start(c, MakeJoin("bench", 0, 1), handlers);
  if (!assigned.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    Die("the store job was not assigned");
  }
  return stream;
}

// Calls of `call(client)` per second, by `clients` threads calling it in a
// loop for `seconds`.
double CallsPerSecond(int clients, double seconds,
                      const std::function<void(int)>& call) {
  std::atomic<bool> stop{false};
  std::atomic<long> calls{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      long n = 0;
      for (; !stop; ++n) call(i);
      calls += n;
    });
  }
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  return static_cast<double>(calls) /
         absl::ToDoubleSeconds(absl::Now() - start);
}

// Blocking `get`s of one key, or `set`s of 64-byte values (each client its
// own key), by `clients` clients on their own connections for `seconds`;
// operations per second.
double OpsPerSecond(const DaemonProcess& daemon, bool get, int clients,
                    double seconds) {
  std::vector<std::unique_ptr<StoreClient>> stores;
  for (int i = 0; i < clients; ++i) {
    stores.push_back(
        std::make_unique<StoreClient>(Connect(daemon.endpoint()), "bench", 0));
  }
  if (!stores[0]->Set("key", std::string(64, 'v')).ok()) Die("set failed");
  const std::string value(64, 'v');
  return CallsPerSecond(clients, seconds, [&](int i) {
    const std::string key = get ? "key" : absl::StrCat("key", i);
    const absl::Status s =
        get ? stores[i]->Get(key).status() : stores[i]->Set(key, value);
    if (!s.ok()) Die("store operation failed: " + s.ToString());
  });
}

int Store(const std::string& ctrund, int clients, double seconds) {
  auto serving = ServingDaemon(ctrund);
  DaemonProcess& daemon = *serving;
  auto session = OpenJob(Connect(daemon.endpoint()));
  for (const char* op : {"get", "set"}) {
    const double per_second =
        OpsPerSecond(daemon, std::string(op) == "get", clients, seconds);
    std::printf(
        "{\"bench\":\"store\",\"op\":\"%s\",\"clients\":%d,\"ops_per_s\":%.0f}"
        "\n",
        op, clients, per_second);
    std::fflush(stdout);
  }
  session->Close();
  session->Wait().IgnoreError();
  return 0;
}

int EtcdFloor(int clients, double seconds) {
  if (etcd_endpoints.empty()) Die("etcd-floor needs --etcd ENDPOINTS");
  std::vector<std::unique_ptr<EtcdClient>> etcds;
  for (int i = 0; i < clients; ++i) {
    EtcdOptions options;
    options.endpoints = etcd_endpoints;
    auto client = EtcdClient::Open(options);
    if (!client.ok()) Die(client.status().ToString());
    etcds.push_back(std::move(*client));
  }
  const std::string prefix = absl::StrCat("/rdzv_bench/floor/", getpid(), "/");
  std::vector<etcdserverpb::TxnRequest> puts(clients);
  for (int i = 0; i < clients; ++i) {
    auto* put = puts[i].add_success()->mutable_request_put();
    put->set_key(absl::StrCat(prefix, i));
    put->set_value(std::string(64, 'v'));
  }
  const double per_second = CallsPerSecond(clients, seconds, [&](int i) {
    if (auto s = etcds[i]->Txn(puts[i]); !s.ok()) Die(s.status().ToString());
  });
  etcdserverpb::TxnRequest clean;
  auto* range = clean.add_success()->mutable_request_delete_range();
  range->set_key(prefix);
  range->set_range_end(PrefixEnd(prefix));
  etcds[0]->Txn(clean).IgnoreError();
  std::printf(
      "{\"bench\":\"store\",\"op\":\"etcd-put\",\"clients\":%d,"
      "\"ops_per_s\":%.0f}\n",
      clients, per_second);
  return 0;
}

int Fsync(const std::string& ctrund, int clients, double seconds,
          const std::string& state_dir) {
  if (state_dir.empty()) Die("fsync needs --state-dir DIR");
  for (const char* policy : {"none", "never", "batch", "always"}) {
    std::vector<std::string> flags;
    const std::string dir = absl::StrCat(state_dir, "/", policy);
    if (std::string(policy) != "none") {
      std::filesystem::create_directories(state_dir);
      flags = {"--state-dir", dir, "--fsync", policy};
    }
    double per_second;
    {
      auto serving = ServingDaemon(ctrund, flags);
      DaemonProcess& daemon = *serving;
      auto session = OpenJob(Connect(daemon.endpoint()));
      per_second = OpsPerSecond(daemon, /*get=*/false, clients, seconds);
      session->Close();
      session->Wait().IgnoreError();
    }
    std::filesystem::remove_all(dir);
    std::printf(
        "{\"bench\":\"fsync\",\"policy\":\"%s\",\"clients\":%d,"
        "\"ops_per_s\":%.0f}\n",
        policy, clients, per_second);
    std::fflush(stdout);
  }
  return 0;
}

int Broadcast(const std::string& ctrund, int waiters, int repeats) {
  auto serving = ServingDaemon(ctrund);
  DaemonProcess& daemon = *serving;
  auto session = OpenJob(Connect(daemon.endpoint()));
  StoreClient setter(Connect(daemon.endpoint()), "bench", 0);
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < waiters; ++i) {
    clients.push_back(
        std::make_unique<StoreClient>(Connect(daemon.endpoint()), "bench", 0));
    if (!clients.back()->NumKeys().ok()) Die("store not reachable");
  }
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const std::string key = absl::StrCat("broadcast-", r);
    std::vector<absl::Time> answered(waiters);
    std::vector<std::thread> threads;
    for (int i = 0; i < waiters; ++i) {
      threads.emplace_back([&, i] {
        if (!clients[i]->Get(key, absl::Seconds(30)).ok()) Die("get failed");
        answered[i] = absl::Now();
      });
    }
    // Let every get reach the daemon and park before the set.
    absl::SleepFor(absl::Milliseconds(500));
    const absl::Time start = absl::Now();
    if (!setter.Set(key, std::string(128, 'i')).ok()) Die("set failed");
    for (auto& t : threads) t.join();
    const absl::Time last = *std::max_element(answered.begin(), answered.end());
    samples.push_back(absl::ToDoubleMilliseconds(last - start));
  }
  std::sort(samples.begin(), samples.end());
  std::printf(
      "{\"bench\":\"broadcast\",\"waiters\":%d,\"median_ms\":%.3f,"
      "\"min_ms\":%.3f,\"max_ms\":%.3f}\n",
      waiters, samples[samples.size() / 2], samples.front(), samples.back());
  session->Close();
  session->Wait().IgnoreError();
  return 0;
}

int Failover(const std::string& ctrund, int agents) {
  if (etcd_endpoints.empty()) Die("failover needs --etcd ENDPOINTS");
  const std::string prefix =
      absl::StrCat("/rdzv-bench/failover-", getpid(), "-",
                   absl::ToUnixMicros(absl::Now()), "/");
  DaemonProcess first(ctrund, {}, prefix);
  first.WaitServing();
  DaemonProcess second(ctrund, {}, prefix);
  absl::SleepFor(absl::Seconds(1));  // until it stands by
  const std::string endpoints = first.listen() + "," + second.listen();

  struct Agent {
    std::unique_ptr<SessionStream> stream;
    int64_t round = -1;
    absl::Notification assigned, ended, resumed;
    absl::Time resumed_at;
  };
  std::vector<std::unique_ptr<Agent>> sim(agents);
  for (int i = 0; i < agents; ++i) {
    sim[i] = std::make_unique<Agent>();
    Agent* a = sim[i].get();
    SessionStream::Handlers handlers;
    handlers.on_message = [a](const v1::ServerMessage& m) {
      if (!m.has_assignment() || a->assigned.HasBeenNotified()) return;
      a->round = m.assignment().round();
      a->assigned.Notify();
    };
    handlers.on_done = [a](const absl::Status&, bool) { a->ended.Notify(); };
    a->stream = SessionStream::Start(Connect(endpoints),
                                     MakeJoin("bench", i, agents), handlers);
  }
  for (auto& a : sim) {
    if (!a->assigned.WaitForNotificationWithTimeout(absl::Seconds(120))) {
      Die("not every agent was assigned within 120 s");
    }
  }
  const absl::Time killed = absl::Now();
  first.Kill();
  // Each agent, once its session broke, resumes it as ctrun's does
  // (AgentPolicy::Reconnect): a standby's refusal names the leader, tried
  // at once; a leader that is gone sends calls back to the endpoints, tried
  // again after 100 ms, until the standby leads.
  std::vector<std::unique_ptr<SessionStream>> resumed(agents);
  std::vector<std::thread> resuming;
  for (int i = 0; i < agents; ++i) {
    resuming.emplace_back([&, i] {
      Agent* a = sim[i].get();
      if (!a->ended.WaitForNotificationWithTimeout(absl::Seconds(60))) {
        Die("a session outlived its leader");
      }
      const Connection connection = Connect(endpoints);
      const absl::Time give_up = absl::Now() + absl::Seconds(120);
      while (absl::Now() < give_up) {
        v1::Join join = MakeJoin("bench", i, agents);
        join.mutable_resume()->set_round(a->round);
        // Handlers of one stream run one at a time: no race on `settled`.
        auto settled = std::make_shared<absl::Notification>();
        auto redirected = std::make_shared<bool>(false);
        SessionStream::Handlers handlers;
        handlers.on_message = [a, settled](const v1::ServerMessage& m) {
          if (!m.has_resumed() || a->resumed.HasBeenNotified()) return;
          a->resumed_at = absl::Now();
          a->resumed.Notify();
          settled->Notify();
        };
        handlers.on_done = [settled, redirected](const absl::Status&,
                                                 bool was_redirected) {
          *redirected = was_redirected;
          if (!settled->HasBeenNotified()) settled->Notify();
        };
        auto stream = SessionStream::Start(connection, join, handlers);
        settled->WaitForNotificationWithTimeout(give_up - absl::Now());
        if (a->resumed.HasBeenNotified()) {
          resumed[i] = std::move(stream);
          return;
        }
        stream.reset();  // done: it waits for the stream's end
        if (!*redirected) absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }
  for (auto& t : resuming) t.join();
  absl::Time last = killed;
  for (auto& a : sim) {
    if (!a->resumed.WaitForNotificationWithTimeout(absl::Seconds(120))) {
      Die("not every agent resumed within 120 s");
    }
    last = std::max(last, a->resumed_at);
  }
  for (auto& r : resumed) r->Close();
  for (auto& r : resumed) r->Wait().IgnoreError();
  std::printf(
      "{\"bench\":\"failover\",\"agents\":%d,\"lease_ttl_s\":2,"
      "\"all_resumed_ms\":%.1f}\n",
      agents, absl::ToDoubleMilliseconds(last - killed));
  return 0;
}

}  // namespace
}  // namespace ctrun::bench

int main(int argc, char** argv) {
  using namespace ctrun::bench;
  // Debian's Abseil checks every lock order at run time, which costs more
  // than the locking itself with thousands of sessions; tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2) Die("usage: rdzv_bench rendezvous|store|broadcast|demo ...");
  const std::string mode = argv[1];
  std::string ctrund = "ctrund";
  std::string state_dir;
  int agents = 64, clients = 1, waiters = 64, repeats = 5;
  double seconds = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--ctrund")
      ctrund = value;
    else if (flag == "--agents")
      agents = std::stoi(value);
    else if (flag == "--clients")
      clients = std::stoi(value);
    else if (flag == "--waiters")
      waiters = std::stoi(value);
    else if (flag == "--repeats")
      repeats = std::stoi(value);
    else if (flag == "--seconds")
      seconds = std::stod(value);
    else if (flag == "--state-dir")
      state_dir = value;
    else if (flag == "--etcd")
      etcd_endpoints = value;
    else
      Die("unknown flag " + flag);
  }
  RaiseFileLimit();
  if (mode == "rendezvous") return Rendezvous(ctrund, agents, false);
  if (mode == "demo") return Rendezvous(ctrund, agents, true);
  if (mode == "store") return Store(ctrund, clients, seconds);
  if (mode == "broadcast") return Broadcast(ctrund, waiters, repeats);
  if (mode == "fsync") return Fsync(ctrund, clients, seconds, state_dir);
  if (mode == "failover") return Failover(ctrund, agents);
  if (mode == "etcd-floor") return EtcdFloor(clients, seconds);
  Die("unknown mode " + mode);
}
