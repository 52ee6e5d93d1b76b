// Warm starts (--preload): Python workers forked from ctrun's template
// interpreter behave as cold ones: what they see, how they end, what ends
// with them; a template that cannot fork turns warm starts off, said once.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/terminal_session.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(120);
const std::string kPython = "PYTHON_EXEC=/usr/bin/python3";

std::string Probe() { return SourceDir() + "/tests/e2e/python/start_probe.py"; }

// rank -> its probe line without the "warm" field; `warm` counts the lines
// that said warm.
std::map<std::string, std::string> Probes(const std::string& out, int* warm) {
  static const std::regex kLine(R"re(probe (\{.*"RANK": "([0-9]+)".*\}))re");
  std::map<std::string, std::string> by_rank;
  for (std::sregex_iterator it(out.begin(), out.end(), kLine), end; it != end;
       ++it) {
    std::string json = (*it)[1];
    const size_t at = json.find(", \"warm\": ");
    REQUIRE(at != std::string::npos);
    *warm += json.compare(at, 15, ", \"warm\": true}") == 0;
    by_rank[(*it)[2]] = json.substr(0, at);
  }
  return by_rank;
}

std::unique_ptr<ChildProcess> Run(std::vector<std::string> flags,
                                  std::vector<std::string> args,
                                  std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {CtrunPath(), "--nproc_per_node=2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(Probe());
  argv.insert(argv.end(), args.begin(), args.end());
  env.push_back(kPython);
  env.push_back("PROBE_VAR=seen");
  return std::make_unique<ChildProcess>(argv, env);
}

TEST_CASE("A warm start sees what a cold one sees", "[ctrun][e2e]") {
  auto cold = Run({}, {"stay"});
  auto warm = Run({"--preload=wave"}, {"stay"});
  const std::string cold_out = cold->ReadAll(kWait);
  const std::string warm_out = warm->ReadAll(kWait);
  INFO(cold_out << cold->Stderr() << warm_out << warm->Stderr());
  REQUIRE(cold->Wait(kWait) == 0);
  REQUIRE(warm->Wait(kWait) == 0);
  int cold_warm = 0, warm_warm = 0;
  const auto c = Probes(cold_out, &cold_warm);
  const auto w = Probes(warm_out, &warm_warm);
  CHECK(cold_warm == 0);
  CHECK(warm_warm == 2);
  REQUIRE(c.size() == 2);
  // argv, __file__, sys.path[0], cwd, __name__, the variables, signal
  // dispositions and mask, its own process group, the agent as parent,
  // stdout's kind: all alike.
  CHECK(c == w);
  CHECK(c.at("1").find("\"PROBE_VAR\": \"seen\"") != std::string::npos);
  CHECK(c.at("1").find("\"parent_is_agent\": true") != std::string::npos);
}

TEST_CASE("A warm worker ends as a cold one: exit code, traceback, signal",
          "[ctrun][e2e]") {
  SECTION("exit code") {
    auto p = Run({"--preload=wave"}, {"exit", "7"});
    p->ReadAll(kWait);
    CHECK(p->Wait(kWait) == 7);
    CHECK(p->Stderr().find("exitcode   : 7") != std::string::npos);
  }
  SECTION("an uncaught exception, with the script's own traceback") {
    auto p = Run({"--preload=wave"}, {"raise"});
    p->ReadAll(kWait);
    CHECK(p->Wait(kWait) == 1);
    const std::string err = p->Stderr();
    INFO(err);
    CHECK(err.find("Traceback (most recent call last):\n[") !=
          std::string::npos);
    CHECK(err.find("start_probe.py\", line") != std::string::npos);
    CHECK(err.find("ValueError: rank 1 raises on purpose") !=
          std::string::npos);
    CHECK(err.find("ctrun_template") == std::string::npos);
  }
  SECTION("a signal") {
    auto p = Run({"--preload=wave"}, {"term"});
    p->ReadAll(kWait);
    CHECK(p->Wait(kWait) == 128 + SIGTERM);
    CHECK(p->Stderr().find("was killed by SIGTERM") != std::string::npos);
  }
}

TEST_CASE("A warm worker and its children end when the agent is killed",
          "[ctrun][e2e]") {
  auto p = Run({"--preload=wave"}, {"child"});
  std::vector<pid_t> pids;
  static const std::regex kChild("child ([0-9]+) of ([0-9]+)");
  for (int i = 0; i < 2; ++i) {
    auto line = p->WaitForLine("child ", kWait);
    REQUIRE(line);
    std::smatch m;
    REQUIRE(std::regex_search(*line, m, kChild));
    pids.push_back(std::stoi(m[1]));
    pids.push_back(std::stoi(m[2]));
  }
  p->Signal(SIGKILL);  // the agent alone: its watchdog ends the rest
  CHECK(p->Wait(kWait) == 128 + SIGKILL);
  auto alive = [&] {
    int n = 0;
    for (const ProcessInfo& info : AllProcesses()) {
      n += std::count(pids.begin(), pids.end(), info.pid) > 0 &&
           info.state != 'Z';
    }
    return n;
  };
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (alive() > 0 && absl::Now() < end)
    absl::SleepFor(absl::Milliseconds(20));
  const int left = alive();
  for (pid_t pid : pids) kill(pid, SIGKILL);  // nothing left either way
  CHECK(left == 0);
}

// A folder of its own for modules to preload, removed at the end.
struct ModuleDir {
  explicit ModuleDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             absl::StrCat("ctrun-", name, "-", getpid())) {
    std::filesystem::create_directories(path);
  }
  ~ModuleDir() { std::filesystem::remove_all(path); }
  std::string python_path() const { return "PYTHONPATH=" + path; }
  const std::string path;
};

