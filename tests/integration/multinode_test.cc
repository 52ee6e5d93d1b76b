// Several agents as separate processes, each standing for a node on its own
// loopback address (127.0.0.2, 127.0.0.3, ...), meeting at a ctrund or at
// an agent that hosts the rendezvous.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "launcher/options/slurm.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/munged.h"
#include "tests/support/session_probe.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

// A port free on `address` right now.
int FreePort(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One agent: ctrun on 127.0.0.<n> running `script` with /bin/sh. Lines are
// prefixed "N<n>R<rank>| ".
std::unique_ptr<ChildProcess> Node(int n, std::vector<std::string> flags,
                                   const std::string& script) {
  std::vector<std::string> argv = {
      CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n),
      absl::StrCat("--log_line_prefix_template=N", n, "R${rank}| ")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return std::make_unique<ChildProcess>(argv);
}

const char kIdentity[] =
    "echo \"rank=$RANK group=$GROUP_RANK world=$WORLD_SIZE "
    "gws=$GROUP_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT "
    "restart=$TORCHELASTIC_RESTART_COUNT\"";

struct Seen {
  std::set<int> ranks;
  std::set<std::string> masters;
  std::set<int> worlds;
  int lines = 0;
};

Seen Parse(const std::string& out) {
  Seen s;
  std::regex re(
      "rank=([0-9]+) group=[0-9]+ world=([0-9]+) gws=[0-9]+ "
      "master=([0-9.]+:[0-9]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end;
       ++it) {
    s.ranks.insert(std::stoi((*it)[1]));
    s.worlds.insert(std::stoi((*it)[2]));
    s.masters.insert((*it)[3]);
    ++s.lines;
  }
  return s;
}

void CheckPermutation(const Seen& s, int world) {
  CHECK(s.lines == world);
  CHECK(s.worlds == std::set<int>{world});
  CHECK(s.masters.size() == 1);
  std::set<int> all;
  for (int r = 0; r < world; ++r) all.insert(r);
  CHECK(s.ranks == all);
}

TEST_CASE(
    "A node that cannot reach its rendezvous says so within seconds, naming "
    "the address and why",
    "[multinode][integration]") {
  const std::string endpoint =
      absl::StrCat("127.0.0.1:", FreePort("127.0.0.1"));  // nothing listens
  ChildProcess node({CtrunPath(), "--nnodes=2", "--nproc_per_node=1",
                     "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                     "--rdzv_conf=is_host=0,join_timeout=60", "/bin/true"});
  const absl::Time started = absl::Now();
  INFO(node.Stderr());
  CHECK(node.StderrContains(
      absl::StrCat("ctrun: cannot reach the rendezvous at ", endpoint,
                   " (connection refused); still trying for "),
      absl::Seconds(20)));
  CHECK(absl::Now() - started < absl::Seconds(10));
  node.Signal(SIGTERM);
  CHECK(node.Wait(kWait).has_value());
}

TEST_CASE(
    "A preemption signal to one node stops the ranks of both at one step, "
    "and both exit 0",
    "[multinode][integration]") {
  Daemon daemon;
  const std::vector<std::string> flags = {
      "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=preempted"};
  // C++ workers stepping at 2 ms x (rank + 1) until ctrun::ShouldStop().
  const std::string script = absl::StrCat("exec ", WorkerProbePath(), " stop");
  auto a = Node(2, flags, script);
  auto b = Node(3, flags, script);
  for (auto* node : {a.get(), b.get()}) {
    for (int i = 0; i < 2; ++i)
      REQUIRE(node->WaitForLine("ready rank=", kWait));
  }
  b->Signal(SIGTERM);
  const std::string out = a->ReadAll(kWait) + b->ReadAll(kWait);
  INFO(out << a->Stderr() << b->Stderr());
  CHECK(a->Wait(kWait) == 0);
  CHECK(b->Wait(kWait) == 0);
  std::set<std::string> steps, ranks;
  const std::regex line(
      "ok stop rank=([0-3]) step=([0-9]+) why=SIGTERM to ctrun on ");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end;
       ++it) {
    ranks.insert((*it)[1]);
    steps.insert((*it)[2]);
  }
  CHECK(ranks.size() == 4);
  CHECK(steps.size() == 1);
  CHECK(absl::StrContains(a->Stderr(), "ctrun: the job stops at step "));
}

TEST_CASE(
    "A node whose health check fails is refused with its message and "
    "quarantined, and the job waits for a healthy node",
    "[multinode][integration]") {
  Daemon daemon;
  const std::vector<std::string> flags = {
      "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=gated"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = flags;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  auto healthy = Node(2, with({"--health_check=true"}), kIdentity);
  auto sick = Node(
      3,
      with(
          {"--health_check=echo checking; echo 'scratch disk full' >&2; exit 4",
           "--quarantine_seconds=120"}),
      kIdentity);
  const std::optional<int> code = sick->Wait(kWait);
  INFO(sick->Stderr());
  CHECK(code == 1);
  CHECK(absl::StrContains(
      sick->Stderr(),
      "ctrun: this node failed its health check: `echo checking; echo "
      "'scratch disk full' >&2; exit 4` exited 4: scratch disk full"));
  CHECK(absl::StrContains(sick->Stderr(),
                          "failed its health check: `echo checking; echo "
                          "'scratch disk full' >&2; exit 4` exited 4: "
                          "scratch disk full; quarantined for 2m "
                          "(FAILED_PRECONDITION)"));
  // Quarantined: a healthy check from that host is refused too.
  auto again = Node(3, flags, kIdentity);
  CHECK(again->Wait(kWait) == 1);
  CHECK(absl::StrContains(again->Stderr(), "is quarantined for another "));
  // ctrund status lists it.
  ChildProcess status(
      {CtrundPath(), "status", "--endpoint", daemon.endpoint()});
  const std::string table = status.ReadAll(kWait);
  CHECK(status.Wait(kWait) == 0);
  CHECK(absl::StrContains(table, "quarantined nodes"));
  CHECK(absl::StrContains(table, " (127.0.0.3)  for another "));
  CHECK(absl::StrContains(table, "scratch disk full"));
  // The healthy node still waits; a healthy one elsewhere completes the job.
  auto other = Node(4, flags, kIdentity);
  const std::string out = healthy->ReadAll(kWait) + other->ReadAll(kWait);
  INFO(out << healthy->Stderr() << other->Stderr());
  CHECK(healthy->Wait(kWait) == 0);
  CHECK(other->Wait(kWait) == 0);
  CheckPermutation(Parse(out), 2);
}

TEST_CASE(
    "A rank killed on one node while the other node's ranks die of a reset "
    "connection first: every node names the killed rank as the root cause",
    "[multinode][integration]") {
  Daemon daemon;
  const std::vector<std::string> flags = {
      "--nnodes=2",          "--nproc_per_node=2",
      "--rdzv_backend=c10d", "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=cascade",   "--max_restarts=0"};
  // Group rank 1's ranks report their communication failure 0.3 s
  // before rank 1 (on group rank 0) is killed: the order a slow kill report
  // gives, which the rendezvous must see through.
  const std::string script =
      "if [ $RANK = 1 ]; then sleep 1.5; kill -9 $$; fi; "
      "if [ $GROUP_RANK = 1 ]; then sleep 1.2; echo 'RuntimeError: "
      "[gloo/transport/tcp/pair.cc:534] Connection reset by peer' >&2; "
      "exit 1; fi; sleep 30";
  auto with_hint = [&flags](int rank) {
    std::vector<std::string> f = flags;
    f.push_back(absl::StrCat("--node_rank=", rank));
    return f;
  };
  auto a = Node(2, with_hint(0), script);
  auto b = Node(3, with_hint(1), script);
  for (auto* node : {a.get(), b.get()}) {
    node->ReadAll(kWait);
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 137);  // the root cause's own code
    const std::string err = node->Stderr();
    const size_t root = err.find("Root Cause (first observed failure)");
    REQUIRE(root != std::string::npos);
    CHECK(err.find("rank       : 1 (local_rank: 1)", root) !=
          std::string::npos);
    CHECK(err.find("class      : signal", root) != std::string::npos);
    CHECK(err.find("Connection reset", root) == std::string::npos);
  }
}

TEST_CASE("Two nodes meet at a ctrund", "[multinode][integration]") {
  Daemon daemon;
  const std::vector<std::string> flags = {
      "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=pair"};
  auto a = Node(2, flags, kIdentity);
  auto b = Node(3, flags, kIdentity);
  const std::string out = a->ReadAll(kWait) + b->ReadAll(kWait);
  INFO(out << a->Stderr() << b->Stderr());
  REQUIRE(a->Wait(kWait) == 0);
  REQUIRE(b->Wait(kWait) == 0);
  const Seen s = Parse(out);
  CheckPermutation(s, 4);
  // MASTER_ADDR is group rank 0's own address, not a guessed name.
  const std::string master = *s.masters.begin();
  CHECK((master.rfind("127.0.0.2:", 0) == 0 ||
         master.rfind("127.0.0.3:", 0) == 0));
}

TEST_CASE("Three nodes meet at an agent that hosts the rendezvous",
          "[multinode][integration]") {
  const int port = FreePort("127.0.0.2");
  const std::vector<std::string> flags = {
      "--nnodes=3", "--nproc_per_node=1", "--rdzv_backend=c10d",
      absl::StrCat("--rdzv_endpoint=127.0.0.2:", port), "--rdzv_id=trio"};
  auto host = Node(2, flags, kIdentity);
  auto b = Node(3, flags, kIdentity);
  auto c = Node(4, flags, kIdentity);
  std::string out;
  for (auto* n : {host.get(), b.get(), c.get()}) out += n->ReadAll(kWait);
  for (auto* n : {host.get(), b.get(), c.get()}) {
    INFO(n->Stderr());
    CHECK(n->Wait(kWait) == 0);
  }
  CheckPermutation(Parse(out), 3);
}

TEST_CASE("A static rendezvous follows the node ranks and the given port",
          "[multinode][integration]") {
  const int port = FreePort("127.0.0.2");
  auto flags = [&](int rank) {
    return std::vector<std::string>{"--nnodes=2",
                                    "--nproc_per_node=2",
                                    "--rdzv_backend=static",
                                    absl::StrCat("--node_rank=", rank),
                                    "--master_addr=127.0.0.2",
                                    absl::StrCat("--master_port=", port)};
  };
  // Node rank 1 starts first and on the "wrong" address order.
  auto second = Node(3, flags(1), kIdentity);
  auto first = Node(2, flags(0), kIdentity);
  const std::string out1 = first->ReadAll(kWait);
  const std::string out2 = second->ReadAll(kWait);
  INFO(out1 << out2 << first->Stderr() << second->Stderr());
  REQUIRE(first->Wait(kWait) == 0);
  REQUIRE(second->Wait(kWait) == 0);
  CheckPermutation(Parse(out1 + out2), 4);
  CHECK(out1.find("rank=0 group=0") != std::string::npos);
  CHECK(out2.find("rank=2 group=1") != std::string::npos);
  CHECK(out1.find(absl::StrCat("master=127.0.0.2:", port)) !=
        std::string::npos);
}

TEST_CASE(
    "Without --local_addr, a static job's workers get the --master_addr given "
    "as MASTER_ADDR, as under torchrun",
    "[multinode][integration]") {
  const int port = FreePort("127.0.0.2");
  auto node = [&](int rank) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), "--nnodes=2", "--nproc_per_node=1",
        absl::StrCat("--node_rank=", rank), "--master_addr=127.0.0.2",
        absl::StrCat("--master_port=", port), "/bin/sh", "-c", kIdentity});
  };
  auto first = node(0);
  auto second = node(1);
  const std::string out = first->ReadAll(kWait) + second->ReadAll(kWait);
  INFO(out << first->Stderr() << second->Stderr());
  REQUIRE(first->Wait(kWait) == 0);
  REQUIRE(second->Wait(kWait) == 0);
  const Seen seen = Parse(out);
  CheckPermutation(seen, 2);
  CHECK(seen.masters ==
        std::set<std::string>{absl::StrCat("127.0.0.2:", port)});
  CHECK(first->Stderr().find("note:") == std::string::npos);
}

