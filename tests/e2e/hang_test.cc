// Hangs and stragglers with real workers: PyTorch (Gloo) ranks that stop
// making progress, torchrun's own file timers, --hang_timeout=auto across a
// restart, a straggler, and ctrun's Python module outside ctrun.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ctrun/progress_board.h"
#include "launcher/workers/agent_board.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(180);
const std::string kPython = "PYTHON_EXEC=/usr/bin/python3";

std::string Script(const std::string& name) {
  return SourceDir() + "/tests/e2e/python/" + name;
}

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh --log_dir for one test.
std::string LogDir(const std::string& name) {
  const char* tmp = getenv("TMPDIR");
  const std::string dir =
      absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The one run directory under a --log_dir.
std::filesystem::path RunDir(const std::string& log_dir) {
  for (const auto& entry : std::filesystem::directory_iterator(log_dir)) {
    if (entry.is_directory()) return entry.path();
  }
  FAIL("no run directory under " << log_dir);
  return {};
}

// What a finished ctrun said; `code` is empty when it did not end in time.
struct Finished {
  std::string out, err;
  std::optional<int> code;
};
Finished RunToEnd(std::vector<std::string> argv,
                  std::vector<std::string> env = {kPython}) {
  ChildProcess p(std::move(argv), std::move(env));
  Finished f;
  f.out = p.ReadAll(kWait);
  f.code = p.Wait(kWait);
  f.err = p.Stderr();
  return f;
}

// The seconds in the first "no progress for X" of `text`, or -1.
double SilentFor(const std::string& text) {
  std::smatch m;
  static const std::regex re("no progress for ([0-9.]+)(ms|s)");
  if (!std::regex_search(text, m, re)) return -1;
  const double value = std::stod(m[1]);
  return m[2] == "ms" ? value / 1000 : value;
}

TEST_CASE(
    "A rank of a 4-worker Gloo job that sleeps before an all-reduce is "
    "caught, every rank's stacks are taken, and the restart completes",
    "[hang][e2e]") {
  const std::string logs = LogDir("hang-gloo");
  const auto [out, err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=4", "--max_restarts=1",
       "--hang_timeout=3", "--hang_evidence_timeout=30", "--log_dir", logs,
       Script("hang_allreduce.py")});
  INFO(out << err);
  REQUIRE(code == 0);
  // Caught within the timeout and one more second, naming the sleeper.
  const size_t hung = err.find("worker rank 2 (local 2, pid ");
  REQUIRE(hung != std::string::npos);
  CHECK(absl::StrContains(err.substr(hung), ") is hung: no progress for "));
  const double silent = SilentFor(err.substr(hung));
  CHECK(silent >= 3.0);  // shown cut to 10 ms
  CHECK(silent < 4.0);
  CHECK(absl::StrContains(err, "restarting the workers (round 1"));
  CHECK(absl::StrContains(err, "ctrun: the Python stack of rank 2:"));
  // The second attempt ran to its end on every rank.
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(absl::StrContains(out,
                            absl::StrCat("final rank=", rank, " restart=1")));
  }
  // The evidence: every rank's output and Python stack; the sleeper's names
  // the line it sleeps on, the others wait in the all-reduce.
  const auto incident = RunDir(logs) / "hang_round_0";
  REQUIRE(std::filesystem::is_directory(incident));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string python =
        Slurp(incident / absl::StrCat("rank", rank, ".python.txt"));
    INFO("rank " << rank << ": " << python);
    CHECK(absl::StrContains(python, "hang_allreduce.py"));
    if (rank == 2) {
      CHECK(absl::StrContains(python, "hang_allreduce.py\", line 31"));
    } else {
      CHECK(absl::StrContains(python, "all_reduce"));
    }
    CHECK(std::filesystem::exists(incident /
                                  absl::StrCat("rank", rank, ".output.txt")));
    if (std::filesystem::exists("/usr/bin/gdb")) {
      const std::string native =
          Slurp(incident / absl::StrCat("rank", rank, ".native.txt"));
      CHECK(absl::StrContains(native, "#0 "));
    }
  }
  std::filesystem::remove_all(logs);
}

