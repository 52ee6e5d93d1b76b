// The real ctrun binary with real worker processes (/bin/sh scripts) and
// real signals.
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/workers/proc.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/topology_xml.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// ctrun FLAGS... /bin/sh -c SCRIPT, with the prefix template fixed so that
// lines are easy to parse: "R<rank>| ".
std::unique_ptr<ChildProcess> Ctrun(std::vector<std::string> flags,
                                    const std::string& script,
                                    std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {CtrunPath(),
                                   "--log_line_prefix_template=R${rank}| "};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return std::make_unique<ChildProcess>(argv, env);
}

// The run folders ctrun made for `run_id` under `log_dir` (RUN_ID_XXXXXX).
std::vector<std::string> RunDirs(const std::string& log_dir,
                                 const std::string& run_id) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(log_dir, ec)) {
    const std::string name = e.path().filename();
    if (name.rfind(run_id + "_", 0) == 0 && name.size() == run_id.size() + 7) {
      dirs.push_back(e.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// Whether a process is gone (or a zombie nobody has reaped yet).
bool Gone(pid_t pid) {
  const std::string text =
      ReadProcFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = text.rfind(')');
  return paren == std::string::npos ||
         (text.size() > paren + 2 && text[paren + 2] == 'Z');
}

bool AllGoneWithin(const std::vector<pid_t>& pids, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (std::all_of(pids.begin(), pids.end(), Gone)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::vector<pid_t> PidsIn(const std::string& text, const std::string& tag) {
  std::vector<pid_t> pids;
  std::regex re(tag + "=([0-9]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end;
       ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

TEST_CASE("ctrun starts one worker per local rank with torchrun's variables",
          "[ctrun][integration]") {
  auto c =
      Ctrun({"--nproc_per_node=4", "--rdzv_id=job-a"},
            "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE "
            "lws=$LOCAL_WORLD_SIZE group=$GROUP_RANK gws=$GROUP_WORLD_SIZE "
            "addr=$MASTER_ADDR port=$MASTER_PORT run=$TORCHELASTIC_RUN_ID "
            "restart=$TORCHELASTIC_RESTART_COUNT "
            "store=$CTRUN_STORE_ENDPOINT omp=$OMP_NUM_THREADS\"");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  const auto lines = Lines(out);
  REQUIRE(lines.size() == 4);
  std::set<std::string> ports, ranks;
  for (const auto& line : lines) {
    std::smatch m;
    REQUIRE(std::regex_search(
        line, m,
        std::regex("^R([0-3])\\| rank=([0-3]) local=([0-3]) world=4 lws=4 "
                   "group=0 gws=1 addr=127.0.0.1 port=([0-9]+) run=job-a "
                   "restart=0 store=127.0.0.1:[0-9]+ omp=1$")));
    CHECK(m[1] == m[2]);
    CHECK(m[2] == m[3]);
    ranks.insert(m[2]);
    ports.insert(m[4]);
  }
  CHECK(ranks.size() == 4);
  CHECK(ports.size() == 1);
}

TEST_CASE("ctrun exits with the failed worker's own exit code",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=3"},
                 "if [ $RANK = 2 ]; then exit 7; fi; sleep 30");
  CHECK(c->Wait(kWait) == 7);
  const std::string err = c->Stderr();
  CHECK(err.find("Root Cause (first observed failure)") != std::string::npos);
  CHECK(err.find("rank       : 2 (local_rank: 2)") != std::string::npos);
  CHECK(err.find("exitcode   : 7") != std::string::npos);
}

TEST_CASE("A worker killed by a signal makes ctrun exit 128 plus the signal",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2"},
                 "if [ $RANK = 1 ]; then kill -SEGV $$; fi; sleep 30");
  CHECK(c->Wait(kWait) == 128 + SIGSEGV);
  CHECK(c->Stderr().find("SIGSEGV") != std::string::npos);
}

TEST_CASE("SIGTERM to ctrun reaches every worker and ctrun exits 143",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=3"},
                 "trap 'echo got-term; exit 0' TERM; echo ready; "
                 "while true; do sleep 0.05; done");
  for (int i = 0; i < 3; ++i) REQUIRE(c->WaitForLine("ready", kWait));
  c->Signal(SIGTERM);
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 128 + SIGTERM);
  for (int r = 0; r < 3; ++r) {
    CHECK(out.find(absl::StrCat("R", r, "| got-term")) != std::string::npos);
  }
}

TEST_CASE("Workers that ignore SIGTERM are killed after the shutdown timeout",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2", "--shutdown_timeout=0.5"},
                 "trap '' TERM; echo pid=$$; while true; do sleep 0.05; done");
  std::string seen;
  for (int i = 0; i < 2; ++i) {
    auto line = c->WaitForLine("pid=", kWait);
    REQUIRE(line);
    seen += *line;
  }
  c->Signal(SIGTERM);
  CHECK(c->Wait(kWait) == 128 + SIGTERM);
  CHECK(c->Stderr().find("sending SIGKILL") != std::string::npos);
  CHECK(AllGoneWithin(PidsIn(seen, "pid"), absl::Seconds(5)));
}

TEST_CASE("kill -9 of ctrun leaves no worker or grandchild running",
          "[ctrun][integration]") {
  char tmp_template[] = "/tmp/ctrun-kill9-XXXXXX";
  const std::string tmp = mkdtemp(tmp_template);
  auto c =
      Ctrun({"--nproc_per_node=2"}, "sleep 300 & echo child=$! worker=$$; wait",
            {"TMPDIR=" + tmp});
  std::string seen;
  for (int i = 0; i < 2; ++i) {
    auto line = c->WaitForLine("child=", kWait);
    REQUIRE(line);
    seen += *line + "\n";
  }
  auto workers = PidsIn(seen, "worker");
  auto children = PidsIn(seen, "child");
  REQUIRE(workers.size() == 2);
  REQUIRE(children.size() == 2);
  c->Signal(SIGKILL);
  CHECK(c->Wait(kWait) == 128 + SIGKILL);
  CHECK(AllGoneWithin(workers, absl::Seconds(5)));
  CHECK(AllGoneWithin(children, absl::Seconds(5)));
  // Nor its empty run directory: the watchdog removes it.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!std::filesystem::is_empty(tmp) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(std::filesystem::is_empty(tmp));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("Grandchildren that leave their worker's group end with the job",
          "[ctrun][integration]") {
  // setsid puts the grandchild beyond its worker's process group; when the
  // worker exits it is orphaned to ctrun, a child subreaper.
  auto c = Ctrun({"--nproc_per_node=1"},
                 "setsid sleep 300 & echo escaped=$!; sleep 0.2");
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 0);
  auto escaped = PidsIn(out, "escaped");
  REQUIRE(escaped.size() == 1);
  CHECK(AllGoneWithin(escaped, absl::Seconds(5)));
}

TEST_CASE(
    "Descendants two levels beyond their worker's session end with the job, "
    "though ctrun looks at no other process on the machine",
    "[ctrun][integration]") {
  // A daemon (setsid) with a child of its own, left behind by its worker:
  // the daemon comes to ctrun (a subreaper), and its child once it is
  // ended. Neither the agent nor its watchdog reads another process's
  // /proc entries to find them (strace: every /proc/N/ opened is of a task
  // of ctrun's own).
  REQUIRE(std::filesystem::exists("/usr/bin/strace"));
  const std::string trace = std::filesystem::temp_directory_path() /
                            absl::StrCat("ctrun-strace-", getpid());
  // LeakSanitizer does not run under ptrace: a sanitized ctrun would end
  // with its refusal.
  const char* asan = getenv("ASAN_OPTIONS");
  ChildProcess c({"/usr/bin/strace", "-f", "-qq", "-e", "trace=openat", "-o",
                  trace, CtrunPath(), "--nproc_per_node=1", "/bin/sh", "-c",
                  "setsid sh -c 'sleep 300 & echo deep=$!; wait' & sleep 0.3"},
                 {absl::StrCat("ASAN_OPTIONS=", asan ? asan : "",
                               asan ? ":" : "", "detect_leaks=0")});
  const std::string out = c.ReadAll(kWait);
  INFO(c.Stderr());
  CHECK(c.Wait(kWait) == 0);
  const auto deep = PidsIn(out, "deep");
  REQUIRE(deep.size() == 1);
  CHECK(AllGoneWithin(deep, absl::Seconds(5)));
  std::ifstream in(trace);
  std::set<std::string> tasks, opened;
  static const std::regex proc_entry("\"/proc/([0-9]+)/");
  for (std::string line; std::getline(in, line);) {
    tasks.insert(line.substr(0, line.find(' ')));
    std::smatch m;
    if (std::regex_search(line, m, proc_entry)) opened.insert(m[1]);
  }
  std::filesystem::remove(trace);
  REQUIRE_FALSE(tasks.empty());
  for (const std::string& pid : opened) {
    INFO("/proc/" << pid << "/ opened");
    CHECK(tasks.count(pid) == 1);
  }
}

TEST_CASE("Descendants that left the session end when ctrun is killed",
          "[ctrun][integration]") {
  // setsid takes the grandchild out of its worker's session and process
  // group; when ctrun dies it is orphaned to init, beyond every group kill.
  auto c =
      Ctrun({"--nproc_per_node=1"}, "setsid sleep 300 & echo escaped=$!; wait");
  auto line = c->WaitForLine("escaped=", kWait);
  REQUIRE(line);
  const auto escaped = PidsIn(*line, "escaped");
  REQUIRE(escaped.size() == 1);
  c->Signal(SIGKILL);
  CHECK(c->Wait(kWait) == 128 + SIGKILL);
  const bool gone = AllGoneWithin(escaped, absl::Seconds(5));
  // What the survivor and ctrun's watchdog were doing, should it fail.
  std::string seen;
  for (const ProcessInfo& p : AllProcesses()) {
    if (p.pid == escaped[0] || p.command == "ctrun-watchdog") {
      seen += absl::StrCat(p.pid, " ", p.command, " ", std::string(1, p.state),
                           " group ", p.group, "; ");
    }
  }
  if (!gone) kill(escaped[0], SIGKILL);  // leave nothing behind either way
  INFO("left: " << seen << "stderr: " << c->Stderr());
  CHECK(gone);
}

TEST_CASE("Workers get a token for their job, never the service's",
          "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-token-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "service-secret\n";
  const std::string script =
      "echo \"token=$CTRUN_STORE_TOKEN rdzv=${CTRUN_RDZV_TOKEN:-none}\"";
  auto from_file =
      Ctrun({"--rdzv_id=tok", "--rdzv_conf=token_file=" + token_file}, script);
  auto from_env =
      Ctrun({"--rdzv_id=tok"}, script, {"CTRUN_RDZV_TOKEN=env-secret"});
  for (auto* c : {from_file.get(), from_env.get()}) {
    const std::string out = c->ReadAll(kWait);
    INFO(out << c->Stderr());
    CHECK(c->Wait(kWait) == 0);
    CHECK(std::regex_search(
        out, std::regex("^R0\\| token=job\\.tok\\.[0-9a-f]{64} rdzv=none\n$")));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("A run without --log_dir leaves no run directory behind",
          "[ctrun][integration]") {
  const std::string tmp = std::filesystem::temp_directory_path() /
                          ("ctrun-rundirs-" + std::to_string(getpid()));
  std::filesystem::create_directories(tmp);
  auto count = [&] {
    return std::distance(std::filesystem::directory_iterator(tmp),
                         std::filesystem::directory_iterator());
  };
  for (const std::string script : {"exit 0", "exit 3"}) {
    auto c = Ctrun({"--nproc_per_node=2"}, script, {"TMPDIR=" + tmp});
    c->Wait(kWait);
    CHECK(count() == 0);
  }
  // An error file is what the failure summary points at: kept, and said.
  auto c = Ctrun({"--nproc_per_node=1"},
                 "echo '{\"message\": \"boom\"}' > $TORCHELASTIC_ERROR_FILE; "
                 "exit 3",
                 {"TMPDIR=" + tmp});
  CHECK(c->Wait(kWait) == 3);
  CHECK(count() == 1);
  CHECK(c->Stderr().find("error files and logs are kept in " + tmp +
                         "/ctrun-") != std::string::npos);
  std::filesystem::remove_all(tmp);
}

TEST_CASE(
    "A worker printing without pause to a console nobody reads delays "
    "no signal",
    "[ctrun][integration]") {
  // Nothing reads ctrun's stdout: the pipe fills, and a console write
  // would block the loop that takes signals.
  auto c = Ctrun({"--nproc_per_node=1"}, "exec yes");
  absl::SleepFor(absl::Seconds(1));
  c->Signal(SIGTERM);
  CHECK(c->Wait(absl::Seconds(10)) == 128 + SIGTERM);
  CHECK(c->Stderr().find("received SIGTERM") != std::string::npos);
}

TEST_CASE(
    "Lines a slow console could not take are counted, and kept in the "
    "log",
    "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-drops-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string printed = dir + "/printed";
  constexpr int kLines = 600000;  // ~5 MB, more than the console holds
  auto c = Ctrun(
      {"--nproc_per_node=1", "--log_dir=" + dir, "--tee=1", "--rdzv_id=drops"},
      absl::StrCat("seq 1 ", kLines, "; touch ", printed, "; sleep 2"));
  // Read nothing until every line was printed (and so read by ctrun, but
  // for the worker's pipe buffer).
  const absl::Time deadline = absl::Now() + kWait;
  while (!std::filesystem::exists(printed) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  std::smatch m;
  REQUIRE(std::regex_search(
      out, m,
      std::regex("ctrun: ([0-9]+) lines of worker output were dropped: the "
                 "console did not keep up")));
  const int dropped = std::stoi(m[1]);
  int shown = 0, last = 0;
  bool ordered = true;
  for (const auto& line : Lines(out)) {
    if (line.rfind("R0| ", 0) != 0) continue;
    const int n = std::stoi(line.substr(4));
    ordered &= n > last;
    last = n;
    ++shown;
  }
  CHECK(ordered);
  CHECK(dropped > 0);
  CHECK(shown + dropped == kLines);
  // The log file never drops.
  const auto runs = RunDirs(dir, "drops");
  REQUIRE(runs.size() == 1);
  std::ifstream log(runs[0] + "/attempt_0/0/stdout.log");
  int logged = 0;
  for (std::string line; std::getline(log, line);) ++logged;
  CHECK(logged == kLines);
  std::filesystem::remove_all(dir);
}

TEST_CASE("A second run under the same id is refused at once",
          "[ctrun][integration]") {
  // The single-node c10d form of PyTorch's docs, started twice.
  auto port = BindFreePort("127.0.0.1");
  REQUIRE(port.ok());
  const std::vector<std::string> flags = {
      "--nnodes=1", "--rdzv_backend=c10d",
      absl::StrCat("--rdzv_endpoint=127.0.0.1:", *port), "--rdzv_id=100"};
  auto first = Ctrun(flags, "echo first-ran; sleep 30");
  REQUIRE(first->WaitForLine("first-ran", kWait));
  auto second = Ctrun(flags, "echo second-ran");
  CHECK(second->Wait(absl::Seconds(10)) == 1);
  CHECK(second->StderrContains(
      "refused this node: job '100' is full: its 1 node runs (--nnodes=1)",
      absl::ZeroDuration()));
  CHECK(second->ReadAll(absl::ZeroDuration()).find("second-ran") ==
        std::string::npos);
  first->Signal(SIGTERM);
  CHECK(first->Wait(kWait) == 128 + SIGTERM);
}

TEST_CASE("A static node 0 whose rendezvous port is taken names it",
          "[ctrun][integration]") {
  // Hold a port the OS picks, and make it --master_port+1: held by this
  // test for sure (a port merely seen taken could be freed meanwhile).
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 1) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int taken = ntohs(addr.sin_port);
  ChildProcess node0({CtrunPath(), "--nnodes=2", "--node_rank=0",
                      "--master_addr=127.0.0.1",
                      absl::StrCat("--master_port=", taken - 1), "/bin/true"});
  CHECK(node0.Wait(kWait) == 1);
  CHECK(node0.Stderr().find(absl::StrCat(
            "ctrun: cannot host the rendezvous (node rank 0 of a static "
            "rendezvous, on --master_port+1 = ",
            taken, "): cannot listen on 127.0.0.1:", taken)) !=
        std::string::npos);
  close(fd);
}

TEST_CASE("max_restarts restarts all workers with the restart count raised",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2", "--max_restarts=3"},
                 "echo restart=$TORCHELASTIC_RESTART_COUNT "
                 "max=$TORCHELASTIC_MAX_RESTARTS; "
                 "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; "
                 "then exit 1; fi; sleep 0.2");
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 0);
  CHECK(out.find("R1| restart=0 max=3") != std::string::npos);
  CHECK(out.find("R1| restart=1 max=3") != std::string::npos);
  CHECK(out.find("R0| restart=2 max=3") != std::string::npos);
  CHECK(out.find("R1| restart=2 max=3") != std::string::npos);
  CHECK(out.find("restart=3") == std::string::npos);
  CHECK(c->Stderr().find("restarting the workers") != std::string::npos);
}

TEST_CASE("A restart keeps the job's MASTER_PORT while it is free",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2", "--max_restarts=2"},
                 "echo port=$MASTER_PORT; "
                 "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; "
                 "then exit 1; fi");
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 0);
  std::regex port_line("R1\\| port=([0-9]+)");
  std::set<std::string> ports;
  int attempts = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), port_line);
       it != std::sregex_iterator(); ++it) {
    ports.insert((*it)[1].str());
    ++attempts;
  }
  INFO(out);
  CHECK(attempts == 3);
  CHECK(ports.size() == 1);
}

