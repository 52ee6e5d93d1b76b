// Faults of the service itself: ctrund killed and restarted under running
// jobs, clients that never speak, and many clients at once. Agents are real
// ctrun processes, each standing for a node on its own loopback address.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>

#include "absl/strings/str_cat.h"
#include "ctrun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/client.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/session_probe.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// A fresh path under the test's temporary directory.
std::string TempPath(const std::string& name) {
  const std::string path = std::filesystem::temp_directory_path() /
                           absl::StrCat("ctrun-", name, "-", getpid());
  std::filesystem::remove_all(path);
  return path;
}

// One agent on 127.0.0.<n>; its workers print who they are and their pid,
// then wait for `done` to exist.
std::unique_ptr<ChildProcess> Node(int n, std::vector<std::string> flags,
                                   const std::string& done) {
  std::vector<std::string> argv = {
      CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n),
      absl::StrCat("--log_line_prefix_template=N", n, "| ")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(),
              {"/bin/sh", "-c",
               absl::StrCat("echo \"world=$WORLD_SIZE pid=$$ "
                            "restart=$TORCHELASTIC_RESTART_COUNT\"; "
                            "while [ ! -e ",
                            done, " ]; do sleep 0.05; done")});
  return std::make_unique<ChildProcess>(argv);
}

std::vector<std::string> Flags(const std::string& endpoint,
                               const std::string& nnodes,
                               const std::string& extra_conf = "") {
  return {
      "--nnodes=" + nnodes,  "--nproc_per_node=1",
      "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
      "--rdzv_id=faults",    "--rdzv_conf=last_call_timeout=1" + extra_conf};
}

// The pid in a worker's "world=N pid=P" line.
pid_t WorkerPid(const std::string& line) {
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex("pid=([0-9]+)")));
  return std::stoi(m[1]);
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

StoreClient Store(const Daemon& daemon, int64_t round = 0) {
  return StoreClient(daemon.Connect(), "faults", round);
}

// A ctrund with a state directory, to be killed and restarted on the same
// address, and the file whose existence ends the workers' loop.
struct Restartable {
  const std::string state = TempPath("state");
  const std::string done = TempPath("done");
  std::unique_ptr<Daemon> first =
      std::make_unique<Daemon>(std::vector<std::string>{"--state-dir", state});
  const std::string endpoint = first->endpoint();

  ~Restartable() {
    std::filesystem::remove_all(state);
    std::filesystem::remove(done);
  }
  void KillFirst() {
    first->process().Signal(SIGKILL);
    REQUIRE(first->process().Wait(kWait));
  }
  void EndWorkers() const { std::ofstream(done) << ""; }
};

TEST_CASE("ctrund killed and restarted with its state dir loses no job",
          "[faults][integration]") {
  Restartable r;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  std::vector<pid_t> workers;
  for (int n : {2, 3}) nodes.push_back(Node(n, Flags(r.endpoint, "2"), r.done));
  for (auto& node : nodes) {
    auto line = node->WaitForLine("world=2", kWait);
    REQUIRE(line);
    workers.push_back(WorkerPid(*line));
  }
  // A worker's store client, kept across the restart.
  StoreClient kept = Store(*r.first);
  REQUIRE(kept.Set("checkpoint", "step-1200").ok());
  REQUIRE(kept.Add("counter", 5).ok());

  r.KillFirst();
  for (auto& node : nodes) {
    CHECK(node->StderrContains("the workers keep running", kWait));
  }
  // Asked while the service is down, answered once it is back.
  auto during = std::async(std::launch::async,
                           [&kept] { return kept.Get("checkpoint"); });
  CHECK(during.wait_for(std::chrono::milliseconds(300)) ==
        std::future_status::timeout);
  Daemon second({"--state-dir", r.state}, r.endpoint);
  auto answered = during.get();
  REQUIRE(answered.ok());
  CHECK(*answered == "step-1200");
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->StderrContains("resumed with the rendezvous", kWait));
  }
  for (pid_t pid : workers) CHECK(Alive(pid));
  auto checkpoint = Store(second).Get("checkpoint");
  REQUIRE(checkpoint.ok());
  CHECK(*checkpoint == "step-1200");
  CHECK(*Store(second).Add("counter", 1) == 6);
  auto job = AdminClient(second.Connect()).DescribeJob("faults");
  REQUIRE(job.ok());
  CHECK(job->phase() == v1::JobStatus::RUNNING);
  CHECK(job->round() == 0);
  CHECK(job->restart_count() == 0);

  r.EndWorkers();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
    // The workers ran once: no second start after the restart.
    CHECK(node->ReadAll(kWait).find("world=") == std::string::npos);
  }
  CHECK(second.process().StderrContains("1 jobs restored", kWait));
}