// The root cause of a failure summary.
std::string RootCausePart(const std::string& err) {
  const size_t at = err.find("Root Cause (first observed failure)");
  return at == std::string::npos ? "" : err.substr(at);
}

TEST_CASE(
    "When every rank stalls in one step, the rank outside the collective is "
    "named, not the first whose progress stopped",
    "[hang][e2e]") {
  // Rank 2 signals its step half a second after the others, then sleeps;
  // the others wait for it in the all-reduce.
  const std::string logs = LogDir("hang-culprit");
  const auto [out, err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=4", "--max_restarts=0",
       "--hang_timeout=3", "--hang_evidence_timeout=30", "--log_dir", logs,
       Script("hang_allreduce.py"), "--late_beat=0.5"});
  INFO(out << err);
  CHECK(code == 124);
  // The first to stop signalling is a rank that waits.
  std::smatch first;
  REQUIRE(std::regex_search(
      err, first,
      std::regex("worker rank ([0-9]) \\(local [0-9], pid [0-9]+\\) "
                 "is hung")));
  CHECK(first[1] != "2");
  CHECK(std::regex_search(
      err, std::regex("rank 2 holds up the job: its main thread is outside "
                      "any collective \\(at hang_allreduce.py, line [0-9]+, "
                      "in <module>\\) while ranks 0, 1, 3 wait in all_reduce; "
                      "decided from the workers' Python stacks")));
  CHECK(absl::StrContains(err, "ctrun: the Python stack of rank 2:"));
  const std::string root = RootCausePart(err);
  CHECK(absl::StrContains(root, "rank       : 2 (local_rank: 2)"));
  CHECK(absl::StrContains(
      root, absl::StrCat("; rank ", first[1].str(),
                         " stopped signalling first: no progress for ")));
  std::filesystem::remove_all(logs);
}

TEST_CASE(
    "Across two nodes, both name the rank the others wait for, though the "
    "node of the waiting ones may report first",
    "[hang][e2e]") {
  Daemon daemon;
  auto node = [&](int n) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=2",
            "--nproc_per_node=2", "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=hang-2n",
            "--max_restarts=0", "--hang_timeout=3",
            "--hang_evidence_timeout=30", Script("hang_allreduce.py"),
            "--late_beat=0.5"},
        std::vector<std::string>{kPython});
  };
  auto a = node(2);
  auto b = node(3);
  a->ReadAll(kWait);
  b->ReadAll(kWait);
  const std::optional<int> code_a = a->Wait(kWait);
  const std::optional<int> code_b = b->Wait(kWait);
  const std::string err = a->Stderr() + b->Stderr();
  INFO(err);
  CHECK(code_a == 124);
  CHECK(code_b == 124);
  // One node holds ranks 0 and 1, both waiting; the other rank 2.
  CHECK(absl::StrContains(err,
                          "every worker here (ranks 0, 1) waits in all_reduce: "
                          "the rank they wait for is not on this node"));
  CHECK(absl::StrContains(err, "rank 2 holds up the job"));
  for (ChildProcess* p : {a.get(), b.get()}) {
    CHECK(absl::StrContains(RootCausePart(p->Stderr()),
                            "rank       : 2 (local_rank: 0)"));
  }
}

