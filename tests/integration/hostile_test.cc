// What a worker, a path or a flag can do to an agent (issue: nothing takes
// the agent down or kills a healthy job): real ctrun and ctrund binaries,
// real worker processes, real FIFOs and sockets.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/run_directory.h"
#include "rendezvous/ops/metrics.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/http_get.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

// A fresh folder under the test's TMPDIR.
std::string Scratch(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          absl::StrCat("hostile-", name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string WriteScript(const std::string& dir, const std::string& name,
                        const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

struct Ended {
  std::optional<int> code;
  std::string err;
};

Ended Run(std::vector<std::string> argv, absl::Duration timeout = kWait,
          std::vector<std::string> env = {}) {
  ChildProcess p(std::move(argv), std::move(env));
  Ended e;
  e.code = p.Wait(timeout);
  if (!e.code) {
    p.Signal(SIGKILL);
    p.Wait(absl::Seconds(10));
  }
  e.err = p.Stderr();
  return e;
}

TEST_CASE("A worker that truncates the progress board cannot crash its agent",
          "[hostile][integration]") {
  const std::string dir = Scratch("truncate");
  // Every way a worker can shrink a file it can open.
  const std::string script = WriteScript(dir, "truncate.py", R"(
import os, time
path = os.environ["CTRUN_PROGRESS_FILE"]
refused = 0
for attempt in (lambda: open(path, "w").close(),
                lambda: os.truncate(path, 0),
                lambda: os.truncate(path, 10)):
    try:
        attempt()
    except OSError:
        refused += 1
print("refused", refused, flush=True)
time.sleep(1)  # the agent reads the board several times meanwhile
)");
  for (const char* hang : {"--hang_timeout=30", "--hang_timeout=off"}) {
    INFO(hang);
    const Ended e =
        Run({CtrunPath(), "--standalone", "--nproc_per_node=2", hang, script});
    INFO(e.err);
    CHECK(e.code == 0);  // was 135 (SIGBUS)
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "A worker that removes the progress board leaves the next round "
    "reporting",
    "[hostile][integration]") {
  const std::string dir = Scratch("remove");
  const std::string script = WriteScript(dir, "remove.py", R"(
import os, sys, time
import ctrun
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    try:
        os.remove(os.environ["CTRUN_PROGRESS_FILE"])  # a temp-dir cleanup
    except OSError:
        pass
    sys.exit(1)
for _ in range(12):
    ctrun.heartbeat()
    time.sleep(0.25)
)");
  const Ended e = Run({CtrunPath(), "--standalone", "--nproc_per_node=2",
                       "--max_restarts=1", "--hang_timeout=1.5",
                       "--hang_warmup=0", script});
  INFO(e.err);
  CHECK(e.code == 0);  // was 124: heartbeats went to a removed file
  CHECK_FALSE(absl::StrContains(e.err, "is hung"));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "An event log or token file that is a FIFO nobody serves is refused at "
    "once",
    "[hostile][integration]") {
  const std::string dir = Scratch("fifo");
  const std::string fifo = dir + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const Ended agent =
      Run({CtrunPath(), "--standalone", "--event_log", fifo, "/bin/true"},
          absl::Seconds(20));
  INFO(agent.err);
  CHECK(agent.code == 2);  // was: blocked for ever, deaf to signals
  CHECK(absl::StrContains(agent.err, "--event_log: cannot open " + fifo +
                                         " for appending: it is a FIFO that "
                                         "nobody reads"));
  const Ended daemon =
      Run({CtrundPath(), "--listen", "127.0.0.1:0", "--event-log", fifo},
          absl::Seconds(20));
  INFO(daemon.err);
  CHECK(daemon.code == 2);
  CHECK(absl::StrContains(daemon.err, "it is a FIFO that nobody reads"));
  // A token file is read, not written: a FIFO without a writer is empty,
  // one whose writer never finishes is given up on.
  const Ended token =
      Run({CtrundPath(), "--listen", "127.0.0.1:0", "--token-file", fifo},
          absl::Seconds(20));
  INFO(token.err);
  CHECK(token.code == 2);
  CHECK(absl::StrContains(token.err, fifo));
  std::filesystem::remove_all(dir);
}

TEST_CASE("A failing event log is said once by ctrun",
          "[hostile][integration]") {
  const Ended e = Run({CtrunPath(), "--standalone", "--nproc_per_node=2",
                       "--event_log", "/dev/full", "/bin/true"});
  INFO(e.err);
  CHECK(e.code == 0);
  CHECK(CountMatches(e.err, "event log /dev/full: write failed") == 1);
}

TEST_CASE("A job id never puts the run folder outside --log_dir",
          "[hostile][integration]") {
  const std::string dir = Scratch("rdzv-id");
  const std::string logs = dir + "/logs";
  for (const char* id : {"../escaped", "a/b", ".."}) {
    INFO(id);
    const Ended e = Run({CtrunPath(), "--standalone", "--log_dir", logs,
                         absl::StrCat("--rdzv_id=", id), "/bin/true"});
    INFO(e.err);
    CHECK(e.code == 0);
  }
  // Only the log dir itself in the scratch folder, and in it one folder
  // per run, none nested.
  int outside = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    outside += entry.path() != logs;
  }
  CHECK(outside == 0);
  int runs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    ++runs;
    CHECK(std::filesystem::exists(entry.path() / "attempt_0"));
  }
  CHECK(runs == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "A --hang_timeout does not kill a job whose workers never send a progress "
    "signal",
    "[hostile][integration]") {
  // A torchrun user's unmodified script with "--hang_timeout like NCCL's".
  const Ended e =
      Run({CtrunPath(), "--standalone", "--nproc_per_node=2",
           "--hang_timeout=1", "--hang_warmup=1", "/bin/sh", "-c", "sleep 4"});
  INFO(e.err);
  CHECK(e.code == 0);  // was 124
  CHECK(absl::StrContains(e.err,
                          "no worker of this job has sent a progress signal"));
  CHECK(CountMatches(e.err, "no worker of this job has sent") == 1);
}

// A TCP connection to 127.0.0.1:`port`, or -1.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    return fd;
  }
  if (fd >= 0) close(fd);
  return -1;
}

TEST_CASE("Idle connections do not keep scrapes from the metrics endpoint",
          "[hostile][integration]") {
  RendezvousMetrics metrics;
  auto endpoint = MetricsEndpoint::Start(Endpoint{"127.0.0.1", 0}, metrics);
  REQUIRE(endpoint.ok());
  const int port = (*endpoint)->endpoint().port;
  // A port scan's worth of connections that never send a byte.
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectLoopback(port);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  for (int scrape = 0; scrape < 5; ++scrape) {
    auto body = HttpGet("127.0.0.1", port, "/metrics", absl::Seconds(2));
    REQUIRE(body.ok());
    CHECK(absl::StrContains(*body, "# TYPE ctrund_rounds_total counter"));
  }
  auto missing = HttpGet("127.0.0.1", port, "/nothing", absl::Seconds(2));
  CHECK(absl::IsFailedPrecondition(missing.status()));
  for (int fd : idle) close(fd);
}

// Fails before: the listener stayed readable in the level-triggered set
// while accept failed for lack of descriptors, and the thread spun.
TEST_CASE(
    "ctrund's metrics endpoint out of descriptors does not spin, and "
    "serves again once they are back",
    "[hostile][integration]") {
#if defined(__SANITIZE_ADDRESS__)
  // Not in the sanitized build: UndefinedBehaviorSanitizer's type check
  // probes memory through a pipe, which a process out of descriptors
  // cannot make, and it then ends the daemon (as for the agent's flood
  // test). The connections are still sent, to a daemon with room for them.
  const char* const limit = "--nofile=2000:2000";
#else
  const char* const limit = "--nofile=120:120";
#endif
  ChildProcess daemon({"/usr/bin/prlimit", limit, CtrundPath(), "--listen",
                       "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"});
  REQUIRE(daemon.StderrContains("metrics on http://", kWait));
  const std::string said = daemon.Stderr();
  const size_t at = said.find("metrics on http://127.0.0.1:");
  REQUIRE(at != std::string::npos);
  const int port = std::stoi(said.substr(at + 28));
  // More connections than the daemon has descriptors for; they wait in
  // the listener's queue.
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) {
    const int fd = ConnectLoopback(port);
    if (fd < 0) break;  // the queue is full
    held.push_back(fd);
  }
  INFO(held.size() << " connections held");
  REQUIRE(held.size() == 200);
  absl::SleepFor(absl::Milliseconds(300));
  const long before = CpuTicks(daemon.pid());
  absl::SleepFor(absl::Seconds(2));
  const long used = CpuTicks(daemon.pid()) - before;
  // A spinning thread takes ~2 s (200 ticks) of these 2 s.
  CHECK(used < 50);
  for (int fd : held) close(fd);
  // With its descriptors back it answers again.
  absl::StatusOr<std::string> body;
  for (int i = 0; i < 50 && !body.ok(); ++i) {
    body = HttpGet("127.0.0.1", port, "/metrics", absl::Seconds(2));
    if (!body.ok()) absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(body.ok());
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(kWait) == 0);
}