// Fails before: the forked worker waited for its middle parent's exit with
// 20,000 sched_yield()s, then exited 127 (read as the script's error); the
// exit of a parent holding gigabytes takes longer.
TEST_CASE("Warm workers of a template holding gigabytes run their script",
          "[ctrun][e2e]") {
  ModuleDir dir("big-template");
  // 3 GiB, every page written: the middle parent's exit unmaps them all.
  std::ofstream(dir.path + "/ballast.py")
      << "import mmap\n"
         "data = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_PRIVATE | "
         "mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)\n";
  // The first attempt (cold: the template still imports) fails once the
  // template is ready; the restart's workers are forked from it.
  std::ofstream(dir.path + "/job.py")
      << "import os, sys, time\n"
      << "sys.path.insert(0, '" << SourceDir() << "/tests/e2e/python')\n"
      << "from template_ready import await_ready_template\n"
         "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
         "    if os.environ['LOCAL_RANK'] == '0':\n"
         "        await_ready_template()\n"
         "        sys.exit(3)\n"
         "    time.sleep(120)  # ended by the restart\n"
         "print('second attempt, warm', 'ballast' in sys.modules, "
         "flush=True)\n";
  ChildProcess p({CtrunPath(), "--nproc_per_node=2", "--max_restarts=1",
                  "--preload=ballast", dir.path + "/job.py"},
                 {kPython, dir.python_path()});
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  CHECK(p.Wait(kWait) == 0);
  CHECK(absl::StrContains(out, "]: second attempt, warm True"));
  CHECK(out.find("second attempt, warm True") !=
        out.rfind("second attempt, warm True"));
  CHECK_FALSE(absl::StrContains(p.Stderr(), "warm starts are off"));
  CHECK_FALSE(absl::StrContains(p.Stderr(), "exitcode   : 127"));
}