TEST_CASE(
    "torchrun's FileTimerClient works unchanged: an expired scope kills its "
    "worker with the signal asked after its evidence, and the summary names "
    "the scope",
    "[hang][e2e]") {
  const std::string logs = LogDir("file-timer");
  const auto [out, err, code] =
      RunToEnd({CtrunPath(), "--standalone", "--nproc_per_node=2", "--log_dir",
                logs, Script("file_timer.py")},
               {kPython, "TORCHELASTIC_ENABLE_FILE_TIMER=1"});
  INFO(out << err);
  CHECK(code == 128 + SIGTERM);  // the root cause's, from a live agent
  CHECK(
      absl::StrContains(err, "torchrun file timer 'slow_io' of worker rank 1"));
  CHECK(absl::StrContains(err,
                          "expired; collecting evidence from this node's "
                          "workers, then killing it with SIGTERM"));
  // Evidence before the kill: both workers' state, kept where it says,
  // Python stacks included though the script never imports ctrun.
  CHECK(std::regex_search(
      err, std::regex("evidence in [^ ]*/hang_round_0: last output of 2 "
                      "workers, Python stacks of 2, native stacks of 2")));
  CHECK(absl::StrContains(Slurp(RunDir(logs) / "hang_round_0/rank1.python.txt"),
                          "file_timer.py"));
  CHECK_FALSE(absl::StrContains(err, "not killing"));
  std::filesystem::remove_all(logs);
  CHECK(absl::StrContains(err, "Root Cause (first observed failure)"));
  CHECK(absl::StrContains(err,
                          "cause      : torchrun file timer 'slow_io' "
                          "expired; ctrun killed it with SIGTERM"));
  CHECK_FALSE(absl::StrContains(out, "rank 1 outlived its timer"));
  CHECK_FALSE(absl::StrContains(err, "'quick'"));  // released in time
}

TEST_CASE(
    "A learned hang timeout catches a stall after 0.2 s steps within 2 s, "
    "and survives the restart",
    "[hang][e2e]") {
  const auto [out, err, code] =
      RunToEnd({CtrunPath(), "--standalone", "--nproc_per_node=2",
                "--max_restarts=1", "--hang_timeout=auto", "--hang_warmup=30",
                "--hang_evidence_timeout=5", Script("steps.py"), "--plain",
                "--steps=25", "--step=0.2", "--stall_after=15", "--stall=5"});
  INFO(out << err);
  REQUIRE(code == 0);
  const double silent = SilentFor(err);
  CHECK(silent > 0.9);
  CHECK(silent < 2.0);
  CHECK(absl::StrContains(err, "hang timeout"));
  CHECK(absl::StrContains(err, ", learned)"));
  // The restarted workers start with the job's figure.
  const size_t restart = err.find("restarting the workers (round 1");
  REQUIRE(restart != std::string::npos);
  CHECK(err.find("x the longest silence this job has shown", restart) !=
        std::string::npos);
  CHECK(absl::StrContains(out, "rank 0 done restart=1"));
  CHECK(absl::StrContains(out, "rank 1 done restart=1"));
}

TEST_CASE(
    "A straggler 30% slower than the others is named, and nothing "
    "restarts",
    "[hang][e2e]") {
  const auto [out, err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=4", Script("steps.py"),
       "--steps=110", "--step=0.1", "--slow_rank=3", "--slow=1.3"});
  INFO(out << err);
  CHECK(code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(
      err, m,
      std::regex("rank 3 on node [^ ]+ is ([0-9.]+)x slower than the median "
                 "time in sections")));
  CHECK(std::stod(m[1]) >= 1.2);
  CHECK(std::stod(m[1]) <= 1.5);
  CHECK_FALSE(absl::StrContains(err, "restarting the workers"));
  CHECK_FALSE(absl::StrContains(err, "are kept in"));  // nothing to keep
  CHECK_FALSE(std::regex_search(err, std::regex("rank [012] on node")));
}