TEST_CASE(
    "Node 0 of a static job whose --master_port+1 is taken stops before "
    "starting anything, saying so in one line",
    "[multinode][integration]") {
  // Held by someone else: ctrun's rendezvous of the static form lives on
  // --master_port+1 of node 0.
  const int taken_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
  REQUIRE(bind(taken_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(taken_fd, 1) == 0);
  socklen_t len = sizeof a;
  getsockname(taken_fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int taken = ntohs(a.sin_port);
  ChildProcess node({CtrunPath(), "--nnodes=2", "--node_rank=0",
                     "--master_addr=127.0.0.2",
                     absl::StrCat("--master_port=", taken - 1), "/bin/sh", "-c",
                     "echo started"});
  const std::string out = node.ReadAll(kWait);
  CHECK(node.Wait(kWait) == 1);
  CHECK(out.empty());
  CHECK(node.Stderr() ==
        absl::StrCat("ctrun: cannot host the rendezvous (node rank 0 of a "
                     "static rendezvous, on --master_port+1 = ",
                     taken, "): cannot listen on 127.0.0.2:", taken,
                     " (address in use, or not an address of this machine)\n"));
  close(taken_fd);
}

// Workers that print their identity, then wait for a file to exist before
// exiting 0 (so the test decides when the job ends).
std::string Loop(const std::string& done_file) {
  return absl::StrCat(kIdentity, "; while [ ! -e ", done_file,
                      " ]; do sleep 0.05; done");
}

TEST_CASE("Killing one agent restarts the survivors with a smaller world",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string done = std::filesystem::temp_directory_path() /
                           ("ctrun-done-" + std::to_string(getpid()));
  const std::vector<std::string> flags = {
      "--nnodes=2:3",        "--nproc_per_node=1",
      "--rdzv_backend=c10d", "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=elastic",   "--rdzv_conf=last_call_timeout=1"};
  auto a = Node(2, flags, Loop(done));
  auto b = Node(3, flags, Loop(done));
  auto c = Node(4, flags, Loop(done));
  for (auto* n : {a.get(), b.get(), c.get()}) {
    REQUIRE(n->WaitForLine("world=3", kWait));
  }
  c->Signal(SIGKILL);
  // The survivors' workers are restarted in the next round within seconds,
  // without spending the restart budget (max_restarts is 0).
  auto a2 = a->WaitForLine("world=2", kWait);
  auto b2 = b->WaitForLine("world=2", kWait);
  REQUIRE(a2);
  REQUIRE(b2);
  CHECK(a2->find("restart=0") != std::string::npos);
  std::ofstream(done) << "";
  CHECK(a->Wait(kWait) == 0);
  CHECK(b->Wait(kWait) == 0);
  // Named by its --local_addr: every node here has the same hostname.
  CHECK(a->Stderr().find(absl::StrCat("node 127.0.0.4:", c->pid(),
                                      " was lost")) != std::string::npos);
  std::filesystem::remove(done);
}

TEST_CASE("Workers of a node started with --local_addr are prefixed with it",
          "[multinode][integration]") {
  const std::vector<std::string> flags = {"--standalone", "--nproc_per_node=2",
                                          "--local_addr=127.0.0.2"};
  std::vector<std::string> argv = {CtrunPath()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", "echo hello"});
  ChildProcess p(argv);
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  CHECK(p.Wait(kWait) == 0);
  CHECK(out.find("[127.0.0.2:0]: hello") != std::string::npos);
  CHECK(out.find("[127.0.0.2:1]: hello") != std::string::npos);
}

TEST_CASE("Agents stopped by a signal one after another ask each worker once",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-term-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> flags = {
      "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=term"};
  // Each worker takes a second to save its state after SIGTERM.
  const std::string worker =
      absl::StrCat("exec ", SourceDir(),
                   "/tests/support/shell_worker.sh signal ", dir, " TERM");
  auto a = Node(2, flags, worker);
  auto b = Node(3, flags, worker);
  for (int r = 0; r < 4; ++r) {
    const std::string ready = absl::StrCat(dir, "/ready.", r);
    for (int i = 0; i < 600 && !std::filesystem::exists(ready); ++i)
      absl::SleepFor(absl::Milliseconds(50));
    REQUIRE(std::filesystem::exists(ready));
  }
  // a's node leaves while b's workers are still saving: b must not restart
  // them or signal them again.
  a->Signal(SIGTERM);
  absl::SleepFor(absl::Milliseconds(300));
  b->Signal(SIGTERM);
  CHECK(a->Wait(kWait) == 128 + SIGTERM);
  CHECK(b->Wait(kWait) == 128 + SIGTERM);
  INFO(a->Stderr() << b->Stderr());
  CHECK(b->Stderr().find("restarting") == std::string::npos);
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(absl::StrCat(dir, "/TERM.", r));
    int count = 0;
    in >> count;
    INFO("rank " << r);
    CHECK(count == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("A node that joins a running job with room is admitted",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string done = std::filesystem::temp_directory_path() /
                           ("ctrun-grow-" + std::to_string(getpid()));
  const std::vector<std::string> flags = {
      "--nnodes=2:3",        "--nproc_per_node=1",
      "--rdzv_backend=c10d", "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=grow",      "--rdzv_conf=last_call_timeout=1"};
  auto a = Node(2, flags, Loop(done));
  auto b = Node(3, flags, Loop(done));
  REQUIRE(a->WaitForLine("world=2", kWait));
  REQUIRE(b->WaitForLine("world=2", kWait));
  auto c = Node(4, flags, Loop(done));
  for (auto* n : {a.get(), b.get(), c.get()}) {
    REQUIRE(n->WaitForLine("world=3", kWait));
  }
  std::ofstream(done) << "";
  for (auto* n : {a.get(), b.get(), c.get()}) CHECK(n->Wait(kWait) == 0);
  std::filesystem::remove(done);
}

TEST_CASE("A stopped agent is declared lost and refused when it resumes",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string done = std::filesystem::temp_directory_path() /
                           ("ctrun-stop-" + std::to_string(getpid()));
  const std::vector<std::string> flags = {
      "--nnodes=1:2",
      "--nproc_per_node=1",
      "--rdzv_backend=c10d",
      "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=stall",
      "--rdzv_conf=last_call_timeout=1,heartbeat_timeout=2,"
      "keep_alive_interval=0.2"};
  auto a = Node(2, flags, Loop(done));
  auto b = Node(3, flags, Loop(done));
  REQUIRE(a->WaitForLine("world=2", kWait));
  REQUIRE(b->WaitForLine("world=2", kWait));
  b->Signal(SIGSTOP);
  REQUIRE(a->WaitForLine("world=1", kWait));
  b->Signal(SIGCONT);
  CHECK(b->Wait(kWait) == 1);
  CHECK(b->Stderr().find("declared lost") != std::string::npos);
  std::ofstream(done) << "";
  CHECK(a->Wait(kWait) == 0);
  std::filesystem::remove(done);
}

TEST_CASE("With a ctrund the others continue when group rank 0's agent dies",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string done = std::filesystem::temp_directory_path() /
                           ("ctrun-rank0-" + std::to_string(getpid()));
  const std::vector<std::string> flags = {
      "--nnodes=2:3",        "--nproc_per_node=1",
      "--rdzv_backend=c10d", "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=headless",  "--rdzv_conf=last_call_timeout=1"};
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n : {2, 3, 4}) nodes.push_back(Node(n, flags, Loop(done)));
  // Find the agent whose worker got rank 0.
  int rank0 = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto line = nodes[i]->WaitForLine("world=3", kWait);
    REQUIRE(line);
    if (line->find("rank=0 ") != std::string::npos) rank0 = static_cast<int>(i);
  }
  REQUIRE(rank0 >= 0);
  nodes[rank0]->Signal(SIGKILL);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (static_cast<int>(i) == rank0) continue;
    REQUIRE(nodes[i]->WaitForLine("world=2", kWait));
  }
  std::ofstream(done) << "";
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (static_cast<int>(i) != rank0) CHECK(nodes[i]->Wait(kWait) == 0);
  }
  std::filesystem::remove(done);
}

TEST_CASE("Training across nodes survives a lost node from its checkpoint",
          "[multinode][integration]") {
  Daemon daemon;
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-ckpt-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto run = [&](int n) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=2:3",
        "--nproc_per_node=1", "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=train-mn",
        "--rdzv_conf=last_call_timeout=1", TrainPath(), "--steps", "4000",
        "--checkpoint_dir", dir, "--checkpoint_every", "100"});
  };
  auto a = run(2);
  auto b = run(3);
  auto c = run(4);
  // Once training is under way on three nodes and has saved a checkpoint
  // (the rename commits it), one node is lost.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!std::filesystem::exists(dir + "/train.ckpt") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(std::filesystem::exists(dir + "/train.ckpt"));
  c->Signal(SIGKILL);
  const std::string out = a->ReadAll(kWait) + b->ReadAll(kWait);
  INFO(out << a->Stderr());
  CHECK(a->Wait(kWait) == 0);
  CHECK(b->Wait(kWait) == 0);
  CHECK(out.find("resuming from step") != std::string::npos);
  std::regex final_line("final step=4000 loss=[0-9.]+ params_sha256=");
  CHECK(std::distance(std::sregex_iterator(out.begin(), out.end(), final_line),
                      std::sregex_iterator()) == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Nodes and their workers meet over TLS with a shared token",
          "[multinode][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-tls-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string token = dir + "/token";
  std::ofstream(token) << "shared-secret\n";
  MakeSelfSignedCert("127.0.0.2", cert, key);
  const int port = FreePort("127.0.0.2");
  auto node = [&](int n, const std::string& tls) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=2",
        "--nproc_per_node=2", "--rdzv_backend=c10d",
        absl::StrCat("--rdzv_endpoint=127.0.0.2:", port), "--rdzv_id=tls",
        "--rdzv_conf=token_file=" + token + ",tls_ca=" + cert + tls,
        WorkerProbePath(), "store"});
  };
  auto host = node(2, ",tls_cert=" + cert + ",tls_key=" + key);
  auto other = node(3, "");
  const std::string out = host->ReadAll(kWait) + other->ReadAll(kWait);
  INFO(out << host->Stderr() << other->Stderr());
  CHECK(host->Wait(kWait) == 0);
  CHECK(other->Wait(kWait) == 0);
  std::regex ok("ok store rank=[0-3]");
  CHECK(std::distance(std::sregex_iterator(out.begin(), out.end(), ok),
                      std::sregex_iterator()) == 4);
  std::filesystem::remove_all(dir);
}

