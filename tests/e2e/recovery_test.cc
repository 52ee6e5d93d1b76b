// Recovery with Debian's python3-torch on Gloo. In process
// (--recovery=inprocess): survivors keep their processes across a worker's
// death, a blocked survivor is brought back or restarted, and a lost node's
// peers continue in the shrunk world and grow back. Hot spares (--spares):
// a lost node's group rank goes to a spare, the world keeping its size.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/http_get.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(180);
const std::string kPython = "PYTHON_EXEC=/usr/bin/python3";

std::string Script() {
  return SourceDir() + "/tests/e2e/python/resilient_train.py";
}

// One (re)entry of the training function.
struct Entry {
  int rank;
  int pid;
  int world;
  int step;
};

std::vector<Entry> Entries(const std::string& out) {
  static const std::regex kEnter(
      "enter rank=([0-9]+) pid=([0-9]+) round=[0-9]+ world=([0-9]+) "
      "step=([0-9]+)");
  std::vector<Entry> entries;
  for (std::sregex_iterator it(out.begin(), out.end(), kEnter), end; it != end;
       ++it) {
    entries.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]),
                       std::stoi((*it)[3]), std::stoi((*it)[4])});
  }
  return entries;
}

// rank -> pid of its final line; the sums the ranks ended with.
std::map<int, int> Finals(const std::string& out, std::set<std::string>* sums) {
  static const std::regex kFinal(
      "final rank=([0-9]+) pid=([0-9]+) world=[0-9]+ sum=([0-9.]+)");
  std::map<int, int> pids;
  for (std::sregex_iterator it(out.begin(), out.end(), kFinal), end; it != end;
       ++it) {
    pids[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    sums->insert((*it)[3]);
  }
  return pids;
}

// The parameters' sum after `steps` steps of `world` ranks: each step adds
// 10 * step + rank from every rank to each of 8 values.
double ExpectedSum(int steps, int world) {
  double sum = 0;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) sum += 10.0 * s + r;
  }
  return 8 * sum;
}