TEST_CASE("ctrund killed without a state dir stops the job cleanly",
          "[faults][integration]") {
  const std::string done = TempPath("done");
  Daemon daemon;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  std::vector<pid_t> workers;
  for (int n : {2, 3}) {
    nodes.push_back(Node(n, Flags(daemon.endpoint(), "2"), done));
  }
  for (auto& node : nodes) {
    auto line = node->WaitForLine("world=2", kWait);
    REQUIRE(line);
    workers.push_back(WorkerPid(*line));
  }
  daemon.process().Signal(SIGKILL);
  for (auto& node : nodes) {
    CHECK(node->Wait(kWait) == 1);
    CHECK(node->StderrContains(
        "the rendezvous at " + daemon.endpoint() + " went away",
        absl::ZeroDuration()));
  }
  for (pid_t pid : workers) CHECK_FALSE(Alive(pid));
}

TEST_CASE("Agents whose restored node is unknown stop and join afresh",
          "[faults][integration]") {
  Restartable r;
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n : {2, 3}) nodes.push_back(Node(n, Flags(r.endpoint, "2"), r.done));
  for (auto& node : nodes) REQUIRE(node->WaitForLine("world=2", kWait));
  r.KillFirst();
  // Restarted without its r.state: it knows nothing of the job.
  Daemon second({}, r.endpoint);
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->StderrContains("stopping the workers", kWait));
    CHECK(node->WaitForLine("world=2", kWait));  // a new round, fresh workers
  }
  r.EndWorkers();
  for (auto& node : nodes) CHECK(node->Wait(kWait) == 0);
}

TEST_CASE("A node that does not come back after a ctrund restart is lost",
          "[faults][integration]") {
  Restartable r;
  auto survivor = Node(2, Flags(r.endpoint, "1:2"), r.done);
  auto victim = Node(3, Flags(r.endpoint, "1:2"), r.done);
  REQUIRE(survivor->WaitForLine("world=2", kWait));
  auto victim_worker = victim->WaitForLine("world=2", kWait);
  REQUIRE(victim_worker);
  r.KillFirst();
  victim->Signal(SIGKILL);
  REQUIRE(victim->Wait(kWait));
  Daemon second({"--state-dir", r.state, "--reconnect-grace", "2"}, r.endpoint);
  // The lost node waits out its grace, shown as resuming.
  ChildProcess status({CtrundPath(), "status", "--endpoint", r.endpoint});
  const std::string table = status.ReadAll(kWait);
  CHECK(status.Wait(kWait) == 0);
  CHECK(table.find("resuming") != std::string::npos);
  CHECK(survivor->StderrContains("resumed with the rendezvous", kWait));
  auto restarted = survivor->WaitForLine("world=1", kWait);
  REQUIRE(restarted);
  CHECK(restarted->find("restart=0") != std::string::npos);  // a loss is free
  CHECK(survivor->StderrContains("did not resume", absl::ZeroDuration()));
  r.EndWorkers();
  CHECK(survivor->Wait(kWait) == 0);
}