TEST_CASE("When the restart budget is spent the job fails",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2", "--max_restarts=1"},
                 "echo restart=$TORCHELASTIC_RESTART_COUNT; "
                 "if [ $RANK = 0 ]; then exit 4; fi; sleep 30");
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 4);
  CHECK(out.find("restart=1") != std::string::npos);
  CHECK(out.find("restart=2") == std::string::npos);
}

TEST_CASE(
    "An ImportError is not restarted: one line names the class and the "
    "error, and the job ends on its first attempt",
    "[ctrun][integration]") {
  // Rank 1 cannot import a module; rank 0 would run on.
  const std::string script =
      "echo attempt=$TORCHELASTIC_RESTART_COUNT; "
      "if [ $RANK = 1 ]; then exec /usr/bin/python3 -c "
      "'import ctrun_test_no_such_module'; fi; sleep 30";
  auto c = Ctrun({"--nproc_per_node=2", "--max_restarts=3"}, script);
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 1);
  const std::string err = c->Stderr();
  INFO(out << err);
  CHECK(out.find("attempt=1") == std::string::npos);
  CHECK(err.find("restarting the workers") == std::string::npos);
  CHECK(err.find("ctrun: worker rank 1 (local 1, pid ") != std::string::npos);
  CHECK(err.find(") exited with code 1: user_error (ModuleNotFoundError: No "
                 "module named 'ctrun_test_no_such_module'); stopping the "
                 "others") != std::string::npos);
  CHECK(err.find("ctrun: rank 1's failure is a user error "
                 "(ModuleNotFoundError: No module named "
                 "'ctrun_test_no_such_module'), which a restart cannot "
                 "mend: not restarted, 3 of --max_restarts=3 left") !=
        std::string::npos);
  CHECK(err.find("  class      : user_error (ModuleNotFoundError") !=
        std::string::npos);

  // Asked to, ctrun restarts for it until the budget is spent.
  auto all = Ctrun(
      {"--nproc_per_node=2", "--max_restarts=2", "--restart_on=all"}, script);
  const std::string all_out = all->ReadAll(kWait);
  CHECK(all->Wait(kWait) == 1);
  INFO(all_out << all->Stderr());
  CHECK(all_out.find("R1| attempt=2") != std::string::npos);
  CHECK(all->Stderr().find("which a restart cannot mend") == std::string::npos);
}