// Fails before: a start waited up to 5 s for the template's answer on the
// agent's loop, which sends the heartbeats; with a 3 s heartbeat timeout
// the node was lost.
TEST_CASE(
    "A template that stops answering costs a start its warmth, never the "
    "node",
    "[ctrun][e2e]") {
  ModuleDir dir("stopped-template");
  // The first attempt's rank 0 stops the template (the agent's child whose
  // stdout is /dev/null), then the attempt fails: the restart asks the
  // stopped template for its workers.
  std::ofstream(dir.path + "/job.py")
      << "import os, signal, sys, time\n"
      << "sys.path.insert(0, '" << SourceDir() << "/tests/e2e/python')\n"
      << "from template_ready import await_ready_template\n"
         "if os.environ['TORCHELASTIC_RESTART_COUNT'] != '0':\n"
         "    print('second attempt', flush=True)\n"
         "    sys.exit(0)\n"
         "if os.environ['LOCAL_RANK'] == '0':\n"
         "    os.kill(await_ready_template(), signal.SIGSTOP)\n"
         "    print('stopped the template', flush=True)\n"
         "    sys.exit(1)\n"
         "time.sleep(120)  # ended by the restart\n";
  ChildProcess p(
      {CtrunPath(), "--nproc_per_node=2", "--max_restarts=1", "--preload=wave",
       "--rdzv_conf=heartbeat_timeout=3,keep_alive_interval=1",
       dir.path + "/job.py"},
      {kPython});
  const std::string out = p.ReadAll(kWait);
  const std::string err = p.Stderr();
  INFO(out << err);
  CHECK(p.Wait(kWait) == 0);
  CHECK(absl::StrContains(out, "stopped the template"));
  CHECK(out.find("second attempt") != out.rfind("second attempt"));
  CHECK(absl::StrContains(err,
                          "warm starts are off: the template interpreter did "
                          "not answer within 1s"));
  CHECK_FALSE(absl::StrContains(err, "declared lost"));
  CHECK_FALSE(absl::StrContains(err, "was lost"));
}

// Fails before: the template's stdout was a pipe nobody read, closed: the
// module's print raised BrokenPipeError and warm starts were off.
TEST_CASE("A preloaded module that prints as it loads keeps warm starts on",
          "[ctrun][e2e]") {
  ModuleDir dir("printing-module");
  std::ofstream(dir.path + "/chatty.py")
      << "import sys\n"
         "print('chatty loads', flush=True)\n"
         "print('chatty warns', file=sys.stderr, flush=True)\n"
         "import wave\n";
  auto p = Run({"--preload=chatty"}, {"stay"}, {dir.python_path()});
  const std::string out = p->ReadAll(kWait);
  INFO(out << p->Stderr());
  CHECK(p->Wait(kWait) == 0);
  int warm = 0;
  CHECK(Probes(out, &warm).size() == 2);
  CHECK(warm == 2);
  CHECK(p->Stderr().find("warm starts are off") == std::string::npos);
}

// Fails before: a descriptor ctrun's caller left open (a wrapper's flock, a
// CI runner's pipe) reached every worker; torchrun's get 0, 1 and 2 only.
TEST_CASE("A descriptor the caller left open reaches no worker, cold or warm",
          "[ctrun][e2e]") {
  ModuleDir dir("inherited-fd");
  const std::string held = dir.path + "/held-by-the-caller";
  std::ofstream(held) << "lock\n";
  for (const std::string preload : {"", "--preload=wave"}) {
    std::vector<std::string> argv = {
        "/bin/sh", "-c",        "exec 7<\"$0\"; exec \"$@\"",
        held,      CtrunPath(), "--nproc_per_node=2"};
    if (!preload.empty()) argv.push_back(preload);
    argv.push_back(Probe());
    argv.push_back("stay");
    ChildProcess p(argv, {kPython});
    const std::string out = p.ReadAll(kWait);
    INFO(preload << "\n" << out << p.Stderr());
    REQUIRE(p.Wait(kWait) == 0);
    int warm = 0;
    CHECK(Probes(out, &warm).size() == 2);
    CHECK(warm == (preload.empty() ? 0 : 2));
    CHECK(out.find("fds [") != std::string::npos);
    CHECK(out.find(held) == std::string::npos);
  }
}