TEST_CASE("What the Python module writes is what the agent's board reads",
          "[hang][e2e]") {
  const std::string dir = LogDir("python-board");
  auto board = ProgressBoard::Create(2);
  REQUIRE(board.ok());
  const std::string code =
      "import ctrun\n"
      "assert ctrun.reported()\n"
      "ctrun.heartbeat()\n"
      "ctrun.heartbeat()\n"
      "with ctrun.section('compute'):\n"
      "    with ctrun.section('inner'):\n"
      "        pass\n"
      "with ctrun.section('save', untimed=True):\n"
      "    pass\n";
  const std::string python_path =
      "PYTHONPATH=" + SourceDir() + "/worker_lib/python";
  // Slot 1 registers its stacks; slot 0 has no stacks file.
  for (int slot : {0, 1}) {
    std::vector<std::string> env = {python_path,
                                    "CTRUN_PROGRESS_FILE=" + (*board)->path(),
                                    absl::StrCat("CTRUN_PROGRESS_SLOT=", slot)};
    if (slot == 1) env.push_back("CTRUN_STACKS_FILE=" + dir + "/stacks.txt");
    // Slot 1 also says it cannot leave a round it forms (progress::kStuck).
    ChildProcess p({"/usr/bin/python3", "-c",
                    slot == 1 ? code + "ctrun._mark_stuck(True)\n" : code},
                   env);
    INFO(p.Stderr());
    REQUIRE(p.Wait(absl::Seconds(60)) == 0);
  }
  const std::vector<ProgressSample> samples = (*board)->Read();
  for (const ProgressSample& s : samples) {
    CHECK(s.beats == 2);
    CHECK(s.events == 2 + 4 + 2);
    CHECK(s.sections_done == 2);  // outermost ones
    CHECK(s.busy > absl::ZeroDuration());
    CHECK(s.section.empty());
    CHECK_FALSE(s.untimed);
    CHECK(s.done);  // at exit
    CHECK(s.event_time > s.beat_time);
  }
  CHECK_FALSE(samples[0].stuck);
  CHECK(samples[1].stuck);
  CHECK_FALSE((*board)->StacksOf(0).on_signal);
  // The flags word itself: done, and nothing else, where no stacks were
  // registered.
  {
    std::ifstream raw((*board)->path(), std::ios::binary);
    raw.seekg(progress::kHeaderSize + offsetof(progress::Slot, flags));
    uint32_t flags = 0;
    raw.read(reinterpret_cast<char*>(&flags), sizeof flags);
    CHECK(flags == progress::kDone);
  }
  const StackDump dump = (*board)->StacksOf(1);
  CHECK(dump.on_signal);
  CHECK(dump.signal >= SIGRTMIN);
  CHECK(dump.signal <= SIGRTMAX);
  std::filesystem::remove_all(dir);
}

TEST_CASE("import ctrun outside ctrun does nothing and raises nothing",
          "[hang][e2e]") {
  const std::string code =
      "import ctrun\n"
      "assert not ctrun.reported()\n"
      "ctrun.heartbeat()\n"
      "with ctrun.section('step'):\n"
      "    ctrun.heartbeat()\n"
      "with ctrun.section('save', untimed=True):\n"
      "    pass\n"
      "ctrun.done()\n"
      "print('quiet', flush=True)\n";
  for (const std::string& board :
       {std::string(), std::string("CTRUN_PROGRESS_FILE=/nonexistent")}) {
    std::vector<std::string> env = {
        "PYTHONPATH=" + SourceDir() + "/worker_lib/python",
        "CTRUN_PROGRESS_SLOT=0"};
    if (!board.empty()) env.push_back(board);
    ChildProcess p({"/usr/bin/python3", "-c", code}, env);
    const std::string out = p.ReadAll(absl::Seconds(60));
    INFO(board << ": " << p.Stderr());
    CHECK(p.Wait(absl::Seconds(60)) == 0);
    CHECK(out == "quiet\n");
    CHECK(p.Stderr().empty());
  }
}

TEST_CASE("ctrun's sitecustomize runs the one it hides, as Python would have",
          "[hang][e2e]") {
  // A sitecustomize further along the path (as the system's is).
  const std::string dir = LogDir("sitecustomize");
  std::ofstream(dir + "/sitecustomize.py")
      << "import sys\nprint('the other sitecustomize ran', flush=True)\n";
  ChildProcess p({"/usr/bin/python3", "-c",
                  "import sys; print(sys.modules['sitecustomize'].__file__); "
                  "print('ctrun' in sys.modules)"},
                 {"PYTHONPATH=" + SourceDir() + "/worker_lib/python:" + dir});
  const std::string out = p.ReadAll(absl::Seconds(60));
  REQUIRE(p.Wait(absl::Seconds(10)) == 0);
  CHECK(out ==
        "the other sitecustomize ran\n" + dir + "/sitecustomize.py\nTrue\n");
  std::filesystem::remove_all(dir);
}