// A memory cgroup of its own for the test's length (v2, or v1's memory
// hierarchy) limited to `bytes` without swap; empty path where this
// machine does not let the test make one.
struct MemoryCgroup {
  explicit MemoryCgroup(uint64_t bytes) {
    const std::string name = absl::StrCat("ctrun-test-", getpid());
    for (const auto& [root, limit, swap] :
         {std::tuple<std::string, std::string, std::string>{
              "/sys/fs/cgroup", "memory.max", "memory.swap.max"},
          {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", ""}}) {
      const std::string dir = root + "/" + name;
      if (!std::filesystem::exists(root + "/" + limit) &&
          !std::filesystem::exists(root + "/cgroup.controllers")) {
        continue;
      }
      if (mkdir(dir.c_str(), 0755) != 0) continue;
      std::ofstream(dir + "/" + limit) << bytes;
      if (!swap.empty()) std::ofstream(dir + "/" + swap) << 0;
      std::ifstream read_back(dir + "/" + limit);
      uint64_t set = 0;
      if (read_back >> set && set <= bytes) {
        path = dir;
        return;
      }
      rmdir(dir.c_str());
    }
  }
  ~MemoryCgroup() {
    // Its processes are gone once the test ended them; retry briefly for
    // the kernel to let go.
    for (int i = 0; !path.empty() && i < 50 && rmdir(path.c_str()) != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  std::string path;
};

TEST_CASE(
    "A worker the kernel's OOM killer ends is out of memory, not a signal "
    "from outside",
    "[ctrun][integration]") {
  MemoryCgroup cgroup(256 << 20);
  if (cgroup.path.empty()) {
    WARN(
        "no memory cgroup can be made here (not root, or no memory "
        "controller): the OOM kill is not checked");
    return;
  }
  // ctrun joins the cgroup before it starts, so its workers are in it; the
  // worker writes 1 GiB.
  const std::string run = absl::StrCat(
      "echo $$ > ", cgroup.path, "/cgroup.procs && exec ", CtrunPath(),
      " --nproc_per_node=1 --max_restarts=0 /usr/bin/python3 -c "
      "'x = b\"m\" * (1 << 30)'");
  ChildProcess c({"/bin/sh", "-c", run});
  c.ReadAll(kWait);
  CHECK(c.Wait(kWait) == 128 + SIGKILL);
  const std::string err = c.Stderr();
  INFO(err);
  CHECK(err.find("was killed by SIGKILL: oom (killed by the kernel's OOM "
                 "killer); stopping the others") != std::string::npos);
  CHECK(err.find("  class      : oom") != std::string::npos);
}

TEST_CASE(
    "Attempts that fail in a row without progress stop the job with exit "
    "code 78, restarts left",
    "[ctrun][integration]") {
  // No progress signals: each attempt fails long before 30 s.
  auto c = Ctrun(
      {"--nproc_per_node=2", "--max_restarts=10", "--min_progress_seconds=30"},
      "echo attempt=$TORCHELASTIC_RESTART_COUNT; "
      "if [ $RANK = 1 ]; then exit 3; fi; sleep 30");
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 78);
  const std::string err = c->Stderr();
  INFO(out << err);
  CHECK(out.find("R1| attempt=2") != std::string::npos);
  CHECK(out.find("attempt=3") == std::string::npos);
  CHECK(err.find("ctrun: the job's last attempts made no progress: exiting "
                 "78, which says not to requeue it (the root cause's own "
                 "code was 3)") != std::string::npos);
}

// tests/support/stop_stepper.py under /bin/sh: ranks stepping at their own
// pace until ctrun.should_stop(); rank 1 never checks unless `rank1_checks`.
std::string StopScript(bool rank1_checks = true) {
  return absl::StrCat("exec /usr/bin/python3 ", SourceDir(),
                      "/tests/support/stop_stepper.py",
                      rank1_checks ? "" : " --unchecked_rank=1");
}

// The workers' pids from their "ready PID" lines, once all `n` said it.
std::vector<pid_t> WaitReady(ChildProcess& c, int n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    auto line = c.WaitForLine("| ready ", kWait);
    if (!line) break;
    pids.push_back(std::atoi(line->substr(line->rfind(' ') + 1).c_str()));
  }
  return pids;
}

// The steps the ranks said they stopped at, by rank ("R<rank>| stop
// rank=R step=N why=...").
std::map<int, int> StopSteps(const std::string& out) {
  std::map<int, int> steps;
  static const std::regex kLine(
      "R([0-9]+)\\| stop rank=[0-9]+ step=([0-9]+) why=");
  for (const std::string& line : Lines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, kLine)) {
      steps[std::stoi(m[1])] = std::stoi(m[2]);
    }
  }
  return steps;
}