// `ctrun status` with `args`, as a user runs it on a node of the job: its
// exit code, stdout and stderr.
struct StatusRun {
  std::optional<int> code;
  std::string out, err;
};
StatusRun CtrunStatus(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {CtrunPath(), "status"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess status(argv, env);
  StatusRun run;
  run.out = status.ReadAll(kWait);
  run.code = status.Wait(kWait);
  run.err = status.Stderr();
  return run;
}

std::string ShellWorker() {
  return SourceDir() + "/tests/support/shell_worker.sh";
}

// Waits until DIR/ready.RANK exists for each of `ranks` ranks.
bool AllReady(const std::string& dir, int ranks) {
  for (int i = 0; i < 600; ++i) {
    int ready = 0;
    for (int r = 0; r < ranks; ++r) {
      ready += std::filesystem::exists(absl::StrCat(dir, "/ready.", r));
    }
    if (ready == ranks) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

TEST_CASE(
    "Every node of a failed job names the same root cause and exits with its "
    "code",
    "[multinode][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-root-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const int port = FreePort("127.0.0.2");
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n : {2, 3}) {
    nodes.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n),
        "--nproc_per_node=2", "--nnodes=2", "--rdzv_backend=c10d",
        absl::StrCat("--rdzv_endpoint=127.0.0.2:", port), "--rdzv_id=root",
        absl::StrCat("--rdzv_conf=is_host=", n == 2 ? 1 : 0), "--no_python",
        ShellWorker(), "fail", dir, "2", "7"}));
  }
  for (auto& node : nodes) {
    node->ReadAll(absl::Seconds(60));
    INFO(node->Stderr());
    CHECK(node->Wait(absl::Seconds(60)) == 7);
    const std::string err = node->Stderr();
    const size_t root = err.find("Root Cause (first observed failure)");
    REQUIRE(root != std::string::npos);
    CHECK(err.find("rank       : 2 (local_rank: 0)", root) !=
          std::string::npos);
    CHECK(err.find("exitcode   : 7", root) != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// Fails before: "a --standalone job's rendezvous lives inside its ctrun
// and cannot be asked".
TEST_CASE("ctrun status without flags shows this machine's --standalone jobs",
          "[multinode][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-local-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  // Its own TMPDIR: other tests run --standalone jobs of this user too.
  const std::vector<std::string> env = {"TMPDIR=" + dir};
  ChildProcess job(
      {CtrunPath(), "--standalone", "--nproc_per_node=2", "--rdzv_id=alone",
       "--no_python", ShellWorker(), "wait", dir},
      env);
  REQUIRE(AllReady(dir, 2));
  const StatusRun shown = CtrunStatus({}, env);
  INFO(shown.out << shown.err);
  CHECK(shown.code == 0);
  CHECK(absl::StrContains(
      shown.out,
      absl::StrCat("# --standalone job 'alone' of ctrun pid ", job.pid())));
  CHECK(absl::StrContains(shown.out, "job alone  running  round 0"));
  CHECK(absl::StrContains(shown.out, "world 2"));
  const StatusRun json = CtrunStatus({"--json"}, env);
  CHECK(json.code == 0);
  CHECK(absl::StrContains(json.out, "\"alone\""));
  CHECK_FALSE(absl::StrContains(json.out, "# --standalone"));
  std::ofstream(dir + "/go").close();
  INFO(job.Stderr());
  CHECK(job.Wait(kWait) == 0);
  // Ended: nothing left to find.
  const StatusRun after = CtrunStatus({}, env);
  CHECK(after.code == 2);
  CHECK(absl::StrContains(after.err, "no --standalone job of yours runs"));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "ctrun status shows a running job's round, nodes, ranks, restarts and "
    "last failure",
    "[multinode][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-status-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string token = dir + "/token", wrong = dir + "/wrong";
  std::ofstream(token) << "status-secret\n";
  std::ofstream(wrong) << "not-the-secret\n";
  const int port = FreePort("127.0.0.2");
  // The rendezvous flags of the launch, which status takes as they are.
  const std::vector<std::string> rendezvous = {
      "--nnodes=2", "--rdzv_backend=c10d",
      absl::StrCat("--rdzv_endpoint=127.0.0.2:", port), "--rdzv_id=watched",
      "--rdzv_conf=token_file=" + token};
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n : {2, 3}) {
    std::vector<std::string> argv = {
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n),
        "--nproc_per_node=2", "--max_restarts=2", "--no_python"};
    argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
    argv.insert(argv.end(), {ShellWorker(), "flaky", dir, "3", "5"});
    nodes.push_back(std::make_unique<ChildProcess>(argv));
  }
  // Rank 3 failed in round 0; in round 1 every rank runs until told.
  REQUIRE(AllReady(dir, 4));

  const StatusRun shown = CtrunStatus(rendezvous);
  INFO(shown.out << shown.err);
  CHECK(shown.code == 0);
  CHECK(std::regex_search(
      shown.out, std::regex("job watched  running  round 1  nodes 2 \\(min 2, "
                            "max 2\\)  world 4  restarts 1/2  master "
                            "127\\.0\\.0\\.[23]:[0-9]+")));
  CHECK(std::regex_search(
      shown.out,
      std::regex("last restart: round 1, worker_failed: worker rank 3 "
                 "\\(local 1\\) on [^ ]+ exited with code 5; restart 1 of 2")));
  // One line a node: its group rank, address, state and ranks.
  CHECK(std::regex_search(
      shown.out,
      std::regex("\n  0 +[^ ]+ +127\\.0\\.0\\.[23] +[0-9]+ +active +0-1 ")));
  CHECK(std::regex_search(
      shown.out,
      std::regex("\n  1 +[^ ]+ +127\\.0\\.0\\.[23] +[0-9]+ +active +2-3 ")));

  const StatusRun json = CtrunStatus([&] {
    auto args = rendezvous;
    args.push_back("--json");
    return args;
  }());
  INFO(json.out << json.err);
  CHECK(json.code == 0);
  CHECK(absl::StrContains(json.out, "\"job_id\": \"watched\""));
  CHECK(absl::StrContains(json.out, "\"phase\": \"RUNNING\""));
  CHECK(absl::StrContains(json.out, "\"round\": 1,"));
  CHECK(absl::StrContains(json.out, "\"restart_count\": 1,"));
  CHECK(absl::StrContains(json.out, "\"reason\": \"WORKER_FAILED\""));

  // What goes wrong is said in one line, and nothing is shown.
  auto refused = [](const StatusRun& run, int code, const std::string& why) {
    INFO(run.out << run.err);
    CHECK(run.code == code);
    CHECK(run.out.empty());
    CHECK(CountMatches(run.err, "\n") == 1);
    CHECK(absl::StrContains(run.err, why));
  };
  auto with = [&](const std::string& flag) {
    auto args = rendezvous;
    args.push_back(flag);
    return args;
  };
  refused(CtrunStatus(with("--rdzv_conf=token_file=" + wrong)), 1,
          "wrong rendezvous token");
  refused(CtrunStatus(with("--rdzv_id=nope")), 1,
          "holds no job 'nope' (not started yet, ended, or another --rdzv_id)");
  // In a TMPDIR of its own: other tests' --standalone jobs would be shown.
  refused(CtrunStatus({}, {"TMPDIR=" + dir}), 2, "no rendezvous to ask");
  refused(CtrunStatus({"train.py"}), 2, "takes flags only");
  refused(CtrunStatus({"--rdzv_endpoint=127.0.0.2:x"}), 2, "rdzv_endpoint");

  std::ofstream(dir + "/go").close();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
  }
  // A job that ended is no longer held: the hosting agent has left.
  refused(CtrunStatus(rendezvous), 1, "cannot ask the rendezvous");
  std::filesystem::remove_all(dir);
}