TEST_CASE("ctrun status names an address that never speaks gRPC",
          "[hostile][integration]") {
  // A listener that takes connections and says nothing (the kernel
  // completes the handshakes; nobody accepts).
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(fd, 16) == 0);
  socklen_t length = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  const std::string endpoint = absl::StrCat("127.0.0.1:", ntohs(a.sin_port));
  const Ended e = Run({CtrunPath(), "status", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + endpoint, "--rdzv_id=j"});
  INFO(e.err);
  CHECK(e.code == 1);
  CHECK(absl::StrContains(e.err,
                          endpoint + " did not answer as a ctrun rendezvous"));
  CHECK_FALSE(absl::StrContains(e.err, "Deadline Exceeded"));
  close(fd);
}

// A run folder in `tmp` as ctrun leaves it: with its agent's mark (pid,
// start time, where the pid means something: `scope`, this process's by
// default) made `age` ago, or without one (kept on purpose).
std::string LeftFolder(const std::string& tmp, const std::string& name,
                       std::optional<std::pair<pid_t, unsigned long long>> mark,
                       absl::Duration age,
                       const std::string& scope = PidScope()) {
  const std::string dir = tmp + "/" + name;
  std::filesystem::create_directories(dir + "/hang_round_0");
  std::ofstream(dir + "/hang_round_0/rank0.python.txt") << "a stack\n";
  if (mark) {
    std::filesystem::create_directories(dir + "/.ctrun");
    std::ofstream(dir + "/.ctrun/agent")
        << mark->first << " " << mark->second << " " << scope << "\n";
    std::filesystem::last_write_time(
        dir + "/.ctrun/agent",
        std::filesystem::file_time_type::clock::now() -
            std::chrono::seconds(absl::ToInt64Seconds(age)));
  }
  return dir;
}