TEST_CASE(
    "A preemption signal stops 4 ranks stepping at different speeds at one "
    "step, 50 runs of 50, and each exits 0",
    "[ctrun][integration]") {
  const std::string script = StopScript();
  // Ten jobs at a time: five batches.
  for (int batch = 0; batch < 5; ++batch) {
    std::vector<std::unique_ptr<ChildProcess>> jobs;
    for (int j = 0; j < 10; ++j) {
      jobs.push_back(Ctrun({"--nproc_per_node=4"}, script));
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
      REQUIRE(WaitReady(*jobs[j], 4).size() == 4);
      jobs[j]->Signal(j % 2 == 0 ? SIGTERM : SIGUSR1);
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
      const std::string out = jobs[j]->ReadAll(kWait);
      INFO("batch " << batch << " job " << j << "\n"
                    << out << jobs[j]->Stderr());
      CHECK(jobs[j]->Wait(kWait) == 0);
      const std::map<int, int> steps = StopSteps(out);
      REQUIRE(steps.size() == 4);
      for (const auto& [rank, step] : steps) CHECK(step == steps.at(0));
      const std::string signal = j % 2 == 0 ? "SIGTERM" : "SIGUSR1";
      CHECK(absl::StrContains(out, "why=" + signal + " to ctrun on "));
      CHECK(absl::StrContains(
          jobs[j]->Stderr(),
          absl::StrCat("ctrun: the job stops at step ", steps.at(0), " (",
                       signal, " to ctrun on ")));
    }
  }
}

TEST_CASE(
    "Preemption signals delivered to the workers themselves wait for the "
    "stop, and one the agent never gets acts after a second",
    "[ctrun][integration]") {
  const std::string script = StopScript();
  SECTION("with the agent's: a Slurm step's scancel --signal=TERM") {
    auto c = Ctrun({"--nproc_per_node=4"}, script);
    const std::vector<pid_t> pids = WaitReady(*c, 4);
    REQUIRE(pids.size() == 4);
    for (pid_t pid : pids) kill(pid, SIGTERM);
    c->Signal(SIGTERM);
    const std::string out = c->ReadAll(kWait);
    INFO(out << c->Stderr());
    CHECK(c->Wait(kWait) == 0);
    const std::map<int, int> steps = StopSteps(out);
    REQUIRE(steps.size() == 4);
    for (const auto& [rank, step] : steps) CHECK(step == steps.at(0));
  }
  SECTION("a worker's alone") {
    auto c = Ctrun({"--nproc_per_node=2"}, script);
    const std::vector<pid_t> pids = WaitReady(*c, 2);
    REQUIRE(pids.size() == 2);
    const absl::Time sent = absl::Now();
    kill(pids[1], SIGTERM);
    const std::string out = c->ReadAll(kWait);
    INFO(out << c->Stderr());
    CHECK(absl::Now() - sent >= absl::Seconds(1));
    CHECK(c->Wait(kWait) == 143);  // the job fails as it did before
    CHECK(absl::StrContains(c->Stderr(), "SIGTERM"));
    CHECK(StopSteps(out).empty());
  }
}

TEST_CASE(
    "A coordinated stop that a rank never checks falls back to the signal "
    "after --preemption_grace",
    "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2", "--preemption_grace=2"},
                 StopScript(/*rank1_checks=*/false));
  REQUIRE(WaitReady(*c, 2).size() == 2);
  c->Signal(SIGTERM);
  const std::string out = c->ReadAll(kWait);
  const std::string err = c->Stderr();
  INFO(out << err);
  CHECK(c->Wait(kWait) == 143);
  // Rank 0 stopped when the rendezvous decided without rank 1 (its hold
  // window: half the grace); rank 1 had the signal at the grace.
  const std::map<int, int> steps = StopSteps(out);
  CHECK(steps.size() == 1);
  CHECK(steps.count(0) == 1);
  CHECK(absl::StrContains(err,
                          "ctrun: the job did not stop within "
                          "--preemption_grace=2s: SIGTERM acts as "
                          "without it"));
}

