// ctrund replicas on a real etcd: a 3-member etcd cluster on loopback, two
// ctrund replicas against it, and real agents (ctrun) for nodes on their
// own loopback addresses that list both replicas.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rendezvous/client/client.h"
#include "rendezvous/etcd/etcd_log.h"
#include "rendezvous/etcd/etcd_replica.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/server/standby_server.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/session_probe.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);
constexpr const char* kJob = "ha";
#if defined(__SANITIZE_ADDRESS__)
constexpr absl::Duration kSanitizerSlack = absl::Seconds(2);
#else
constexpr absl::Duration kSanitizerSlack = absl::ZeroDuration();
#endif

int FreePort() {
  auto port = BindFreePort("127.0.0.1");
  REQUIRE(port.ok());
  return *port;
}

// Two replicas with lease `ttl_s`, the first leading.
struct Replicas {
  explicit Replicas(const EtcdCluster& etcd, int ttl_s) {
    const std::vector<std::string> extra = {"--etcd-lease-ttl",
                                            std::to_string(ttl_s)};
    first = std::make_unique<Replica>(FreePort(), etcd.endpoints(), extra);
    INFO(first->process().Stderr());
    REQUIRE(first->WaitLeading(kWait));
    second = std::make_unique<Replica>(FreePort(), etcd.endpoints(), extra);
    REQUIRE(second->process().StderrContains(
        "standing by; the leader is " + first->endpoint(), kWait));
    endpoints = first->endpoint() + "," + second->endpoint();
  }
  Connection Connect() const {
    ConnectionOptions options;
    options.endpoint = endpoints;
    auto connection = Connection::Open(options);
    REQUIRE(connection.ok());
    return *connection;
  }
  std::unique_ptr<Replica> first, second;
  std::string endpoints;
};

// The file whose existence ends the workers' loop.
struct DoneFile {
  const std::string path = std::filesystem::temp_directory_path() /
                           absl::StrCat("ctrun-etcd-done-", getpid());
  DoneFile() { std::filesystem::remove(path); }
  ~DoneFile() { std::filesystem::remove(path); }
  void Touch() const { std::ofstream(path) << ""; }
};

// One agent on 127.0.0.<n>; its workers print who they are, then wait for
// `done`.
std::unique_ptr<ChildProcess> Node(int n, const std::string& endpoints,
                                   const std::string& nnodes,
                                   const DoneFile& done) {
  return std::make_unique<ChildProcess>(std::vector<std::string>{
      CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n),
      absl::StrCat("--nnodes=", nnodes), "--nproc_per_node=1",
      "--max_restarts=1", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoints,
      absl::StrCat("--rdzv_id=", kJob), "--rdzv_conf=last_call_timeout=1",
      "/bin/sh", "-c",
      absl::StrCat("echo \"world=$WORLD_SIZE pid=$$ "
                   "restart=$TORCHELASTIC_RESTART_COUNT\"; "
                   "while [ ! -e ",
                   done.path, " ]; do sleep 0.05; done")});
}

pid_t WorkerPid(const std::string& line) {
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex("pid=([0-9]+)")));
  return std::stoi(m[1]);
}