// Fails before: each copy of ctrun's sitecustomize passed over only its own
// folder, so the two copies of a ctrun run inside a ctrun worker chained to
// each other until Python's recursion limit, and the sitecustomize they
// hide never ran.
TEST_CASE(
    "Two copies of ctrun's sitecustomize on the path run the one they hide, "
    "once",
    "[hang][e2e]") {
  const std::string dir = LogDir("sitecustomize-twice");
  for (const char* copy : {"/outer", "/inner"}) {
    std::filesystem::copy(SourceDir() + "/worker_lib/python", dir + copy,
                          std::filesystem::copy_options::recursive);
  }
  std::filesystem::create_directories(dir + "/other");
  std::ofstream(dir + "/other/sitecustomize.py")
      << "print('the other sitecustomize ran', flush=True)\n";
  ChildProcess p({"/usr/bin/python3", "-c",
                  "import sys; print(sys.modules['sitecustomize'].__file__); "
                  "print('ctrun' in sys.modules)"},
                 {absl::StrCat("PYTHONPATH=", dir, "/outer:", dir,
                               "/inner:", dir, "/other")});
  const std::string out = p.ReadAll(absl::Seconds(60));
  INFO(p.Stderr());
  REQUIRE(p.Wait(absl::Seconds(10)) == 0);
  CHECK(out == "the other sitecustomize ran\n" + dir +
                   "/other/sitecustomize.py\nTrue\n");
  CHECK(p.Stderr().empty());

  // The real thing: ctrun inside a ctrun worker, whose Python worker has
  // both agents' copies on its path.
  std::ofstream(dir + "/inner.py")
      << "import os, sys\n"
         "print('inner', 'ctrun' in sys.modules, '.ctrun' in "
         "os.path.realpath(sys.modules['sitecustomize'].__file__), "
         "flush=True)\n";
  const auto [nested_out, nested_err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "--no_python",
       CtrunPath(), "--standalone", "--nproc_per_node=1", dir + "/inner.py"});
  INFO(nested_out << nested_err);
  CHECK(code == 0);
  CHECK(absl::StrContains(nested_out, "inner True False"));
  CHECK_FALSE(absl::StrContains(nested_err, "Error in sitecustomize"));
  CHECK_FALSE(absl::StrContains(nested_err, "RecursionError"));
  std::filesystem::remove_all(dir);
}

// Fails before: the version check took the slot and said done at its exit;
// train.py's hang was never seen (the job ended 0 after the sleep).
TEST_CASE(
    "A wrapper's short first Python command leaves hang detection on for "
    "the next",
    "[hang][e2e]") {
  const std::string dir = LogDir("wrapper");
  std::ofstream(dir + "/train.py") << "import time\n"
                                      "import ctrun\n"
                                      "ctrun.heartbeat()\n"
                                      "time.sleep(30)  # hung\n";
  const auto [out, err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "--hang_timeout=2",
       "--hang_warmup=0", "--hang_evidence_timeout=0", "--no_python", "/bin/sh",
       "-c",
       absl::StrCat(
           "/usr/bin/python3 -c 'import sys; print(sys.version_info[0])'; "
           "/usr/bin/python3 ",
           dir, "/train.py")});
  INFO(out << err);
  CHECK(absl::StrContains(out, "]: 3"));
  CHECK(code == 124);
  CHECK(absl::StrContains(err, "is hung: no progress for"));
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "A worker's spawned Python child leaves the worker's progress slot alone",
    "[hang][e2e]") {
  // The child imports ctrun (sitecustomize) and exits: its exit must not
  // say that the worker is done, or the worker's hang below goes unseen.
  const std::string dir = LogDir("spawn");
  std::ofstream(dir + "/spawn.py") << R"(
import multiprocessing, time
import ctrun

def child():
    pass

if __name__ == "__main__":
    ctrun.heartbeat()
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    ctrun.heartbeat()
    time.sleep(30)  # hung
)";
  const auto [out, err, code] = RunToEnd(
      {CtrunPath(), "--standalone", "--nproc_per_node=1", "--hang_timeout=2",
       "--hang_warmup=0", "--hang_evidence_timeout=0", dir + "/spawn.py"});
  INFO(out << err);
  CHECK(code == 124);
  CHECK(absl::StrContains(err, "is hung: no progress for"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ctrun::testing