TEST_CASE(
    "The next run removes folders of killed agents, and never evidence kept "
    "on purpose",
    "[hostile][integration]") {
  const std::string tmp = Scratch("stale");
  // A process that is gone: its pid and start time name nothing now.
  ChildProcess gone({"/bin/true"});
  REQUIRE(gone.Wait(kWait) == 0);
  const auto dead = std::make_pair(gone.pid(), 12345ULL);
  const auto alive = std::make_pair(getpid(), ProcessStartTime(getpid()));
  const std::string killed =
      LeftFolder(tmp, "ctrun-killed", dead, absl::Minutes(10));
  const std::string recent =
      LeftFolder(tmp, "ctrun-recent", dead, absl::Seconds(5));
  const std::string kept =
      LeftFolder(tmp, "ctrun-kept00", std::nullopt, absl::Hours(1));
  const std::string running =
      LeftFolder(tmp, "ctrun-runnin", alive, absl::Minutes(10));
  // Marks whose pids name processes elsewhere: another boot (another node
  // sharing this folder), another pid namespace (another container), an
  // older ctrun's that said neither. Fails before: all three went.
  const std::string scope = PidScope();
  const std::string pid_namespace = scope.substr(scope.find(' ') + 1);
  const std::string other_boot =
      LeftFolder(tmp, "ctrun-otherb", dead, absl::Minutes(10),
                 "00000000-0000-0000-0000-000000000000 " + pid_namespace);
  const std::string other_namespace =
      LeftFolder(tmp, "ctrun-otherp", dead, absl::Minutes(10),
                 scope.substr(0, scope.find(' ')) + " pid:[1]");
  const std::string unscoped =
      LeftFolder(tmp, "ctrun-unscop", dead, absl::Minutes(10), "");
  // A FIFO where the mark goes (a worker can write there): never read.
  const std::string fifo =
      LeftFolder(tmp, "ctrun-fifo00", std::nullopt, absl::Hours(1));
  std::filesystem::create_directories(fifo + "/.ctrun");
  REQUIRE(mkfifo((fifo + "/.ctrun/agent").c_str(), 0600) == 0);
  ChildProcess first(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "/bin/true"},
      {"TMPDIR=" + tmp});
  REQUIRE(first.Wait(kWait) == 0);
  INFO(first.Stderr());
  CHECK(absl::StrContains(first.Stderr(),
                          "ctrun: removed 1 run folder left by ctrun agents "
                          "killed before they could clean up (" +
                              killed + ")"));
  CHECK_FALSE(std::filesystem::exists(killed));
  CHECK(std::filesystem::exists(recent));  // maybe still being left
  CHECK(std::filesystem::exists(kept + "/hang_round_0/rank0.python.txt"));
  CHECK(std::filesystem::exists(running));
  CHECK(std::filesystem::exists(fifo));
  CHECK(std::filesystem::exists(other_boot));
  CHECK(std::filesystem::exists(other_namespace));
  CHECK(std::filesystem::exists(unscoped));
  ChildProcess second(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "/bin/true"},
      {"TMPDIR=" + tmp});
  REQUIRE(second.Wait(kWait) == 0);
  CHECK_FALSE(absl::StrContains(second.Stderr(), "removed"));
  // A run that ends normally leaves no mark behind in what it keeps.
  ChildProcess failing({CtrunPath(), "--standalone", "--nproc_per_node=1",
                        "/bin/sh", "-c", "echo boom >&2; exit 3"},
                       {"TMPDIR=" + tmp});
  REQUIRE(failing.Wait(kWait) == 3);
  int marked = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) {
    marked += std::filesystem::exists(e.path() / ".ctrun" / "agent");
  }
  // recent, running, the FIFO, the three of elsewhere; none of the runs
  CHECK(marked == 6);
  std::filesystem::remove_all(tmp);
}