TEST_CASE("A ctrund restarted while a round collects keeps its round",
          "[faults][integration]") {
  Restartable r;
  auto survivor = Node(2, Flags(r.endpoint, "2"), r.done);
  auto victim = Node(3, Flags(r.endpoint, "2"), r.done);
  REQUIRE(survivor->WaitForLine("world=2", kWait));
  REQUIRE(victim->WaitForLine("world=2", kWait));
  victim->Signal(SIGKILL);
  // Round 1 waits for a second node.
  REQUIRE(survivor->StderrContains("restarting the workers (round 1", kWait));
  auto waiting = [&] {
    auto job = AdminClient(r.first->Connect()).DescribeJob("faults");
    return job.ok() && job->phase() == v1::JobStatus::COLLECTING &&
           job->nodes_size() == 1 &&
           job->nodes(0).state() == v1::NodeStatus::JOINED;
  };
  for (int i = 0; i < 200 && !waiting(); ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  REQUIRE(waiting());
  r.KillFirst();

  Daemon second({"--state-dir", r.state}, r.endpoint);
  auto newcomer = Node(4, Flags(r.endpoint, "2"), r.done);
  auto line = survivor->WaitForLine("world=2", kWait);
  INFO(survivor->Stderr());
  REQUIRE(line);
  CHECK(line->find("restart=0") != std::string::npos);
  REQUIRE(newcomer->WaitForLine("world=2", kWait));
  auto job = AdminClient(second.Connect()).DescribeJob("faults");
  REQUIRE(job.ok());
  CHECK(job->round() == 1);  // the round number survived: no stale store
  r.EndWorkers();
  CHECK(survivor->Wait(kWait) == 0);
  CHECK(newcomer->Wait(kWait) == 0);
}

TEST_CASE("A ctrund restarted before the first round closes keeps the job",
          "[faults][integration]") {
  Restartable r;
  // One node of two has joined: round 0 collects, nobody has an assignment.
  auto first = Node(2, Flags(r.endpoint, "2"), r.done);
  auto joined = [&] {
    auto job = AdminClient(r.first->Connect()).DescribeJob("faults");
    return job.ok() && job->nodes_size() == 1;
  };
  for (int i = 0; i < 400 && !joined(); ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  REQUIRE(joined());
  r.KillFirst();
  REQUIRE(first->StderrContains("joining again", kWait));
  Daemon second({"--state-dir", r.state}, r.endpoint);
  auto other = Node(3, Flags(r.endpoint, "2"), r.done);
  INFO(first->Stderr());
  REQUIRE(first->WaitForLine("world=2", kWait));
  REQUIRE(other->WaitForLine("world=2", kWait));
  r.EndWorkers();
  CHECK(first->Wait(kWait) == 0);
  CHECK(other->Wait(kWait) == 0);
}

TEST_CASE("A node lost after its workers succeeded does not hang the job",
          "[faults][integration]") {
  Daemon daemon;
  const std::string done = TempPath("done");
  std::vector<std::string> argv = {CtrunPath(), "--local_addr=127.0.0.2"};
  for (auto& flag : Flags(daemon.endpoint(), "2")) argv.push_back(flag);
  argv.push_back("/bin/true");
  auto quick = std::make_unique<ChildProcess>(argv);
  auto slow = Node(3, Flags(daemon.endpoint(), "2"), done);
  REQUIRE(slow->WaitForLine("world=2", kWait));
  auto succeeded = [&] {
    auto job = AdminClient(daemon.Connect()).DescribeJob("faults");
    if (!job.ok()) return false;
    for (const auto& n : job->nodes()) {
      if (n.state() == v1::NodeStatus::SUCCEEDED) return true;
    }
    return false;
  };
  for (int i = 0; i < 400 && !succeeded(); ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  REQUIRE(succeeded());
  quick->Signal(SIGKILL);
  REQUIRE(quick->Wait(kWait));
  std::ofstream(done) << "";
  INFO(slow->Stderr());
  CHECK(slow->Wait(kWait) == 0);
  CHECK(slow->Stderr().find("restarting") == std::string::npos);
  std::filesystem::remove(done);
}

TEST_CASE("A TLS mismatch with the rendezvous fails within seconds, naming TLS",
          "[faults][integration]") {
  const std::string dir = TempPath("tls");
  std::filesystem::create_directories(dir);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string other = dir + "/other.pem", other_key = dir + "/other.key";
  MakeSelfSignedCert("127.0.0.1", cert, key);
  MakeSelfSignedCert("127.0.0.1", other, other_key);
  Daemon daemon({"--tls-cert", cert, "--tls-key", key});
  // Plaintext against TLS, and a CA that did not sign the daemon's
  // certificate: each would otherwise wait out the join timeout (600 s).
  for (const std::string& conf : {std::string(), ",tls_ca=" + other}) {
    ChildProcess agent({CtrunPath(), "--local_addr=127.0.0.2", "--nnodes=1",
                        "--rdzv_backend=c10d",
                        "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=tls",
                        "--rdzv_conf=is_host=0" + conf, "/bin/true"});
    CHECK(agent.Wait(absl::Seconds(20)) == 1);
    const std::string err = agent.Stderr();
    INFO(err);
    CHECK(err.find("cannot talk to the rendezvous at " + daemon.endpoint()) !=
          std::string::npos);
    CHECK(err.find("is TLS set up alike on both sides") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("Agents give up on a ctrund that does not come back",
          "[faults][integration]") {
  const std::string state = TempPath("state");
  const std::string done = TempPath("done");
  Daemon daemon({"--state-dir", state});
  auto node =
      Node(2, Flags(daemon.endpoint(), "1", ",reconnect_timeout=2"), done);
  auto line = node->WaitForLine("world=1", kWait);
  REQUIRE(line);
  daemon.process().Signal(SIGKILL);
  CHECK(node->Wait(kWait) == 1);
  CHECK(node->StderrContains("could not reconnect to the rendezvous",
                             absl::ZeroDuration()));
  CHECK_FALSE(Alive(WorkerPid(*line)));
  std::filesystem::remove_all(state);
}

TEST_CASE("A second ctrund on the same state dir is refused",
          "[faults][integration]") {
  const std::string state = TempPath("state");
  Daemon first({"--state-dir", state});
  ChildProcess second(
      {CtrundPath(), "--listen", "127.0.0.1:0", "--state-dir", state});
  CHECK(second.Wait(kWait) == 1);
  CHECK(second.StderrContains("is in use by another ctrund",
                              absl::ZeroDuration()));
  std::filesystem::remove_all(state);
}

TEST_CASE("Clients that never speak are dropped and hold nothing",
          "[faults][integration]") {
  Daemon daemon;
  // Raw TCP connections that never start HTTP/2.
  std::vector<int> sockets;
  for (int i = 0; i < 50; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(
        std::stoi(daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1))));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    sockets.push_back(fd);
  }
  // A session stream that is opened but never sends its join.
  auto stub = v1::Rendezvous::NewStub(daemon.Connect().channel());
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  // Others are served meanwhile.
  JoinSpec spec;
  spec.job = "busy";
  SessionProbe probe(daemon.Connect(), MakeJoin(spec));
  CHECK(probe.NextAssignment(kWait));

  const absl::Time start = absl::Now();
  v1::ServerMessage message;
  CHECK_FALSE(stream->Read(&message));
  const grpc::Status status = stream->Finish();
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(status.error_message().find("no join within") != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(15));
  // The silent connections are closed by the service's handshake timeout:
  // after its greeting, the next read sees the end.
  for (int fd : sockets) {
    timeval timeout{15, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char buffer[256];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof buffer)) > 0) {
    }
    CHECK(n == 0);  // not -1: that would be the 15 s timeout
    close(fd);
  }
  CHECK(absl::Now() - start < absl::Seconds(20));
}

}  // namespace
}  // namespace ctrun::testing