TEST_CASE("A join timeout with a node missing says who joined",
          "[multinode][integration]") {
  Daemon daemon;
  auto a = Node(2,
                {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                 "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=alone",
                 "--rdzv_conf=join_timeout=1"},
                kIdentity);
  CHECK(a->Wait(kWait) == 1);
  const std::string err = a->Stderr();
  CHECK(err.find("1 of at least 2 nodes") != std::string::npos);
  CHECK(err.find("joined: [") != std::string::npos);
}

// A Slurm step's environment for node `node_id` of two (127.0.0.2 and
// 127.0.0.3), without Slurm's daemons: munge is what is tested here.
std::vector<std::string> FakeSlurmStep(const std::string& job_id, int node_id,
                                       const std::string& munge_socket) {
  return {"SLURM_JOB_ID=" + job_id,
          "SLURM_STEP_ID=0",
          "SLURM_JOB_NUM_NODES=2",
          "SLURM_STEP_NUM_NODES=2",
          "SLURM_JOB_NODELIST=127.0.0.2,127.0.0.3",
          "SLURM_STEP_NODELIST=127.0.0.2,127.0.0.3",
          absl::StrCat("SLURM_NODEID=", node_id),
          "SLURM_CONF=/nonexistent/slurm.conf",
          "CTRUN_MUNGE_SOCKET=" + munge_socket};
}