TEST_CASE("SIGUSR1 is forwarded to the workers, which keep running",
          "[ctrun][integration]") {
  auto c = Ctrun({"--nproc_per_node=2"},
                 "trap 'echo got-usr1; exit 0' USR1; echo ready; "
                 "while true; do sleep 0.05; done");
  for (int i = 0; i < 2; ++i) REQUIRE(c->WaitForLine("ready", kWait));
  c->Signal(SIGUSR1);
  const std::string out = c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 0);  // the workers chose to exit 0
  CHECK(out.find("R0| got-usr1") != std::string::npos);
  CHECK(out.find("R1| got-usr1") != std::string::npos);
}

TEST_CASE("Bad command lines exit 2 with one line and start nothing",
          "[ctrun][integration]") {
  const std::string marker = std::filesystem::temp_directory_path() /
                             ("ctrun-never-" + std::to_string(getpid()));
  for (const auto& flags : std::vector<std::vector<std::string>>{
           {"--nnodes=3:2"},
           {"--nproc_per_node=-1"},
           {"--rdzv_conf=k"},
           {"--bogus"},
       }) {
    std::vector<std::string> argv = {CtrunPath()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"/bin/sh", "-c", "touch " + marker});
    ChildProcess p(argv);
    INFO(flags[0]);
    CHECK(p.Wait(kWait) == 2);
    const std::string err = p.Stderr();
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(err.find(flags[0].substr(0, flags[0].find('='))) !=
          std::string::npos);
  }
  const std::string not_executable = marker + ".txt";
  std::ofstream(not_executable) << "data\n";
  std::filesystem::permissions(
      not_executable,
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {CtrunPath(), "--nproc_per_node=2"},
           {CtrunPath(), "no-such-program-anywhere"},
           {CtrunPath(), not_executable},
           {CtrunPath(), "/nonexistent/train.py"},
       }) {
    ChildProcess p(argv);
    INFO(argv.back());
    CHECK(p.Wait(kWait) == 2);
    const std::string err = p.Stderr();
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(err.rfind("ctrun: ", 0) == 0);
  }
  std::filesystem::remove(not_executable);
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("dry_run prints the plan with sources and starts nothing",
          "[ctrun][integration]") {
  const std::string marker = std::filesystem::temp_directory_path() /
                             ("ctrun-dry-" + std::to_string(getpid()));
  ChildProcess p({CtrunPath(), "--dry_run", "--nproc_per_node=3", "/bin/sh",
                  "-c", "touch " + marker},
                 {"PET_MAX_RESTARTS=2"});
  const std::string out = p.ReadAll(kWait);
  CHECK(p.Wait(kWait) == 0);
  CHECK(out.find("nothing started") != std::string::npos);
  CHECK(std::regex_search(out, std::regex("nproc_per_node +3 +flag")));
  CHECK(std::regex_search(out, std::regex("max_restarts +2 +PET_\\* env")));
  CHECK(std::regex_search(out, std::regex("role +default +default")));
  CHECK(out.find("workers: 3 x /bin/sh -c touch") != std::string::npos);
  CHECK(out.find("rendezvous: host it here on a free loopback port (a "
                 "single node)") != std::string::npos);
  CHECK(out.find("authentication: a token made up for this run") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE("dry_run of a multi-node job says whether this node hosts",
          "[ctrun][integration]") {
  auto plan = [](const std::string& local_addr) {
    ChildProcess p(
        {CtrunPath(), "--dry_run", "--nnodes=2", "--rdzv_backend=c10d",
         "--rdzv_endpoint=127.0.0.2:29999", "--local_addr=" + local_addr,
         "--rdzv_conf=token_file=/etc/ctrun.token", "/bin/true"},
        {"CTRUN_RDZV_TOKEN="});
    const std::string out = p.ReadAll(kWait);
    CHECK(p.Wait(kWait) == 0);
    return out;
  };
  const std::string host = plan("127.0.0.2");
  CHECK(host.find("rendezvous: host it here at 127.0.0.2:29999 (the "
                  "endpoint is this node's --local_addr 127.0.0.2); this node "
                  "advertises 127.0.0.2") != std::string::npos);
  CHECK(host.find("authentication: the token in /etc/ctrun.token "
                  "(--rdzv_conf token_file); workers get a token for this "
                  "job only; no TLS") != std::string::npos);
  const std::string join = plan("127.0.0.3");
  CHECK(join.find("rendezvous: connect to it at 127.0.0.2:29999") !=
        std::string::npos);
}

TEST_CASE("tee and redirects keep per-rank logs and the filter picks ranks",
          "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-logs-" + std::to_string(getpid()));
  auto c = Ctrun({"--nproc_per_node=2", "--rdzv_id=logged", "--log_dir", dir,
                  "--tee=1", "--redirects=0:2", "--local_ranks_filter=1"},
                 "echo out-$RANK; echo err-$RANK >&2");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  const auto runs = RunDirs(dir, "logged");
  REQUIRE(runs.size() == 1);
  CHECK(c->Stderr().find("ctrun: this run's logs go to " + runs[0] + "\n") !=
        std::string::npos);
  const std::string base = runs[0] + "/attempt_0/";
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  CHECK(slurp(base + "0/stdout.log") == "out-0\n");
  CHECK(slurp(base + "0/stderr.log") == "err-0\n");
  CHECK(slurp(base + "1/stdout.log") == "out-1\n");
  CHECK_FALSE(std::filesystem::exists(base + "1/stderr.log"));
  // Only local rank 1 reaches the console.
  CHECK(out == "R1| out-1\n");
  CHECK(c->Stderr().find("R1| err-1") != std::string::npos);
  CHECK(c->Stderr().find("err-0") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Workers get EPIPE once the console's reader is gone, as in torchrun",
          "[ctrun][integration]") {
  // `ctrun ... | head -2`: workers that print forever end with the reader,
  // instead of running on with their output thrown away.
  ChildProcess pipeline(
      {"/bin/sh", "-c",
       absl::StrCat(CtrunPath(),
                    " --nproc_per_node=2 /bin/sh -c 'i=0; while :; do echo "
                    "line $i; i=$((i+1)); sleep 0.01; done' | head -2; echo "
                    "pipeline-done")});
  const std::string out = pipeline.ReadAll(kWait);
  REQUIRE(pipeline.Wait(kWait) == 0);
  CHECK(out.find("pipeline-done") != std::string::npos);
  CHECK(pipeline.Stderr().find("was killed by SIGPIPE") != std::string::npos);
}

TEST_CASE("A file limit too low for the workers is raised or named",
          "[ctrun][integration]") {
  auto run = [](int workers) {
    ChildProcess c({"/bin/sh", "-c",
                    absl::StrCat("ulimit -Sn 100; ulimit -Hn 300; exec ",
                                 CtrunPath(), " --nproc_per_node=", workers,
                                 " /bin/sh -c 'ulimit -n'")});
    const std::string out = c.ReadAll(kWait);
    return std::tuple{c.Wait(kWait), out, c.Stderr()};
  };
  // 10 workers fit once the soft limit is raised within the hard one.
  auto [code, out, err] = run(10);
  CHECK(code == 0);
  CHECK(out.find(":0]: 296\n") != std::string::npos);
  // 200 do not: refused before anything starts, saying why.
  auto [refused, none, why] = run(200);
  CHECK(refused == 2);
  CHECK(none.empty());
  CHECK(why ==
        "ctrun: --nproc_per_node=200 needs about 1056 open files, but ulimit "
        "-n allows 100 (at most 300 without privileges); raise the limit or "
        "run fewer workers per node\n");
}

TEST_CASE("A prompt without a newline shows while the worker waits",
          "[ctrun][integration]") {
  const std::string out = std::filesystem::temp_directory_path() /
                          ("ctrun-prompt-" + std::to_string(getpid()));
  ChildProcess c({"/bin/sh", "-c",
                  absl::StrCat(CtrunPath(),
                               " /bin/sh -c 'printf \"Continue? \"; sleep 3; "
                               "echo yes' > ",
                               out)});
  auto slurp = [&out] {
    std::ifstream in(out);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (slurp().find("Continue? ") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(absl::StrContains(slurp(), "]: Continue? "));
  CHECK_FALSE(absl::StrContains(slurp(), "yes"));
  REQUIRE(c.Wait(kWait) == 0);
  CHECK(absl::EndsWith(slurp(), "]: Continue? yes\n"));
  std::filesystem::remove(out);
}

TEST_CASE("Duplicate filters gather matching lines of every rank in a file",
          "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-filters-" + std::to_string(getpid()));
  auto c = Ctrun({"--nproc_per_node=2", "--rdzv_id=filtered", "--log_dir", dir,
                  "--duplicate-stdout-filters=loss,acc",
                  "--duplicate-stderr-filters=WARN"},
                 "echo step $RANK; echo loss $RANK; echo acc $RANK; "
                 "echo WARN $RANK >&2; echo quiet >&2");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  // The console is as without filters.
  CHECK(absl::StrContains(out, "R0| step 0\n"));
  const auto runs = RunDirs(dir, "filtered");
  REQUIRE(runs.size() == 1);
  auto lines = [](const std::string& path) {
    std::ifstream in(path);
    std::multiset<std::string> all;
    for (std::string line; std::getline(in, line);) all.insert(line);
    return all;
  };
  CHECK(lines(runs[0] + "/attempt_0/filtered_stdout.log") ==
        std::multiset<std::string>{"R0| loss 0", "R0| acc 0", "R1| loss 1",
                                   "R1| acc 1"});
  CHECK(lines(runs[0] + "/attempt_0/filtered_stderr.log") ==
        std::multiset<std::string>{"R0| WARN 0", "R1| WARN 1"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("worker_tty=yes: a terminal for each stream, logs kept verbatim",
          "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-worker-tty-" + std::to_string(getpid()));
  auto c =
      Ctrun({"--rdzv_id=tty", "--log_dir", dir, "-t", "3", "--worker_tty=yes"},
            "[ -t 1 ] && echo out=tty; [ -t 2 ] && echo err=tty >&2; "
            "printf 'a\\nb\\n'");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  CHECK(out == "R0| out=tty\nR0| a\nR0| b\n");
  CHECK(c->Stderr().find("R0| err=tty\n") != std::string::npos);
  const auto runs = RunDirs(dir, "tty");
  REQUIRE(runs.size() == 1);
  std::ifstream log(runs[0] + "/attempt_0/0/stdout.log");
  const std::string logged((std::istreambuf_iterator<char>(log)),
                           std::istreambuf_iterator<char>());
  CHECK(logged == "out=tty\na\nb\n");  // raw: no "\r\n"
  std::filesystem::remove_all(dir);
}

TEST_CASE("worker_tty takes auto, yes or no", "[ctrun][integration]") {
  ChildProcess c({CtrunPath(), "--worker_tty=maybe", "/bin/true"});
  CHECK(c.Wait(kWait) == 2);
  CHECK(absl::StrContains(c.Stderr(), "--worker_tty"));
  CHECK(absl::StrContains(c.Stderr(), "expected auto, yes or no"));
}

TEST_CASE("tee wins over redirects, as in torchrun", "[ctrun][integration]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-tee-wins-" + std::to_string(getpid()));
  auto c = Ctrun({"--rdzv_id=both", "--log_dir", dir, "-t", "3", "-r", "3"},
                 "echo shown-and-kept");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  CHECK(out == "R0| shown-and-kept\n");
  const auto runs = RunDirs(dir, "both");
  REQUIRE(runs.size() == 1);
  std::ifstream log(runs[0] + "/attempt_0/0/stdout.log");
  std::string line;
  CHECK(std::getline(log, line));
  CHECK(line == "shown-and-kept");
  std::filesystem::remove_all(dir);
}

TEST_CASE("Runs sharing a log dir and an id never overwrite each other",
          "[ctrun][integration]") {
  // Two nodes writing to one --log_dir on NFS, or one id run twice.
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-shared-logs-" + std::to_string(getpid()));
  for (const char* which : {"first", "second"}) {
    auto c = Ctrun({"--rdzv_id=same", "--log_dir", dir, "--redirects=1"},
                   absl::StrCat("echo ", which));
    REQUIRE(c->Wait(kWait) == 0);
  }
  const auto runs = RunDirs(dir, "same");
  REQUIRE(runs.size() == 2);
  std::set<std::string> logged;
  for (const auto& run : runs) {
    std::ifstream in(run + "/attempt_0/0/stdout.log");
    std::string line;
    std::getline(in, line);
    logged.insert(line);
  }
  CHECK(logged == std::set<std::string>{"first", "second"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("Lines from different workers never interleave mid-line",
          "[ctrun][integration]") {
  // Each worker writes 2000 lines of 200 bytes in chunks that split lines.
  auto c = Ctrun({"--nproc_per_node=4"},
                 "line=$(printf 'x%.0s' $(seq 200)); i=0; "
                 "while [ $i -lt 2000 ]; do printf '%s' \"$RANK:$line\"; "
                 "printf '\\n'; i=$((i+1)); done");
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  const auto lines = Lines(out);
  CHECK(lines.size() == 8000);
  const std::string body(200, 'x');
  for (const auto& line : lines) {
    const std::string rank = line.substr(1, line.find('|') - 1);
    if (line != absl::StrCat("R", rank, "| ", rank, ":", body)) {
      FAIL("mixed line: " << line.substr(0, 80));
    }
  }
}

TEST_CASE("help and version exit 0", "[ctrun][integration]") {
  ChildProcess help({CtrunPath(), "--help"});
  CHECK(help.ReadAll(kWait).find("usage: ctrun") == 0);
  CHECK(help.Wait(kWait) == 0);
  ChildProcess version({CtrunPath(), "--version"});
  CHECK(version.ReadAll(kWait).rfind("ctrun ", 0) == 0);
  CHECK(version.Wait(kWait) == 0);
}

// The GPU watch against the fake NVML (tests/support/fake_nvml.cc): four
// "GPUs", the workers placed on them as CTRUN_FAKE_NVML says.
std::unique_ptr<ChildProcess> CtrunOnFakeGpus(
    const std::string& placement, std::vector<std::string> flags = {}) {
  flags.push_back("--nproc_per_node=4");
  return Ctrun(flags, "sleep 8",
               {"CTRUN_NVML_LIBRARY=" + FakeNvmlPath(),
                "CTRUN_FAKE_NVML=gpus=4 util=90,0,0,0 placement=" + placement +
                    " mib=1024"});
}

TEST_CASE("Workers all on GPU 0 are named once, with the idle GPUs",
          "[ctrun][gpu_watch][integration]") {
  auto c = CtrunOnFakeGpus("0,0,0,0");
  const auto code = c->Wait(kWait);
  const std::string err = c->Stderr();
  INFO(err);
  REQUIRE(code == 0);
  CHECK(CountMatches(
            err,
            "ctrun: ranks 0-3 all run on GPU 0; GPUs 1-3 are idle \xE2\x80\x94 "
            "call torch\\.cuda\\.set_device\\(LOCAL_RANK\\)") == 1);
  // The node's end-of-job line, with what NVML said of its GPUs.
  CHECK(CountMatches(
            err,
            "ctrun: ranks 0-3: wall [0-9.]+s, peak RSS [0-9.]+ [KM]iB / "
            "[0-9.]+ [KM]iB / [0-9.]+ [KM]iB \\(min / median / max\\), GPU "
            "peak memory 1\\.0 GiB / 1\\.0 GiB / 1\\.0 GiB, mean utilization "
            "90%\n") == 1);
  CHECK(CountMatches(err, "ctrun: rank [0-3]: wall") == 0);
}

TEST_CASE(
    "A node whose GPUs NVML calls unfit is not admitted, each problem named",
    "[ctrun][gpu_watch][integration]") {
  const std::string marker = std::filesystem::temp_directory_path() /
                             ("ctrun-unfit-" + std::to_string(getpid()));
  auto c = Ctrun({"--nproc_per_node=2"}, "touch " + marker,
                 {"CTRUN_NVML_LIBRARY=" + FakeNvmlPath(),
                  "CTRUN_FAKE_NVML=gpus=3 ecc=0,0,7 retired=0,1,0 "
                  "other=0:4096",
                  "CUDA_VISIBLE_DEVICES=0,1,2,3"});
  const auto code = c->Wait(kWait);
  const std::string err = c->Stderr();
  INFO(err);
  CHECK(code == 1);
  CHECK(absl::StrContains(
      err,
      "ctrun: this node failed its health check: NVML sees 3 GPUs, fewer "
      "than the 4 this node was given; GPU 0 is held by another process "
      "(pid 1, 4.0 GiB); GPU 1 has pages pending retirement (it needs a "
      "reset); GPU 2 has 7 uncorrected ECC errors since boot"));
  CHECK_FALSE(std::filesystem::exists(marker));  // no worker started
}

TEST_CASE("Workers each on their own GPU are not named",
          "[ctrun][gpu_watch][integration]") {
  auto c = CtrunOnFakeGpus("0,1,2,3", {"-v"});
  const auto code = c->Wait(kWait);
  const std::string err = c->Stderr();
  INFO(err);
  REQUIRE(code == 0);
  CHECK(err.find("idle") == std::string::npos);
  // With -v, the end-of-job line of each rank.
  CHECK(CountMatches(err,
                     "ctrun: rank 2: wall [0-9.]+s, peak RSS [0-9.]+ [KM]iB, "
                     "GPU 2: peak memory 1\\.0 GiB, mean utilization 0%") == 1);
  CHECK(CountMatches(err, "ctrun: rank [0-3]: wall") == 4);
  CHECK(CountMatches(err, "ctrun: ranks 0-3: wall") == 0);
}

TEST_CASE("Without NVML the end-of-job lines have no GPU part",
          "[ctrun][gpu_watch][integration]") {
  auto c = Ctrun({"--nproc_per_node=2"}, "exit 0",
                 {"CTRUN_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"});
  REQUIRE(c->Wait(kWait) == 0);
  const std::string err = c->Stderr();
  CHECK(CountMatches(err,
                     "ctrun: ranks 0-1: wall [0-9.]+s, peak RSS [0-9.]+ [KM]iB "
                     "/ [0-9.]+ [KM]iB / [0-9.]+ [KM]iB \\(min / median / "
                     "max\\)\n") == 1);
}

// --numa_binding on the synthetic machine of tests/support/topology_xml.h
// (HWLOC_XMLFILE): its CPUs that exist here are even on socket 0 (GPUs
// 0-3) and odd on socket 1 (GPUs 4-7).
class FakeTopology {
 public:
  FakeTopology()
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("ctrun-topology-", getpid(), ".xml")) {
    std::ofstream(path_) << TwoSocketsEightGpusXml();
  }
  ~FakeTopology() { std::filesystem::remove(path_); }
  std::string env() const { return "HWLOC_XMLFILE=" + path_; }

 private:
  std::string path_;
};

// The CPUs this process may use, of the synthetic machine's 16.
std::set<int> UsableCpus() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  std::set<int> cpus;
  for (int c = 0; c < 16; ++c) {
    if (CPU_ISSET(c, &mine)) cpus.insert(c);
  }
  return cpus;
}

std::string CpuList(const std::set<int>& cpus) {
  std::vector<std::string> parts;
  for (int c : cpus) parts.push_back(absl::StrCat(c));
  return absl::StrJoin(parts, ",");
}

TEST_CASE("numa_binding=node binds each worker to its GPU's NUMA node",
          "[ctrun][numa][integration]") {
  FakeTopology topology;
  auto c = Ctrun({"--nproc_per_node=8", "--numa_binding=node"},
                 "grep Cpus_allowed_list /proc/$$/status", {topology.env()});
  const std::string out = c->ReadAll(kWait);
  REQUIRE(c->Wait(kWait) == 0);
  const std::string err = c->Stderr();
  INFO(out << err);
  CHECK(err.find("ctrun: --numa_binding=node: local rank 5 on CPUs ") !=
        std::string::npos);
  CHECK(err.find(", memory preferred on NUMA node 1\n") != std::string::npos);
  const std::set<int> usable = UsableCpus();
  for (int rank = 0; rank < 8; ++rank) {
    std::set<int> expected;
    for (int cpu : usable) {
      if (cpu % 2 == rank / 4) expected.insert(cpu);
    }
    if (expected.empty()) continue;  // a machine of one CPU
    // Cpus_allowed_list writes runs as ranges; ours are never consecutive.
    CHECK(out.find(absl::StrCat("R", rank, "| Cpus_allowed_list:\t",
                                CpuList(expected), "\n")) != std::string::npos);
  }
}

TEST_CASE("numa_binding=exclusive without a core per GPU is refused",
          "[ctrun][numa][integration]") {
  const std::set<int> usable = UsableCpus();
  const auto evens = std::count_if(usable.begin(), usable.end(),
                                   [](int cpu) { return cpu % 2 == 0; });
  if (evens >= 4 || evens == 0) return;  // enough cores, or none on node 0
  FakeTopology topology;
  auto c = Ctrun({"--nproc_per_node=8", "--numa_binding=exclusive"}, "true",
                 {topology.env()});
  CHECK(c->Wait(kWait) == 1);
  CHECK(absl::StrContains(
      c->Stderr(),
      absl::StrCat("ctrun: --numa_binding=exclusive: NUMA node 0 has ", evens,
                   " usable physical cores for its 4 GPUs; "
                   "--numa_binding=exclusive needs at least one each\n")));
}

TEST_CASE(
    "Without hwloc, --numa_binding fails in one line naming it, and a run "
    "without the flag never loads it",
    "[ctrun][numa][integration]") {
  auto missing = Ctrun({"--nproc_per_node=1", "--numa_binding=node"}, "true",
                       {"CTRUN_HWLOC_LIBRARY=/nonexistent/libhwloc.so.15"});
  CHECK(missing->Wait(kWait) == 1);
  INFO(missing->Stderr());
  CHECK(std::regex_search(
      missing->Stderr(),
      std::regex("ctrun: --numa_binding=node: the machine's topology comes "
                 "from hwloc, which is not installed \\([^\n]*\\): install "
                 "it \\(Debian and Ubuntu: libhwloc15\\) or leave out "
                 "--numa_binding\n")));
  // A library that is not hwloc is refused, not used.
  auto wrong = Ctrun({"--nproc_per_node=1", "--numa_binding=node"}, "true",
                     {"CTRUN_HWLOC_LIBRARY=" + FakeNvmlPath()});
  CHECK(wrong->Wait(kWait) == 1);
  CHECK(absl::StrContains(wrong->Stderr(),
                          "the library found is another version or not "
                          "hwloc"));
  auto without = Ctrun({"--nproc_per_node=1"}, "true",
                       {"CTRUN_HWLOC_LIBRARY=/nonexistent/libhwloc.so.15"});
  CHECK(without->Wait(kWait) == 0);
}

TEST_CASE(
    "A default standalone run maps none of the libraries that only a flag or "
    "a GPU asks for",
    "[ctrun][integration]") {
  auto c = Ctrun({"--standalone", "--nproc_per_node=1"}, "echo up; sleep 2");
  REQUIRE(c->WaitForLine("up", kWait));
  std::ifstream in(absl::StrCat("/proc/", c->pid(), "/maps"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string maps = text.str();
  INFO(maps);
  REQUIRE(absl::StrContains(maps, "libc.so"));
  // hwloc (--numa_binding) and what it pulls in, NVML (a GPU's driver),
  // munge (Slurm); no metrics library (ctrun writes the format itself), and
  // spdlog and fmt are compiled in.
  for (const char* lib :
       {"libhwloc", "libudev", "libxml2", "libnvidia-ml", "libmunge",
        "libprometheus", "libcivetweb", "libspdlog", "libfmt"}) {
    CHECK_FALSE(absl::StrContains(maps, lib));
  }
  CHECK(c->Wait(kWait) == 0);
}

// Fails before: the job token's HMAC went through OpenSSL's EVP layer,
// which first reads OpenSSL's configuration file and builds its provider
// tables: 1.4 MiB of the agent's memory in every launch.
TEST_CASE(
    "A launch makes and checks its job token without starting OpenSSL's "
    "configuration",
    "[ctrun][integration]") {
  // OpenSSL reads OPENSSL_CONF as it starts. A FIFO that nobody writes
  // holds that read, and whatever made it, for ever.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("ctrun-openssl-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string conf = dir / "openssl.cnf";
  REQUIRE(mkfifo(conf.c_str(), 0600) == 0);
  // The agent makes the workers' job token; a worker using the store makes
  // the agent's server check it (the probe itself reads no configuration).
  auto c =
      Ctrun({"--standalone", "--nproc_per_node=2"},
            absl::StrCat("env -u OPENSSL_CONF ", WorkerProbePath(), " store"),
            {"OPENSSL_CONF=" + conf});
  INFO(c->Stderr());
  CHECK(c->Wait(kWait) == 0);
  std::filesystem::remove_all(dir);
}

// The threads of a process, by name.
std::multiset<std::string> Threads(pid_t pid) {
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    std::getline(in, name);
    names.insert(name);
  }
  return names;
}

// Fails before: the hosting agent's session went over gRPC to its own
// server, which started gRPC's threads (and touched megabytes of its code)
// in every run.
TEST_CASE(
    "A standalone run starts gRPC only when a worker connects to the store",
    "[ctrun][integration]") {
  auto plain =
      Ctrun({"--standalone", "--nproc_per_node=2"}, "echo up; sleep 2");
  REQUIRE(plain->WaitForLine("up", kWait));
  const std::multiset<std::string> own = Threads(plain->pid());
  INFO(absl::StrJoin(own, ", "));
  // The agent's loop, its two console threads, the rendezvous' timer and
  // the thread that accepts connections: no gRPC poller, executor, timer.
  CHECK(own.size() == own.count("ctrun"));
  CHECK(plain->Wait(kWait) == 0);

  // A worker that uses the store starts it; the job runs as always.
  auto store = Ctrun({"--standalone", "--nproc_per_node=2"},
                     absl::StrCat(WorkerProbePath(), " store && sleep 2"));
  const auto ready = store->WaitForLine("ok store rank=", kWait);
  INFO(store->Stderr());
  REQUIRE(ready);
  const std::multiset<std::string> with_store = Threads(store->pid());
  INFO(absl::StrJoin(with_store, ", "));
  CHECK(with_store.size() > with_store.count("ctrun"));
  CHECK(store->Wait(kWait) == 0);
}

// Fails before: the agent's accepting thread polled its listener again at
// once when accept failed for lack of descriptors, spinning a core for as
// long as the connections were held.
TEST_CASE(
    "A worker that floods the agent's rendezvous port with connections does "
    "not make it spin and the job ends well",
    "[ctrun][integration][hostile]") {
  // The agent may hold 300 descriptors; the worker raises its own limit.
#if defined(__SANITIZE_ADDRESS__)
  // Not in the sanitized build: UndefinedBehaviorSanitizer's type check
  // probes memory through a pipe, which a process out of descriptors
  // cannot make, and it then reports a valid object as invalid and ends
  // the agent (its errors do not recover). The flood is still sent, to an
  // agent with room for it.
  const char* const limit = "--nofile=2000:4096";
#else
  const char* const limit = "--nofile=300:4096";
#endif
  const std::string flood =
      "import os, resource, socket, time\n"
      "resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))\n"
      "host, port = os.environ['CTRUN_STORE_ENDPOINT'].rsplit(':', 1)\n"
      "held = [socket.create_connection((host, int(port))) for _ in "
      "range(600)]\n"
      "print('held', len(held), flush=True)\n"
      "time.sleep(3)\n";
  std::vector<std::string> argv = {"/usr/bin/prlimit",
                                   limit,
                                   CtrunPath(),
                                   "--standalone",
                                   "--nproc_per_node=1",
                                   "--no_python",
                                   "/usr/bin/python3",
                                   "-c",
                                   flood};
  ChildProcess c(argv);
  const auto held = c.WaitForLine("held 600", kWait);
  INFO(c.Stderr());
  REQUIRE(held);
  absl::SleepFor(absl::Milliseconds(300));
  const long before = CpuTicks(c.pid());
  absl::SleepFor(absl::Seconds(2));
  const long used = CpuTicks(c.pid()) - before;
  // A spinning thread takes ~2 s (200 ticks) of these 2 s.
  CHECK(used < 50);
  CHECK(c.Wait(kWait) == 0);
}

}  // namespace
}  // namespace ctrun::testing