std::vector<std::string> Launch(std::vector<std::string> flags) {
  std::vector<std::string> argv = {CtrunPath(), "--standalone",
                                   "--nproc_per_node=4", "--max_restarts=2",
                                   "--recovery=inprocess"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

TEST_CASE(
    "A worker killed under --recovery=inprocess is replaced, the others "
    "keeping their processes, and the result is exact",
    "[ctrun][e2e]") {
  const std::string events = std::filesystem::temp_directory_path() /
                             ("ctrun-inprocess-" + std::to_string(getpid()));
  std::vector<std::string> argv = Launch(
      {"--event_log=" + events, Script(), "--steps", "60", "--kill_rank", "1"});
  ChildProcess p(argv, {kPython});
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  REQUIRE(p.Wait(kWait) == 0);
  std::map<int, int> first;  // rank -> pid at the first entry
  for (const Entry& e : Entries(out)) first.try_emplace(e.rank, e.pid);
  std::set<std::string> sums;
  const std::map<int, int> last = Finals(out, &sums);
  REQUIRE(last.size() == 4);
  for (int rank : {0, 2, 3}) CHECK(last.at(rank) == first.at(rank));
  CHECK(last.at(1) != first.at(1));
  // Every rank ends with what an uninterrupted run computes.
  REQUIRE(sums.size() == 1);
  CHECK(std::stod(*sums.begin()) == ExpectedSum(60, 4));
  // The replacement resumed where the survivors were, not from 0.
  int resumed = 0;
  for (const Entry& e : Entries(out)) {
    if (e.rank == 1 && e.pid == last.at(1)) resumed = e.step;
  }
  CHECK(resumed == 20);
  const std::string err = p.Stderr();
  CHECK(err.find("the others keep running (--recovery=inprocess)") !=
        std::string::npos);
  // The world files go with the agent's folder: nothing to keep.
  CHECK(err.find("are kept in") == std::string::npos);
  CHECK(err.find("round 1: ranks 0,2,3 kept their processes; new process for "
                 "rank 1") != std::string::npos);
  // The replacement was forked from the template (torch preloaded), and the
  // round's parts are said and recorded.
  CHECK(std::regex_search(
      err, std::regex("round 1 recovered in [0-9.]+s from the failure: ranks "
                      "0,2,3 took the new world at [0-9.]+s, new process for "
                      "rank 1 up at [0-9.]+s \\(warm\\), process group "
                      "formed at [0-9.]+s, first step at [0-9.]+s")));
  std::ifstream in(events);
  const std::string log((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
  std::filesystem::remove(events);
  CHECK(log.find("\"event\":\"workers_kept\"") != std::string::npos);
  CHECK(log.find("\"event\":\"round_recovered\"") != std::string::npos);
  CHECK(log.find("\"detail\":\"warm\"") != std::string::npos);
}

// A job whose rank 1 kills itself at step 20 and whose replacement waits
// `start_delay` seconds before it forms its group; rank 2 is killed as the
// replacement prints `when`. Requires the job to end 0.
struct SecondKill {
  std::string out, err;
  std::map<int, int> first;  // rank -> pid at its first entry
  std::map<int, int> last;   // rank -> pid at its final line
  std::set<std::string> sums;
};

SecondKill KillRank2When(const std::string& start_delay,
                         const std::string& when) {
  SecondKill k;
  ChildProcess p(Launch({Script(), "--steps", "80", "--kill_rank", "1",
                         "--start_delay", start_delay}),
                 {kPython});
  while (auto line = p.ReadLine(kWait)) {
    k.out += *line + "\n";
    if (line->find(when) != std::string::npos) break;
  }
  for (const Entry& e : Entries(k.out)) k.first.try_emplace(e.rank, e.pid);
  REQUIRE(k.first.count(2));
  kill(k.first.at(2), SIGKILL);
  k.out += p.ReadAll(kWait);
  k.err = p.Stderr();
  INFO(k.err << k.out);
  REQUIRE(p.Wait(kWait) == 0);
  k.last = Finals(k.out, &k.sums);
  REQUIRE(k.last.size() == 4);
  REQUIRE(k.sums.size() == 1);
  CHECK(std::stod(*k.sums.begin()) == ExpectedSum(80, 4));
  CHECK(k.err.find("round 2: ranks 0,1,3 kept their processes; new process "
                   "for rank 2") != std::string::npos);
  return k;
}

// Fails before: the replacement had not reached ctrun.resilient when rank
// 2 died, so every process was restarted and the replacement was blamed.
TEST_CASE(
    "A second kill while the replacement still starts opens the next round "
    "in process, the replacement kept",
    "[ctrun][e2e]") {
  const SecondKill k = KillRank2When("4", "starting pid=");  // it sleeps
  INFO(k.err << k.out);
  for (int rank : {0, 3}) CHECK(k.last.at(rank) == k.first.at(rank));
  // Rank 1's replacement was kept into round 2: the process that was
  // asleep at the second kill ends the job.
  static const std::regex kStarting("starting pid=([0-9]+) round=1");
  std::smatch m;
  REQUIRE(std::regex_search(k.out, m, kStarting));
  CHECK(k.last.at(1) == std::stoi(m[1]));
  CHECK(k.last.at(2) != k.first.at(2));
  CHECK(k.err.find("does not run under ctrun.resilient") == std::string::npos);
  CHECK(k.err.find("restarting the workers") == std::string::npos);
}

// Fails before: the ranks forming round 1's group met round 2's store on
// the same MASTER_PORT (keys of the wrong round: a refused connection, a
// broken pipe), the replacement's init_process_group was beyond
// ctrun.resilient's reach (its error ended the job), and a survivor
// blocked in Gloo's connect waited out --recovery_timeout, after which the
// round ended as a hang.
TEST_CASE(
    "A second kill while the replacement forms its group opens the next "
    "round in process, and the job ends exact",
    "[ctrun][e2e]") {
  // The replacement enters init_process_group as rank 2 dies.
  const SecondKill k = KillRank2When("1", "forming pid=");
  INFO(k.err << k.out);
  CHECK(k.err.find("no restart left") == std::string::npos);
  CHECK(k.err.find("--recovery_timeout") == std::string::npos);
}

// Fails before: after "new process for rank 1" nothing was said while every
// rank waited in Gloo (30 minutes by default); "recovered" meant only that
// the group formed.
TEST_CASE(
    "A round whose ranks never step again is named within "
    "--recovery_timeout, with their stacks, and ends as a hang",
    "[ctrun][e2e]") {
  ChildProcess p(
      {CtrunPath(), "--standalone", "--nproc_per_node=3", "--max_restarts=2",
       "--recovery=inprocess", "--recovery_timeout=5",
       SourceDir() + "/tests/e2e/python/ddp_rebuilt.py"},
      {kPython});
  const std::string out = p.ReadAll(kWait);
  const std::string err = p.Stderr();
  INFO(out << err);
  CHECK(p.Wait(kWait) == 0);
  CHECK(err.find("round 1 has not recovered within 5s (--recovery_timeout): "
                 "ranks 0,1,2 have not stepped since the process group "
                 "formed. Most often a collective that only some ranks "
                 "make") != std::string::npos);
  CHECK(err.find("round 1 recovered") == std::string::npos);
  CHECK(std::regex_search(err, std::regex("evidence in .*hang_round_1")));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(out.find(absl::StrCat("done ", rank)) != std::string::npos);
  }
}

TEST_CASE(
    "A survivor asleep or busy in Python is brought back, and one that "
    "ignores the release is restarted and the agent says so",
    "[ctrun][e2e]") {
  for (const char* block : {"sleep", "loop", "ignore"}) {
    DYNAMIC_SECTION(block) {
      ChildProcess p(
          Launch({"--recovery_timeout=3", Script(), "--steps", "40",
                  "--kill_rank", "1", "--block", block, "--block_rank", "3"}),
          {kPython});
      const std::string out = p.ReadAll(kWait);
      INFO(out << p.Stderr());
      REQUIRE(p.Wait(kWait) == 0);
      std::map<int, int> first;
      for (const Entry& e : Entries(out)) first.try_emplace(e.rank, e.pid);
      std::set<std::string> sums;
      const std::map<int, int> last = Finals(out, &sums);
      REQUIRE(last.size() == 4);
      REQUIRE(sums.size() == 1);
      CHECK(std::stod(*sums.begin()) == ExpectedSum(40, 4));
      const bool restarted =
          p.Stderr().find(
              "worker rank 3 (local 3, pid " + std::to_string(first.at(3)) +
              ") did not take round 1's world within 3s") != std::string::npos;
      if (std::string(block) != "ignore") {
        CHECK(last.at(3) == first.at(3));
        CHECK_FALSE(restarted);
      } else {
        CHECK(last.at(3) != first.at(3));
        CHECK(restarted);
      }
    }
  }
}

// What `ctrun status` shows of the job, once it contains `needle` (or
// after 30 s).
std::string StatusShowing(const Daemon& daemon, const std::string& job,
                          const std::string& needle) {
  std::string shown;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end && shown.find(needle) == std::string::npos) {
    ChildProcess status({CtrunPath(), "status",
                         "--rdzv_endpoint=" + daemon.endpoint(),
                         "--rdzv_id=" + job});
    shown = status.ReadAll(kWait);
    status.Wait(kWait);
    absl::SleepFor(absl::Milliseconds(100));
  }
  return shown;
}

TEST_CASE(
    "A lost node's peers keep their processes in the shrunk world and "
    "grow back when a node joins",
    "[multinode][e2e]") {
  auto metrics_port = BindFreePort("127.0.0.1");
  REQUIRE(metrics_port.ok());
  Daemon daemon({absl::StrCat("--metrics-listen=127.0.0.1:", *metrics_port)});
  const std::vector<std::string> flags = {
      "--nnodes=1:2",         "--nproc_per_node=2",
      "--rdzv_backend=c10d",  "--rdzv_endpoint=" + daemon.endpoint(),
      "--rdzv_id=inprocess",  "--rdzv_conf=last_call_timeout=1",
      "--recovery=inprocess", "--max_restarts=3"};
  auto node = [&](int n) {
    std::vector<std::string> argv = {CtrunPath(),
                                     absl::StrCat("--local_addr=127.0.0.", n)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {Script(), "--steps", "700"});
    return std::make_unique<ChildProcess>(argv, std::vector{kPython});
  };
  auto a = node(2);
  auto b = node(3);
  // a's two workers in the world of 4, and their pids.
  std::map<int, int> pids;  // rank -> pid
  for (int i = 0; i < 2; ++i) {
    auto line = a->WaitForLine("world=4", kWait);
    INFO(a->Stderr() << b->Stderr());
    REQUIRE(line);
    const std::vector<Entry> e = Entries(*line);
    REQUIRE(e.size() == 1);
    pids[e[0].rank] = e[0].pid;
  }
  auto kept = [&](int pid) {
    return std::count_if(pids.begin(), pids.end(),
                         [&](const auto& rp) { return rp.second == pid; }) == 1;
  };
  // a's two workers enter a world of `world`, in the processes they had.
  auto a_enters_kept = [&](int world) {
    for (int i = 0; i < 2; ++i) {
      auto line = a->WaitForLine(absl::StrCat("world=", world), kWait);
      REQUIRE(line);
      const std::vector<Entry> e = Entries(*line);
      REQUIRE(e.size() == 1);
      CHECK(kept(e[0].pid));
    }
  };
  REQUIRE(b->WaitForLine("world=4", kWait));
  ::kill(b->pid(), SIGKILL);  // the agent alone; its watchdog ends its workers
  CHECK(b->Wait(kWait) == 128 + SIGKILL);
  a_enters_kept(2);
  // The rendezvous shows the node's kept processes and its recovery.
  {
    const std::string shown =
        StatusShowing(daemon, "inprocess", "every rank back in");
    INFO(shown);
    CHECK(std::regex_search(
        shown, std::regex("in-process: [^ ]+ kept 2 of 2 processes, every "
                          "rank back in [0-9.]+s")));
    auto metrics = HttpGet("127.0.0.1", *metrics_port, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->find("ctrund_workers_kept_total 2") != std::string::npos);
    CHECK(metrics->find("ctrund_inprocess_recovery_seconds_count 1") !=
          std::string::npos);
  }
  auto c = node(4);
  a_enters_kept(4);
  const std::string rest = a->ReadAll(kWait);
  INFO(rest << a->Stderr() << c->Stderr());
  CHECK(a->Wait(kWait) == 0);
  c->ReadAll(kWait);
  CHECK(c->Wait(kWait) == 0);
  std::set<std::string> sums;
  const std::map<int, int> finals = Finals(rest, &sums);
  for (const auto& [rank, pid] : finals) CHECK(kept(pid));
  CHECK(a->Stderr().find("was lost") != std::string::npos);
  CHECK(a->Stderr().find("the live workers keep their processes") !=
        std::string::npos);
}

TEST_CASE(
    "A hot spare takes a lost node's group rank: the world and every other "
    "rank stay, and the job ends as if uninterrupted",
    "[multinode][e2e][spares]") {
  auto metrics_port = BindFreePort("127.0.0.1");
  REQUIRE(metrics_port.ok());
  Daemon daemon({absl::StrCat("--metrics-listen=127.0.0.1:", *metrics_port)});
  const std::string checkpoint =
      std::filesystem::temp_directory_path() /
      ("ctrun-spares-" + std::to_string(getpid()) + ".pt");
  constexpr int kSteps = 500;
  auto node = [&](int n) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=3",
            "--nproc_per_node=1", "--spares=1", "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=spares",
            "--max_restarts=2", Script(), "--steps", absl::StrCat(kSteps),
            "--checkpoint", checkpoint},
        std::vector{kPython});
  };
  std::vector<std::unique_ptr<ChildProcess>> active;
  for (int n : {2, 3, 4}) active.push_back(node(n));
  // Which agent holds which rank (one worker each: rank = group rank).
  std::map<int, ChildProcess*> by_rank;
  for (auto& a : active) {
    auto line = a->WaitForLine("enter rank=", kWait);
    INFO(a->Stderr());
    REQUIRE(line);
    const std::vector<Entry> e = Entries(*line);
    REQUIRE(e.size() == 1);
    CHECK(e[0].world == 3);
    by_rank[e[0].rank] = a.get();
  }
  REQUIRE(by_rank.size() == 3);
  auto spare = node(5);
  REQUIRE(spare->StderrContains(
      "this node is a spare of job 'spares' (its 3 nodes run): it holds no "
      "rank and takes the slot of a node that is lost",
      kWait));
  // The script calls ctrun.wait_for_slot(): its worker starts now, parked
  // without a rank.
  const std::optional<std::string> parked =
      spare->WaitForLine("parked pid=", kWait);
  REQUIRE(parked);
  std::smatch parked_pid;
  REQUIRE(std::regex_search(*parked, parked_pid,
                            std::regex("parked pid=([0-9]+) rank=none")));
  {
    const std::string shown = StatusShowing(daemon, "spares", " spare ");
    INFO(shown);
    CHECK(shown.find("(min 3, max 3, spares 1)") != std::string::npos);
    CHECK(std::regex_search(shown, std::regex("\\n  -  +[^ ]+ +127\\.0\\.0\\.5 "
                                              "+[0-9]+ +spare ")));
    auto metrics = HttpGet("127.0.0.1", *metrics_port, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->find("ctrund_nodes{state=\"spare\"} 1") !=
          std::string::npos);
  }
  ChildProcess* victim = by_rank[1];
  ::kill(victim->pid(), SIGKILL);  // the agent; its watchdog ends its worker
  CHECK(victim->Wait(kWait) == 128 + SIGKILL);
  // The spare's worker enters as rank 1 of the same world.
  auto line = spare->WaitForLine("enter rank=", kWait);
  REQUIRE(line);
  std::vector<Entry> e = Entries(*line);
  REQUIRE(e.size() == 1);
  CHECK(e[0].rank == 1);
  CHECK(e[0].world == 3);
  CHECK(e[0].pid == std::stoi(parked_pid[1]));  // the parked process
  // The job's round, as in every other worker (a lost node spends no
  // restart: TORCHELASTIC_RESTART_COUNT stays 0). Fails before: 0.
  CHECK(line->find(" round=1 ") != std::string::npos);
  CHECK(spare->StderrContains("this spare takes group rank 1, the slot of",
                              absl::Seconds(1)));
  CHECK(spare->StderrContains("its parked worker takes rank 1",
                              absl::Seconds(1)));
  // Every other node keeps its rank in the new round.
  for (int rank : {0, 2}) {
    auto again = by_rank[rank]->WaitForLine("enter rank=", kWait);
    REQUIRE(again);
    e = Entries(*again);
    REQUIRE(e.size() == 1);
    CHECK(e[0].rank == rank);
    CHECK(e[0].world == 3);
  }
  {
    const std::string shown =
        StatusShowing(daemon, "spares", "took group rank 1 of");
    INFO(shown);
    CHECK(std::regex_search(
        shown, std::regex("spare: [^ ]+ took group rank 1 of [^ ]+")));
    auto metrics = HttpGet("127.0.0.1", *metrics_port, "/metrics");
    REQUIRE(metrics.ok());
    CHECK(metrics->find("ctrund_spares_promoted_total 1") != std::string::npos);
  }
  // The same parameters as a run without the loss: the world kept its size
  // and the job resumed from its checkpoint.
  std::set<std::string> sums;
  for (ChildProcess* p : {by_rank[0], by_rank[2], spare.get()}) {
    const std::string rest = p->ReadAll(kWait);
    INFO(rest << p->Stderr());
    CHECK(p->Wait(kWait) == 0);
    Finals(rest, &sums);
  }
  std::filesystem::remove(checkpoint);
  CHECK(sums ==
        std::set<std::string>{absl::StrFormat("%.1f", ExpectedSum(kSteps, 3))});
}

}  // namespace
}  // namespace ctrun::testing