std::unique_ptr<ChildProcess> SlurmNode(const std::string& job_id, int node_id,
                                        const std::string& munge_socket) {
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{
          CtrunPath(), absl::StrCat("--local_addr=127.0.0.", node_id + 2),
          "--nproc_per_node=2", WorkerProbePath(), "store"},
      FakeSlurmStep(job_id, node_id, munge_socket));
}

TEST_CASE("Under Slurm agents and workers authenticate with munge",
          "[multinode][integration]") {
  Munged munged;
  const std::string job =
      std::to_string(500000 + std::random_device()() % 100000);
  auto host = SlurmNode(job, 0, munged.socket());
  // The hosting agent's service, once up, refuses calls without a
  // credential, and credentials made for another job.
  const std::string endpoint =
      absl::StrCat("127.0.0.2:", SlurmRendezvousPort(job));
  auto admin = [&](std::optional<MungeAuth> munge) {
    ConnectionOptions options;
    options.endpoint = endpoint;
    options.munge = munge;
    auto connection = Connection::Open(options);
    REQUIRE(connection.ok());
    return AdminClient(*connection).ListJobs().status();
  };
  absl::Status anonymous = absl::UnavailableError("");
  for (int i = 0; i < 100 && absl::IsUnavailable(anonymous); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    anonymous = admin(std::nullopt);
  }
  CHECK(absl::IsUnauthenticated(anonymous));
  CHECK(anonymous.message().find("missing munge credential") !=
        std::string::npos);
  const absl::Status other_job = admin(MungeAuth{munged.socket(), "slurm-1.0"});
  CHECK(absl::IsPermissionDenied(other_job));
  CHECK(other_job.message().find("another job") != std::string::npos);
  // A status-only credential (ctrun status from another step) reads the
  // jobs, and can neither join one nor reach its store.
  const MungeAuth status_only{munged.socket(), ""};
  CHECK(admin(status_only).ok());
  {
    ConnectionOptions options;
    options.endpoint = endpoint;
    options.munge = status_only;
    auto connection = Connection::Open(options);
    REQUIRE(connection.ok());
    JoinSpec spec;
    spec.job = absl::StrCat("slurm-", job, ".0");
    SessionProbe intruder(*connection, MakeJoin(spec));
    auto done = intruder.WaitDone(kWait);
    REQUIRE(done);
    CHECK(absl::IsPermissionDenied(*done));
    StoreClient store(*connection, spec.job, 0, absl::Seconds(10));
    const absl::Status set = store.Set("key", "value");
    INFO(set.ToString());
    CHECK(absl::IsPermissionDenied(set));
  }

  auto second = SlurmNode(job, 1, munged.socket());
  const std::string out = host->ReadAll(kWait) + second->ReadAll(kWait);
  INFO(out << host->Stderr() << second->Stderr());
  CHECK(host->Wait(kWait) == 0);
  CHECK(second->Wait(kWait) == 0);
  // The workers' store calls carried munge credentials too.
  std::regex ok("ok store rank=[0-3]");
  CHECK(std::distance(std::sregex_iterator(out.begin(), out.end(), ok),
                      std::sregex_iterator()) == 4);
}