TEST_CASE("A template that cannot fork soundly turns warm starts off, once",
          "[ctrun][e2e]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-preload-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/threader.py")
      << "import threading, time\n"
         "threading.Thread(target=time.sleep, args=(600,), daemon=True)"
         ".start()\n";
  SECTION("a module that starts a thread") {
    auto p = Run({"--preload=threader"}, {"stay"}, {"PYTHONPATH=" + dir});
    const std::string out = p->ReadAll(kWait);
    CHECK(p->Wait(kWait) == 0);
    int warm = 0;
    CHECK(Probes(out, &warm).size() == 2);
    CHECK(warm == 0);
    const std::string err = p->Stderr();
    CHECK(err.find("ctrun: warm starts are off: the template interpreter "
                   "cannot fork: the template runs 2 threads after its "
                   "imports; workers start cold") != std::string::npos);
  }
  SECTION("a module that is not there") {
    auto p = Run({"--preload=no_such_module_here"}, {"stay"});
    p->ReadAll(kWait);
    CHECK(p->Wait(kWait) == 0);
    CHECK(p->Stderr().find("cannot import no_such_module_here") !=
          std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// Fails before: PyTorch's store client that came first retried only a
// second later (a warm replacement joining a kept rank 0 paid it each time).
TEST_CASE(
    "A rank other than 0 forms its group once rank 0's store listens (cold "
    "and warm starts)",
    "[ctrun][e2e]") {
  const std::string script = SourceDir() + "/tests/e2e/python/master_wait.py";
  for (const std::string preload : {"", "--preload=torch"}) {
    std::vector<std::string> argv = {CtrunPath(), "--standalone",
                                     "--nproc_per_node=2"};
    if (!preload.empty()) argv.push_back(preload);
    argv.push_back(script);
    ChildProcess p(argv, {kPython});
    const std::string out = p.ReadAll(kWait);
    INFO(preload << "\n" << out << p.Stderr());
    REQUIRE(p.Wait(kWait) == 0);
    CHECK(out.find("wrapped 0 True") != std::string::npos);
    CHECK(out.find("wrapped 1 True") != std::string::npos);
    CHECK(out.find("]: waited True") != std::string::npos);
    CHECK(out.find("rank0-waited False") != std::string::npos);
    CHECK(out.find("unresolved-passed-on True") != std::string::npos);
    CHECK(out.find("bad-port-passed-on True") != std::string::npos);
    CHECK(out.find("sum 0 3") != std::string::npos);
    CHECK(out.find("sum 1 3") != std::string::npos);
  }
  // Outside ctrun the module leaves torch as it is.
  ChildProcess plain(
      {"/usr/bin/python3", "-c",
       "import ctrun, sys, torch.distributed; print('plain', hasattr(sys."
       "modules['torch.distributed.rendezvous']._rendezvous_handlers['env'], "
       "'_ctrun_waits'))"},
      {"PYTHONPATH=" + SourceDir() + "/worker_lib/python"});
  const std::string out = plain.ReadAll(kWait);
  INFO(out << plain.Stderr());
  REQUIRE(plain.Wait(kWait) == 0);
  CHECK(out.find("plain False") != std::string::npos);
}

TEST_CASE("input() on a warm local rank 0 reads the terminal",
          "[ctrun][e2e][terminal]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-warm-tty-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/ask.py";
  std::ofstream(script)
      << "import os, sys\n"
         "warm = 'wave' in sys.modules\n"
         "if os.environ['LOCAL_RANK'] == '0':\n"
         "    name = input('name? ')\n"
         "    print('hello', name, 'warm', warm, flush=True)\n";
  TerminalSession t(
      {CtrunPath(), "--nproc_per_node=2", "--preload=wave", script},
      {"TERM=dumb", kPython});
  REQUIRE(t.WaitFor("name? ", kWait));
  t.Type("ada\n");
  CHECK(t.Wait(kWait) == 0);
  INFO(t.Screen());
  CHECK(t.Screen().find("hello ada warm True") != std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ctrun::testing