// Starts `count` nodes (127.0.0.2...) and returns their workers' pids.
std::vector<pid_t> StartJob(const std::string& endpoints, int count,
                            const DoneFile& done,
                            std::vector<std::unique_ptr<ChildProcess>>* nodes) {
  for (int n = 0; n < count; ++n) {
    nodes->push_back(Node(n + 2, endpoints, std::to_string(count), done));
  }
  std::vector<pid_t> pids;
  for (auto& node : *nodes) {
    auto line = node->WaitForLine(absl::StrCat("world=", count), kWait);
    INFO(node->Stderr());
    REQUIRE(line);
    pids.push_back(WorkerPid(*line));
  }
  return pids;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST_CASE(
    "A standby takes over a killed leader within the lease TTL and a second: "
    "the job keeps its workers, keys and round, and restarts under it",
    "[etcd][integration]") {
  EtcdCluster etcd(3);
  Replicas replicas(etcd, 2);
  DoneFile done;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  const std::vector<pid_t> workers =
      StartJob(replicas.endpoints, 3, done, &nodes);
  StoreClient kept(replicas.Connect(), kJob, 0);
  REQUIRE(kept.Set("checkpoint", "step-1200").ok());
  REQUIRE(kept.Add("counter", 5).ok());

  const absl::Time killed = absl::Now();
  replicas.first->process().Signal(SIGKILL);
  REQUIRE(replicas.second->WaitLeading(kWait));
  const absl::Duration takeover = absl::Now() - killed;
  INFO(replicas.second->process().Stderr());
  WARN("takeover after kill -9 of the leader: "
       << absl::FormatDuration(takeover));
  // The bound: the lease TTL and a second. Sanitizer builds start
  // the new leader's service several times slower.
  CHECK(takeover <= absl::Seconds(2 + 1) + kSanitizerSlack);

  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->StderrContains("resumed with the rendezvous", kWait));
  }
  for (pid_t pid : workers) CHECK(Alive(pid));
  // The same client, its requests resent to the new leader.
  auto checkpoint = kept.Get("checkpoint");
  REQUIRE(checkpoint.ok());
  CHECK(*checkpoint == "step-1200");
  CHECK(*kept.Add("counter", 1) == 6);
  auto job = AdminClient(replicas.Connect()).DescribeJob(kJob);
  REQUIRE(job.ok());
  CHECK(job->round() == 0);
  CHECK(job->restart_count() == 0);
  CHECK(replicas.second->process().StderrContains("1 jobs restored", kWait));
  // `ctrund status` finds the leader through etcd and asks it.
  ChildProcess status({CtrundPath(), "status", "--etcd", etcd.endpoints()});
  const std::string shown = status.ReadAll(kWait);
  INFO(shown << status.Stderr());
  CHECK(status.Wait(kWait) == 0);
  CHECK(shown.rfind("leader: " + replicas.second->endpoint() + ", since ", 0) ==
        0);
  CHECK(shown.find(kJob) != std::string::npos);

  // A worker failure restarts the job under the new leader.
  kill(workers[1], SIGKILL);
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->WaitForLine("restart=1", kWait));
  }
  done.Touch();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
  }
}