// Fails before: the mark held a pid alone, which the other namespace read
// as its own (pid 1, its init) and judged dead.
TEST_CASE("A run folder of an agent in another pid namespace is never removed",
          "[hostile][integration]") {
  const std::string tmp = Scratch("pidns");
  // An agent in a pid namespace of its own (a container sharing /tmp).
  ChildProcess inside(
      {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
       CtrunPath(), "--standalone", "--nproc_per_node=1", "/bin/sh", "-c",
       "echo up; sleep 5"},
      {"TMPDIR=" + tmp});
  REQUIRE(inside.WaitForLine("up", kWait));
  std::string folder;
  for (const auto& e : std::filesystem::directory_iterator(tmp)) {
    if (absl::StartsWith(e.path().filename().string(), "ctrun-")) {
      folder = e.path();
    }
  }
  REQUIRE_FALSE(folder.empty());
  const std::string mark = folder + "/.ctrun/agent";
  REQUIRE(std::filesystem::exists(mark));
  std::ifstream in(mark);
  std::string line;
  std::getline(in, line);
  INFO(line);
  CHECK(absl::StartsWith(line, "1 "));  // the namespace's first process
  // As if it had run for a while without refreshing it.
  std::filesystem::last_write_time(
      mark,
      std::filesystem::file_time_type::clock::now() - std::chrono::minutes(10));
  ChildProcess outside(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "/bin/true"},
      {"TMPDIR=" + tmp});
  REQUIRE(outside.Wait(kWait) == 0);
  INFO(outside.Stderr());
  CHECK_FALSE(absl::StrContains(outside.Stderr(), "removed"));
  CHECK(std::filesystem::exists(mark));
  CHECK(inside.Wait(kWait) == 0);
  std::filesystem::remove_all(tmp);
}

TEST_CASE("A file-timer kill that is refused is not announced as done",
          "[hostile][integration]") {
  const Ended e =
      Run({CtrunPath(), "--standalone", "--nproc_per_node=1", "/bin/sh", "-c",
           "echo '{\"version\": 1, \"pid\": 1, \"scope_id\": \"s\", "
           "\"expiration_time\": 1.0, \"signal\": 9}' > "
           "\"$TORCHELASTIC_TIMER_FILE\"; sleep 1"},
          kWait, {"TORCHELASTIC_ENABLE_FILE_TIMER=1"});
  INFO(e.err);
  CHECK(e.code == 0);
  CHECK(absl::StrContains(e.err,
                          "torchrun file timer 's' of pid 1 expired; not "
                          "killing it: it is not one of this node's workers"));
  CHECK_FALSE(absl::StrContains(e.err, "killing it with"));
}

TEST_CASE("Metrics served beyond loopback are said so",
          "[hostile][integration]") {
  ChildProcess daemon({CtrundPath(), "--listen", "127.0.0.1:0",
                       "--metrics-listen", "0.0.0.0:0"});
  CHECK(daemon.StderrContains(
      "serves job and node names beyond this machine, without a token", kWait));
  daemon.Signal(SIGTERM);
  CHECK(daemon.Wait(kWait) == 0);
}

}  // namespace
}  // namespace ctrun::testing