TEST_CASE(
    "Under Slurm ctrun status in the batch step needs no flags and shows the "
    "step that trains",
    "[multinode][integration]") {
  Munged munged;
  const std::string job =
      std::to_string(500000 + std::random_device()() % 100000);
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-mn-slurm-status-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int id : {0, 1}) {
    nodes.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CtrunPath(), absl::StrCat("--local_addr=127.0.0.", id + 2),
            "--nproc_per_node=2", "--no_python", ShellWorker(), "wait", dir},
        FakeSlurmStep(job, id, munged.socket())));
  }
  REQUIRE(AllReady(dir, 4));
  // The batch step: Slurm's job, no step, on the allocation's first node.
  std::vector<std::string> batch;
  for (const std::string& v : FakeSlurmStep(job, 0, munged.socket())) {
    if (!absl::StartsWith(v, "SLURM_STEP_")) batch.push_back(v);
  }
  const StatusRun shown = CtrunStatus({}, batch);
  INFO(shown.out << shown.err);
  CHECK(shown.code == 0);
  CHECK(absl::StrContains(
      shown.out,
      absl::StrCat("job slurm-", job, ".0  running  round 0  nodes 2")));
  CHECK(CountMatches(shown.out, " active ") == 2);
  // A node without munge says so.
  std::vector<std::string> no_munge;
  for (const std::string& v : batch) {
    no_munge.push_back(absl::StartsWith(v, "CTRUN_MUNGE_SOCKET=")
                           ? "CTRUN_MUNGE_SOCKET=/nonexistent/munge.socket"
                           : v);
  }
  const StatusRun refused = CtrunStatus({}, no_munge);
  CHECK(refused.code == 2);
  CHECK(absl::StrContains(refused.err, "authenticates with munge"));

  std::ofstream(dir + "/go").close();
  for (auto& node : nodes) {
    INFO(node->Stderr());
    CHECK(node->Wait(kWait) == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("Under Slurm a node without munge stops at once and says so",
          "[multinode][integration]") {
  ChildProcess node({CtrunPath(), "--local_addr=127.0.0.2",
                     "--nproc_per_node=1", "/bin/true"},
                    FakeSlurmStep("4242", 0, "/nonexistent/munge.socket"));
  CHECK(node.Wait(kWait) == 2);
  CHECK(node.Stderr().find("authenticates with munge") != std::string::npos);
  CHECK(node.Stderr().find("/nonexistent/munge.socket") != std::string::npos);
  CHECK(node.Stderr().find("CTRUN_RDZV_TOKEN") != std::string::npos);
}

TEST_CASE(
    "A hang on one node has every node keep its evidence, then both "
    "restart",
    "[multinode][integration]") {
  Daemon daemon;
  const char* tmp = getenv("TMPDIR");
  const std::string logs =
      absl::StrCat(tmp ? tmp : "/tmp", "/hang-two-nodes-", getpid());
  std::filesystem::remove_all(logs);
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n : {2, 3}) {
    nodes.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=2",
        "--nproc_per_node=2", "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=hang-pair",
        "--max_restarts=1", "--hang_timeout=2", "--hang_evidence_timeout=20",
        "--log_dir", absl::StrCat(logs, "/node", n), WorkerProbePath(), "steps",
        "60", "3"}));
  }
  std::string out, err;
  for (auto& node : nodes) out += node->ReadAll(kWait);
  for (auto& node : nodes) {
    CHECK(node->Wait(kWait) == 0);
    err += node->Stderr();
  }
  INFO(out << err);
  CHECK(absl::StrContains(err, "worker rank 3 (local 1, pid "));
  // At least the timeout (shown cut to 10 ms: "2s", "2.07s").
  CHECK(absl::StrContains(err, ") is hung: no progress for 2"));
  CHECK(absl::StrContains(err, "in section 'step'"));
  // Both nodes kept the evidence of their own workers.
  int kept = 0;
  for (int n : {2, 3}) {
    for (const auto& run :
         std::filesystem::directory_iterator(absl::StrCat(logs, "/node", n))) {
      const auto incident = run.path() / "hang_round_0";
      if (!std::filesystem::is_directory(incident)) continue;
      int outputs = 0;
      for (const auto& f : std::filesystem::directory_iterator(incident)) {
        outputs += absl::EndsWith(f.path().string(), ".output.txt");
      }
      CHECK(outputs == 2);
      ++kept;
    }
  }
  CHECK(kept == 2);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(absl::StrContains(
        out, absl::StrCat("ok steps rank=", rank, " restart=1")));
  }
  std::filesystem::remove_all(logs);
}

}  // namespace
}  // namespace ctrun::testing