TEST_CASE("Killing the etcd leader is invisible to a job and its replicas",
          "[etcd][integration]") {
  EtcdCluster etcd(3);
  // A lease that outlasts etcd's own election, with room for one that a
  // loaded machine (two cores, sanitizers, other tests) draws out: a 5 s
  // lease lapsed there once, and the replica rightly stepped down.
  Replicas replicas(etcd, 15);
  DoneFile done;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  StartJob(replicas.endpoints, 2, done, &nodes);
  StoreClient store(replicas.Connect(), kJob, 0);

  std::atomic<bool> writing{true};
  std::atomic<int> written{0};
  std::vector<std::string> failures;
  std::thread writer([&] {
    for (int i = 0; writing || i < 10; ++i) {
      if (auto s = store.Set(absl::StrCat("k", i), std::to_string(i));
          !s.ok()) {
        failures.push_back(s.ToString());
      }
      ++written;
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  while (written < 10) absl::SleepFor(absl::Milliseconds(10));
  const int leader = etcd.Leader();
  etcd.Kill(leader);
  const int before = written;
  // Writes go on while etcd elects another leader.
  while (written < before + 50) absl::SleepFor(absl::Milliseconds(10));
  writing = false;
  writer.join();
  INFO("first failure: " << (failures.empty() ? "" : failures[0]));
  CHECK(failures.empty());
  for (int i = 0; i < written; ++i) {
    auto value = store.Get(absl::StrCat("k", i));
    REQUIRE(value.ok());
    CHECK(*value == std::to_string(i));
  }
  INFO(replicas.first->process().Stderr());
  CHECK(replicas.first->process().Stderr().find("stepping down") ==
        std::string::npos);
  CHECK_FALSE(replicas.second->process().WaitForLine("ctrund listening",
                                                     absl::Milliseconds(100)));
  done.Touch();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
    CHECK(node->Stderr().find("lost the rendezvous") == std::string::npos);
  }
}

TEST_CASE(
    "A leader paused past its lease steps down when it wakes and writes "
    "nothing after its successor's first write",
    "[etcd][integration]") {
  EtcdCluster etcd(3);
  Replicas replicas(etcd, 2);
  DoneFile done;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  StartJob(replicas.endpoints, 1, done, &nodes);
  StoreClient store(replicas.Connect(), kJob, 0);
  REQUIRE(store.Set("before", "1").ok());

  replicas.first->process().Signal(SIGSTOP);
  REQUIRE(replicas.second->WaitLeading(kWait));
  // A client of the paused leader alone: its request waits in the socket
  // and is read the moment the leader wakes.
  ConnectionOptions only_first;
  only_first.endpoint = replicas.first->endpoint();
  auto first = Connection::Open(only_first);
  REQUIRE(first.ok());
  constexpr absl::Duration kRpcTimeout = absl::Seconds(5);
  StoreClient stale(*first, kJob, 0, kRpcTimeout);
  auto late = std::async(std::launch::async,
                         [&stale] { return stale.Set("stale", "x"); });
  absl::SleepFor(absl::Milliseconds(300));
  replicas.first->process().Signal(SIGCONT);
  // Refused by the fence, or cut off by the restart that follows it. Then
  // the write, sent again, waits until its deadline for a replica at that
  // address to lead: this client lists no other.
  // When it comes back as a standby it names its successor, and the write
  // is done there: it was refused, not done, by the old leader.
  const absl::Status refused = late.get();
  INFO("the late write: " << refused);
  if (refused.ok()) {
    CHECK(first->leader() == replicas.second->endpoint());
  } else if (absl::IsDeadlineExceeded(refused)) {
    CHECK(refused.message() == absl::StrCat("no answer from the store at ",
                                            replicas.first->endpoint(),
                                            " within ",
                                            absl::FormatDuration(kRpcTimeout)));
  } else {
    CHECK(absl::IsUnavailable(refused));
    if (refused.message().find("stepping down") != absl::string_view::npos) {
      CHECK(refused.message() ==
            "this ctrund is stepping down (its etcd lease may have lapsed); "
            "another replica takes over");
    }
  }
  INFO(replicas.first->process().Stderr());
  CHECK(replicas.first->process().StderrContains("stepping down", kWait));
  // It comes back as a standby, same pid.
  CHECK(replicas.first->process().WaitForLine("ctrund standing by", kWait));
  CHECK(replicas.first->process().StderrContains(
      "standing by; the leader is " + replicas.second->endpoint(), kWait));

  // Every record in etcd is the new leader's: it rewrote the log when it
  // took over, and the old one wrote nothing after.
  auto client = etcd.Client();
  auto leader = ReadLeader(*client, "/ctrund/");
  REQUIRE(leader.ok());
  REQUIRE(leader->has_value());
  CHECK((*leader)->address == replicas.second->endpoint());
  auto kvs = client->Range(EtcdLogPrefix("/ctrund/"),
                           PrefixEnd(EtcdLogPrefix("/ctrund/")));
  REQUIRE(kvs.ok());
  REQUIRE(!kvs->empty());
  for (const auto& kv : *kvs) {
    auto parts = ParseEtcdLogKey("/ctrund/", kv.key());
    REQUIRE(parts);
    CHECK(parts->leader == (*leader)->revision);
  }
  auto stale_value = store.Get("stale");
  if (refused.ok()) {
    CHECK(stale_value.value_or("") == "x");
  } else {
    CHECK(absl::IsNotFound(stale_value.status()));
  }
  auto before = store.Get("before");
  REQUIRE(before.ok());
  CHECK(*before == "1");
  done.Touch();
  for (auto& node : nodes) CHECK(node->Wait(kWait) == 0);
}

TEST_CASE(
    "Nodes that come and go across leader takeovers end in one world with "
    "every acknowledged key",
    "[etcd][integration]") {
  const unsigned seed = std::random_device{}();
  WARN("seed " << seed);
  std::mt19937 random(seed);
  EtcdCluster etcd(3);
  const std::vector<std::string> ttl = {"--etcd-lease-ttl", "2"};
  std::vector<int> ports = {FreePort(), FreePort()};
  std::vector<std::unique_ptr<Replica>> replicas;
  replicas.push_back(
      std::make_unique<Replica>(ports[0], etcd.endpoints(), ttl));
  REQUIRE(replicas[0]->WaitLeading(kWait));
  replicas.push_back(
      std::make_unique<Replica>(ports[1], etcd.endpoints(), ttl));
  int leading = 0;
  const std::string endpoints =
      replicas[0]->endpoint() + "," + replicas[1]->endpoint();
  ConnectionOptions options;
  options.endpoint = endpoints;
  auto connection = Connection::Open(options);
  REQUIRE(connection.ok());
  AdminClient admin(*connection);

  DoneFile done;
  std::map<int, std::unique_ptr<ChildProcess>> nodes;  // by 127.0.0.<n>
  for (int n : {2, 3}) nodes[n] = Node(n, endpoints, "2:4", done);

  // Keys set in the store of the round that is current, as acknowledged.
  absl::Mutex mu;
  std::map<int64_t, std::vector<std::string>> acked;
  std::atomic<bool> writing{true};
  std::thread writer;
  // A failed REQUIRE leaves the test by an exception: the writer must end
  // and be joined then too (a joinable thread would abort the binary).
  absl::Cleanup stop_writer = [&] {
    writing = false;
    if (writer.joinable()) writer.join();
  };
  writer = std::thread([&] {
    for (int i = 0; writing; ++i) {
      absl::SleepFor(absl::Milliseconds(30));
      auto job = admin.DescribeJob(kJob);
      if (!job.ok() || job->phase() != v1::JobStatus::RUNNING) continue;
      const std::string key = absl::StrCat("k", i);
      if (StoreClient(*connection, kJob, job->round()).Set(key, key).ok()) {
        absl::MutexLock lock(&mu);
        acked[job->round()].push_back(key);
      }
    }
  });
  // Every key acknowledged in round `round` is there, unless the round
  // moved on meanwhile.
  auto check_keys = [&](int64_t round) {
    std::vector<std::string> keys;
    {
      absl::MutexLock lock(&mu);
      keys = acked[round];
    }
    StoreClient store(*connection, kJob, round);
    for (const auto& key : keys) {
      auto value = store.Get(key, absl::Seconds(5));
      if (absl::IsAborted(value.status())) return;  // a later round
      INFO("round " << round << " key " << key << ": " << value.status());
      REQUIRE(value.ok());
      CHECK(*value == key);
    }
  };

  const absl::Time end = absl::Now() + absl::Seconds(15);
  int takeovers = 0;
  while (absl::Now() < end || takeovers == 0) {
    absl::SleepFor(absl::Milliseconds(
        std::uniform_int_distribution<int>(500, 2000)(random)));
    const int action = std::uniform_int_distribution<int>(0, 2)(random);
    if (action == 0 && nodes.size() < 4) {
      int n = 2;
      while (nodes.contains(n)) ++n;
      nodes[n] = Node(n, endpoints, "2:4", done);
    } else if (action == 1 && nodes.size() > 2) {
      // A node leaves: its agent stops its workers and goes.
      auto it = std::next(nodes.begin(), std::uniform_int_distribution<int>(
                                             0, nodes.size() - 1)(random));
      it->second->Signal(SIGTERM);
      CHECK(it->second->Wait(kWait));
      nodes.erase(it);
    } else if (action == 2 || (absl::Now() >= end && takeovers == 0)) {
      auto job = admin.DescribeJob(kJob);
      replicas[leading]->process().Signal(SIGKILL);
      REQUIRE(replicas[leading]->process().Wait(kWait));
      const int standby = 1 - leading;
      REQUIRE(replicas[standby]->WaitLeading(kWait));
      replicas[leading] =
          std::make_unique<Replica>(ports[leading], etcd.endpoints(), ttl);
      leading = standby;
      ++takeovers;
      if (job.ok()) check_keys(job->round());
    }
  }
  // Settled: one running round of every node left.
  const int count = static_cast<int>(nodes.size());
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  absl::StatusOr<v1::JobStatus> job;
  while (absl::Now() < give_up) {
    job = admin.DescribeJob(kJob);
    if (job.ok() && job->phase() == v1::JobStatus::RUNNING &&
        job->world_size() == count) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::move(stop_writer).Invoke();
  REQUIRE(job.ok());
  CHECK(job->world_size() == count);
  check_keys(job->round());
  {
    absl::MutexLock lock(&mu);
    CHECK_FALSE(acked[job->round()].empty());
  }
  done.Touch();
  for (auto& [n, node] : nodes) {
    INFO("node 127.0.0." << n << ": " << node->Stderr());
    CHECK(node->Wait(kWait) == 0);
    // Its workers last ran in the settled world.
    const std::string out = node->ReadAll(kWait);
    const size_t last = out.rfind("world=");
    REQUIRE(last != std::string::npos);
    CHECK(out.substr(last, out.find(' ', last) - last) ==
          absl::StrCat("world=", count));
  }
}

}  // namespace
}  // namespace ctrun::testing

namespace ctrun::testing {
namespace {

void PutKey(EtcdClient& client, const std::string& key) {
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value("another deployment's");
  auto response = client.Txn(txn);
  REQUIRE(response.ok());
}

// `ctrund status --endpoint` against one replica: its output, or failure.
struct StatusOutput {
  int exit_code;
  std::string out;
};
StatusOutput StatusAt(const std::string& endpoint) {
  ChildProcess status({CtrundPath(), "status", "--endpoint", endpoint});
  StatusOutput result;
  result.out = status.ReadAll(kWait);
  result.exit_code = status.Wait(kWait).value_or(-1);
  result.out += status.Stderr();
  return result;
}

TEST_CASE(
    "A standby refuses every call naming the leader, and clients go there "
    "at once, doing each request once",
    "[etcd][integration]") {
  auto leader = RendezvousServer::Start(ServerOptions{});
  REQUIRE(leader.ok());
  const std::string leader_endpoint = (*leader)->endpoint().ToString();
  absl::Mutex mu;
  std::optional<std::string> named;
  auto standby =
      StandbyServer::Start({Endpoint{"127.0.0.1", 0}, std::nullopt, [&]() {
                              absl::MutexLock lock(&mu);
                              return named;
                            }});
  REQUIRE(standby.ok());
  const std::string standby_endpoint = (*standby)->endpoint().ToString();
  ConnectionOptions options;
  options.endpoint = standby_endpoint;
  auto connection = Connection::Open(options);
  REQUIRE(connection.ok());
  AdminClient admin(*connection);

  // While nobody leads, it says so, and names nobody.
  auto none = admin.ListJobs();
  CHECK(absl::IsUnavailable(none.status()));
  CHECK(none.status().message() ==
        absl::StrCat("the ctrund replica at ", standby_endpoint,
                     " stands by and no replica leads right now (an election "
                     "is under way); try again in a moment"));
  CHECK(connection->leader().empty());

  {
    absl::MutexLock lock(&mu);
    named = leader_endpoint;
  }
  JoinSpec spec;
  spec.job = kJob;
  ConnectionOptions to_leader;
  to_leader.endpoint = leader_endpoint;
  SessionProbe node(*Connection::Open(to_leader), MakeJoin(spec));
  REQUIRE(node.NextAssignment(kWait));
  // An Add is not repeatable: it is done once, by the leader, although
  // its first stream went to the standby.
  StoreClient store(*connection, kJob, 0);
  auto added = store.Add("counter", 5);
  INFO(added.status());
  REQUIRE(added.ok());
  CHECK(*added == 5);
  CHECK(connection->leader() == leader_endpoint);
  // Copies share the route: a fresh client goes straight to the leader.
  StoreClient second(*connection, kJob, 0);
  CHECK(second.Add("counter", 1).value_or(-1) == 6);
  CHECK(admin.ListJobs().ok());

  // The leader goes: the next stream fails at once rather than waiting
  // for it, and the connection asks the standby again.
  (*leader)->Shutdown();
  {
    absl::MutexLock lock(&mu);
    named.reset();
  }
  const absl::Time asked = absl::Now();
  auto gone = AdminClient(*connection).ListJobs();
  CHECK(absl::IsUnavailable(gone.status()));
  CHECK(absl::Now() - asked < absl::Seconds(5));
  auto again = AdminClient(*connection).ListJobs();
  CHECK(absl::IsUnavailable(again.status()));
  CHECK(again.status().message().find("no replica leads right now") !=
        absl::string_view::npos);
  CHECK(connection->leader().empty());

  // A store request that meets the standby during an election waits for
  // the next leader within its time, rather than failing at once.
  auto next = RendezvousServer::Start(ServerOptions{});
  REQUIRE(next.ok());
  ConnectionOptions to_next;
  to_next.endpoint = (*next)->endpoint().ToString();
  SessionProbe rejoined(*Connection::Open(to_next), MakeJoin(spec));
  REQUIRE(rejoined.NextAssignment(kWait));
  std::thread elect([&] {
    absl::SleepFor(absl::Milliseconds(500));
    absl::MutexLock lock(&mu);
    named = to_next.endpoint;
  });
  const absl::Status set = StoreClient(*connection, kJob, 0).Set("k", "v");
  elect.join();
  INFO(set);
  CHECK(set.ok());
  CHECK(connection->leader() == to_next.endpoint);

  // So does one that is not repeatable: the standby did nothing of it.
  {
    absl::MutexLock lock(&mu);
    named.reset();
  }
  auto fresh = Connection::Open(options);
  REQUIRE(fresh.ok());
  std::thread reelect([&] {
    absl::SleepFor(absl::Milliseconds(500));
    absl::MutexLock lock(&mu);
    named = to_next.endpoint;
  });
  auto counted = StoreClient(*fresh, kJob, 0).Add("during", 7);
  reelect.join();
  INFO(counted.status());
  REQUIRE(counted.ok());
  CHECK(*counted == 7);
}

TEST_CASE(
    "A replica that steps down answers from the moment it is back, naming "
    "the leader, and clients listing it first go there",
    "[etcd][integration]") {
  EtcdCluster etcd(3);
  Replicas replicas(etcd, 2);
  // A standby answers from its start.
  auto at_standby = StatusAt(replicas.second->endpoint());
  INFO(at_standby.out);
  CHECK(at_standby.exit_code == 0);
  CHECK(at_standby.out.find("leader: " + replicas.first->endpoint() + " (" +
                            replicas.second->endpoint() + " stands by)") !=
        std::string::npos);

  replicas.first->process().Signal(SIGSTOP);
  REQUIRE(replicas.second->WaitLeading(kWait));
  replicas.first->process().Signal(SIGCONT);
  INFO(replicas.first->process().Stderr());
  REQUIRE(replicas.first->process().StderrContains("stepping down", kWait));
  // From the step-down on, every ask within 4 s is answered (the few
  // milliseconds the process takes to start again aside), naming the new
  // leader.
  const absl::Time stepped_down = absl::Now();
  std::optional<absl::Time> first_answer;
  int answers = 0;
  while (absl::Now() - stepped_down < absl::Seconds(4)) {
    auto at_old = StatusAt(replicas.first->endpoint());
    if (at_old.exit_code != 0) {
      INFO("exit " << at_old.exit_code << ": " << at_old.out);
      CHECK(!first_answer);  // once answering, always
      // The old image saying it steps down, or closing its connections
      // (reset, or a broken pipe when the ask was being written as it
      // closed), or the new one not yet listening.
      CHECK((at_old.out.find("is stepping down") != std::string::npos ||
             at_old.out.find("Connection refused") != std::string::npos ||
             at_old.out.find("Connection reset") != std::string::npos ||
             at_old.out.find("Broken pipe") != std::string::npos));
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    if (!first_answer) first_answer = absl::Now();
    ++answers;
    INFO(at_old.out);
    CHECK(at_old.out.find("leader: " + replicas.second->endpoint()) !=
          std::string::npos);
  }
  REQUIRE(first_answer);
  CHECK(*first_answer - stepped_down < absl::Seconds(1));
  CHECK(answers >= 5);

  // An agent listing the standby first joins under the leader.
  DoneFile done;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  StartJob(replicas.first->endpoint() + "," + replicas.second->endpoint(), 1,
           done, &nodes);
  done.Touch();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
    // Sent on, not lost: nothing to tell the operator.
    CHECK(node->Stderr().find("lost the rendezvous") == std::string::npos);
  }
}

TEST_CASE(
    "A standby behind TLS and a token names the leader to clients that "
    "trust it, and they are served there",
    "[etcd][integration]") {
  EtcdCluster etcd(1);
  char dir_template[] = "/tmp/ctrun-etcd-tls-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem",
                    token = dir + "/token";
  MakeSelfSignedCert("127.0.0.1", cert, key);
  std::ofstream(token) << "s3cret\n";
  const std::vector<std::string> extra = {
      "--tls-cert", cert, "--tls-key", key, "--token-file", token};
  Replica first(FreePort(), etcd.endpoints(), extra);
  REQUIRE(first.WaitLeading(kWait));
  Replica second(FreePort(), etcd.endpoints(), extra);
  REQUIRE(second.process().StderrContains(
      "standing by; the leader is " + first.endpoint(), kWait));

  ConnectionOptions options;
  options.endpoint = second.endpoint();
  options.tls_ca_file = cert;
  options.token = "s3cret";
  auto connection = Connection::Open(options);
  REQUIRE(connection.ok());
  auto jobs = AdminClient(*connection).ListJobs();
  INFO(jobs.status());
  CHECK(jobs.ok());
  CHECK(connection->leader() == first.endpoint());
  // The leader still checks the token the standby did not ask for.
  options.token = "wrong";
  auto wrong = Connection::Open(options);
  REQUIRE(wrong.ok());
  CHECK(absl::IsUnauthenticated(AdminClient(*wrong).ListJobs().status()));

  ChildProcess status({CtrundPath(), "status", "--endpoint", second.endpoint(),
                       "--tls-ca", cert, "--token-file", token});
  const std::string shown = status.ReadAll(kWait);
  INFO(shown << status.Stderr());
  CHECK(status.Wait(kWait) == 0);
  CHECK(shown.rfind("leader: " + first.endpoint() + " (" + second.endpoint() +
                        " stands by)",
                    0) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "Nested etcd prefixes are refused at start, naming the foreign key, "
    "both ways",
    "[etcd][integration]") {
  EtcdCluster etcd(1);
  auto client = etcd.Client();
  // An outer deployment at /a/ beside an inner one that wrote at /a/log/.
  PutKey(*client, "/a/log/leader");
  ChildProcess outer({CtrundPath(), "--listen",
                      absl::StrCat("127.0.0.1:", FreePort()), "--etcd",
                      etcd.endpoints(), "--etcd-prefix", "/a/"});
  CHECK(outer.Wait(kWait) == 1);  // was: campaigning for ever, never serving
  INFO(outer.Stderr());
  CHECK(absl::StrContains(outer.Stderr(),
                          "--etcd-prefix: etcd key '/a/log/leader' under "
                          "--etcd-prefix /a/ is not this deployment's"));
  // The inner one, started inside a prefix that holds the outer's log.
  PutKey(*client, "/b/log/00000000000000000001.7");
  ChildProcess inner({CtrundPath(), "--listen",
                      absl::StrCat("127.0.0.1:", FreePort()), "--etcd",
                      etcd.endpoints(), "--etcd-prefix", "/b/log/"});
  CHECK(inner.Wait(kWait) == 1);
  CHECK(absl::StrContains(inner.Stderr(),
                          "'/b/log/00000000000000000001.7' under "
                          "--etcd-prefix /b/log/"));
}

TEST_CASE(
    "A replica whose restore cannot heal ends, instead of leading and "
    "stepping down for ever",
    "[etcd][integration]") {
  EtcdCluster etcd(1);
  Replica first(FreePort(), etcd.endpoints(), {"--etcd-lease-ttl", "2"});
  REQUIRE(first.WaitLeading(kWait));
  Replica second(FreePort(), etcd.endpoints(), {"--etcd-lease-ttl", "2"});
  // Another deployment nested inside, after both replicas checked the
  // prefix: its key is under this one's log.
  auto client = etcd.Client();
  PutKey(*client, "/ctrund/log/leader");
  // The second takes over once the first is gone, and cannot restore.
  first.process().Signal(SIGKILL);
  first.process().Wait(kWait);
  CHECK(second.process().Wait(kWait) == 1);
  INFO(second.process().Stderr());
  CHECK(absl::StrContains(second.process().Stderr(),
                          "this does not heal by itself: stopping (exit 1)"));
  CHECK(absl::StrContains(second.process().Stderr(), "'/ctrund/log/leader'"));
  CHECK(CountMatches(second.process().Stderr(), "stepping down") == 0);
}

TEST_CASE(
    "A stop wins over a step-down: a leader told to stop while paused past "
    "its lease ends",
    "[etcd][integration]") {
  EtcdCluster etcd(1);
  Replica replica(FreePort(), etcd.endpoints(), {"--etcd-lease-ttl", "2"});
  REQUIRE(replica.WaitLeading(kWait));
  replica.process().Signal(SIGSTOP);
  absl::SleepFor(absl::Seconds(4));  // its lease lapses meanwhile
  // On waking it finds both a stop and a lease gone: it must stop, not
  // start again as a standby that runs on.
  replica.process().Signal(SIGTERM);
  replica.process().Signal(SIGCONT);
  CHECK(replica.process().Wait(absl::Seconds(20)) == 0);
  INFO(replica.process().Stderr());
  CHECK_FALSE(absl::StrContains(replica.process().Stderr(),
                                "starting again as a standby"));
}

TEST_CASE("A standby says once that etcd is out of reach, not every tick",
          "[etcd][integration]") {
  EtcdCluster etcd(1);
  Replica first(FreePort(), etcd.endpoints(), {"--etcd-lease-ttl", "2"});
  REQUIRE(first.WaitLeading(kWait));
  Replica second(FreePort(), etcd.endpoints(), {"--etcd-lease-ttl", "2"});
  etcd.Kill(0);
  absl::SleepFor(absl::Seconds(5));  // 100 ticks of the lease's loop
  const std::string err = second.process().Stderr();
  INFO(err);
  // Said once each (the next would come a minute later), where it was said
  // every 50 ms tick.
  CHECK(CountMatches(err, "cannot renew the etcd lease") <= 1);
  CHECK(CountMatches(err, "cannot get a lease from etcd") <= 1);
  CHECK(CountMatches(err, "cannot renew the etcd lease") +
            CountMatches(err, "cannot get a lease from etcd") >=
        1);
}

// A log that commits as etcd does, over the network: each commit takes
// `commit_time`. Counts the records each commit carried.
class SlowLog : public RecordLog {
 public:
  explicit SlowLog(absl::Duration commit_time) : commit_time_(commit_time) {}
  absl::Status Append(const v1::JournalRecord&) override {
    absl::MutexLock lock(&mu_);
    ++pending_;
    return absl::OkStatus();
  }
  absl::Status Commit(bool) override {
    absl::SleepFor(commit_time_);
    absl::MutexLock lock(&mu_);
    if (pending_ > 0) commits_.push_back(pending_);
    pending_ = 0;
    return absl::OkStatus();
  }
  absl::Status Rewrite(const std::vector<v1::JournalRecord>&) override {
    return absl::OkStatus();
  }
  bool WantsRewrite() const override { return false; }
  bool HasRoomFor(size_t) const override { return true; }
  bool CommitsOverNetwork() const override { return true; }

  // The records of each commit so far.
  std::vector<int> commits() {
    absl::MutexLock lock(&mu_);
    return commits_;
  }

 private:
  const absl::Duration commit_time_;
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> commits_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE(
    "Blocking clients of a store on etcd share each commit, the client just "
    "answered included",
    "[etcd][integration]") {
  // Each commit takes 100 ms, so a client has 50 ms to send its next set
  // and join the next commit; the test does not depend on speed beyond
  // that. Before, the caller that ran the batches could not send its own
  // next set until no one else's was waiting: two clients took turns, one
  // set a commit.
  SlowLog* log = nullptr;
  ServerOptions options;
  options.state_where = "a slow log";
  options.state_log = [&log](std::map<std::string, JournaledJob>*)
      -> absl::StatusOr<std::unique_ptr<RecordLog>> {
    auto made = std::make_unique<SlowLog>(absl::Milliseconds(100));
    log = made.get();
    return made;
  };
  auto server = RendezvousServer::Start(std::move(options));
  REQUIRE(server.ok());
  ConnectionOptions connect;
  connect.endpoint = (*server)->endpoint().ToString();
  JoinSpec spec;
  spec.job = "batched";
  auto connection = Connection::Open(connect);
  REQUIRE(connection.ok());
  SessionProbe probe(*connection, MakeJoin(spec));
  REQUIRE(probe.NextAssignment(kWait));

  constexpr int kClients = 2, kSets = 10;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto own = Connection::Open(connect);
    REQUIRE(own.ok());
    clients.push_back(std::make_unique<StoreClient>(*own, spec.job, 0));
  }
  const size_t before = log->commits().size();
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < kSets; ++n) {
        if (!clients[i]->Set(absl::StrCat("key", i), std::to_string(n)).ok()) {
          ++failed;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  const std::vector<int> all = log->commits();
  const std::vector<int> sets(all.begin() + before, all.end());
  INFO("records per commit: " << absl::StrJoin(sets, " "));
  int records = 0;
  for (int n : sets) records += n;
  CHECK(records == kClients * kSets);
  // Ten rounds of both clients, and a first commit that may hold only one.
  CHECK(sets.size() <= kSets + 1);
}

}  // namespace
}  // namespace ctrun::testing
