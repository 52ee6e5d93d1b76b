// ctrun inside a real Slurm (Debian's slurmctld/slurmd with munge, two nodes
// emulated on this machine): `srun ctrun` with no rendezvous flags, a
// PyTorch job, the batch step, exit codes and signals.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/support/daemon.h"
#include "tests/support/slurm_cluster.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kJobTime = absl::Seconds(120);

std::string Worker() { return SourceDir() + "/tests/support/shell_worker.sh"; }

// One agent per node (srun), this build's ctrun with `flags`, running the
// shell worker with `worker_args`.
std::string SrunCtrunWorker(const std::string& flags,
                            const std::string& worker_args) {
  return absl::StrCat("srun --ntasks-per-node=1 ", CtrunPath(), " ", flags,
                      " --no_python ", Worker(), " ", worker_args);
}

// A batch script: #SBATCH lines from `sbatch_options`, then `body`.
std::string Script(const std::vector<std::string>& sbatch_options,
                   const std::string& body) {
  std::string s = "#!/bin/sh\n";
  for (const auto& o : sbatch_options) absl::StrAppend(&s, "#SBATCH ", o, "\n");
  return absl::StrCat(s, body, "\n");
}

std::string OutDir(const SlurmCluster& cluster, const std::string& name) {
  const std::string dir = cluster.work_dir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

std::map<std::string, std::string> ReadEnvFile(const std::string& path) {
  std::map<std::string, std::string> env;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

bool WaitForFiles(const std::vector<std::string>& paths,
                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const auto& p : paths) {
    while (!std::filesystem::exists(p)) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return true;
}

TEST_CASE(
    "srun ctrun with nproc_per_node=gpu runs a worker per GPU on two nodes",
    "[slurm][e2e]") {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "env");
  auto job = cluster.Submit(
      "gpus",
      Script({"-N 2", "--gpus-per-node=2", "-t 5"},
             SrunCtrunWorker(
                 "--nproc_per_node=gpu",
                 absl::StrCat("env ", out, " ", WorkerProbePath(), " store"))));
  const auto code = cluster.Wait(job, kJobTime);
  const std::string output = cluster.Output(job);
  INFO(output);
  REQUIRE(code == 0);
  // worker_lib's store works, authenticated by munge like the agents.
  for (int r = 0; r < 4; ++r) {
    CHECK(output.find(absl::StrCat("ok store rank=", r)) != std::string::npos);
  }

  std::set<int> ranks;
  for (int r = 0; r < 4; ++r) {
    auto env = ReadEnvFile(absl::StrCat(out, "/env.", r));
    INFO("rank " << r);
    REQUIRE(env.count("RANK"));
    ranks.insert(std::stoi(env["RANK"]));
    CHECK(env["WORLD_SIZE"] == "4");
    CHECK(env["LOCAL_WORLD_SIZE"] == "2");
    CHECK(env["GROUP_WORLD_SIZE"] == "2");
    // The node that Slurm numbers 0 is group rank 0, and holds ranks 0-1.
    CHECK(env["GROUP_RANK"] == env["SLURM_NODEID"]);
    CHECK(env["GROUP_RANK"] == (r < 2 ? "0" : "1"));
    CHECK(env["SLURMD_NODENAME"] == (r < 2 ? "ctn1" : "ctn2"));
    CHECK(env["LOCAL_RANK"] == std::to_string(r % 2));
    CHECK(env["TORCHELASTIC_RUN_ID"] == absl::StrCat("slurm-", job.id, ".0"));
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    CHECK(env["CTRUN_STORE_AUTH"] == "munge");
    CHECK(env.count("CTRUN_STORE_TOKEN") == 0);
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
}

// One of the sbatch examples in scripts/slurm/, its srun line running this
// build's ctrun and the PyTorch DDP example instead of "ctrun" and
// "train.py".
std::string ExampleScript(const std::string& name) {
  std::ifstream in(SourceDir() + "/scripts/slurm/" + name);
  REQUIRE(in);
  std::string script;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("srun ", 0) == 0) {
      line = absl::StrReplaceAll(
          line, {{" ctrun ", absl::StrCat(" ", CtrunPath(), " ")},
                 {" train.py ",
                  absl::StrCat(" ", SourceDir(), "/examples/ddp_train.py ")}});
    }
    absl::StrAppend(&script, line, "\n");
  }
  return script;
}

// What the examples ask for, scaled to this machine's emulated nodes.
const std::vector<std::string> kSmallNodes = {"--gpus-per-node=2",
                                              "--cpus-per-task=1", "-t", "5"};
const std::vector<std::string> kPython = {"PYTHON_EXEC=/usr/bin/python3"};

TEST_CASE("The single-node sbatch example trains PyTorch DDP", "[slurm][e2e]") {
  SlurmCluster cluster;
  auto job = cluster.Submit("single", ExampleScript("single-node.sbatch"),
                            kPython, kSmallNodes);
  const auto code = cluster.Wait(job, absl::Seconds(240));
  const std::string output = cluster.Output(job);
  INFO(output);
  REQUIRE(code == 0);
  for (int r = 0; r < 2; ++r) {
    CHECK(output.find(absl::StrCat("rank=", r, " world=2 restart=0")) !=
          std::string::npos);
  }
}

TEST_CASE("The multi-node sbatch example trains PyTorch DDP on two nodes",
          "[slurm][e2e]") {
  SlurmCluster cluster;
  auto job = cluster.Submit("multi", ExampleScript("multi-node.sbatch"),
                            kPython, kSmallNodes);
  const auto code = cluster.Wait(job, absl::Seconds(240));
  const std::string output = cluster.Output(job);
  INFO(output);
  REQUIRE(code == 0);
  std::set<std::string> digests;
  const std::regex final_line(
      "final step=[0-9]+ loss=[0-9.]+ params_sha256=([0-9a-f]{64}) rank=[0-3] "
      "world=4 restart=0");
  int finals = 0;
  for (std::sregex_iterator it(output.begin(), output.end(), final_line), end;
       it != end; ++it, ++finals) {
    digests.insert((*it)[1]);
  }
  CHECK(finals == 4);
  CHECK(digests.size() == 1);  // every rank holds the same parameters
}

TEST_CASE(
    "ctrun in the batch step of a two-node allocation shows the srun line",
    "[slurm][e2e]") {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "batch");
  auto job = cluster.Submit(
      "batch",
      Script({"-N 2", "-t 5"},
             absl::StrCat(CtrunPath(), " --nproc_per_node=1 --no_python ",
                          Worker(), " env ", out)));
  const auto code = cluster.Wait(job, kJobTime);
  const std::string output = cluster.Output(job);
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("srun --ntasks-per-node=1 ") != std::string::npos);
  // Never a silent single-node run.
  CHECK(std::filesystem::is_empty(out));
}

TEST_CASE(
    "ctrun status in the batch script needs no flags and shows the step "
    "that trains",
    "[slurm][e2e]") {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "status");
  // Rank 2 fails once; the next round runs until the script says go, after
  // asking ctrun status from the batch step (on the first node).
  const std::string body = absl::StrCat(
      SrunCtrunWorker("--nproc_per_node=2 --max_restarts=1",
                      absl::StrCat("flaky ", out, " 2 9")),
      " &\n", "i=0\nwhile [ $i -lt 600 ] && ! [ -e ", out,
      "/ready.3 ]; do sleep 0.1; i=$((i + 1)); done\n", CtrunPath(),
      " status > ", out, "/status.txt 2>&1; echo $? > ", out, "/status.code\n",
      "touch ", out, "/go\nwait\n");
  auto job = cluster.Submit("status", Script({"-N 2", "-t 5"}, body));
  const auto code = cluster.Wait(job, kJobTime);
  INFO(cluster.Output(job));
  CHECK(code == 0);
  std::ifstream status_code(out + "/status.code");
  int status_exit = -1;
  status_code >> status_exit;
  std::stringstream shown;
  shown << std::ifstream(out + "/status.txt").rdbuf();
  INFO(shown.str());
  CHECK(status_exit == 0);
  CHECK(shown.str().find(absl::StrCat("job slurm-", job.id,
                                      ".0  running  round 1  nodes 2")) !=
        std::string::npos);
  CHECK(shown.str().find("restarts 1/1") != std::string::npos);
  CHECK(shown.str().find("last restart: round 1, worker_failed: worker rank "
                         "2 (local 0) on ") != std::string::npos);
  CHECK(CountMatches(shown.str(), " active ") == 2);
}

TEST_CASE("srun on N+1 nodes with --spares=1 runs N and keeps the last spare",
          "[slurm][e2e][spares]") {
  // (Two test nodes: the spare cannot be shown taking a slot here, since
  // the one active node also hosts the step's rendezvous; the promotion
  // itself is tested with a ctrund, in recovery_test.cc.)
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "spares");
  const std::string body = absl::StrCat(
      SrunCtrunWorker("--nproc_per_node=1 --spares=1",
                      absl::StrCat("env ", out, " ", Worker(), " wait ", out)),
      " &\n", "i=0\nwhile [ $i -lt 600 ]; do ", CtrunPath(), " status > ", out,
      "/status.txt 2>&1; grep -q ' spare ' ", out,
      "/status.txt && break; sleep 0.1; i=$((i + 1)); done\ntouch ", out,
      "/go\nwait\n");
  auto job = cluster.Submit("spares", Script({"-N 2", "-t 5"}, body));
  const auto code = cluster.Wait(job, kJobTime);
  const std::string output = cluster.Output(job);
  INFO(output);
  CHECK(code == 0);
  std::stringstream shown;
  shown << std::ifstream(out + "/status.txt").rdbuf();
  INFO(shown.str());
  CHECK(shown.str().find("(min 1, max 1, spares 1)  world 1") !=
        std::string::npos);
  CHECK(CountMatches(shown.str(), " active ") == 1);
  CHECK(CountMatches(shown.str(), " spare ") == 1);
  CHECK(output.find("this node is a spare of job 'slurm-" + job.id +
                    ".0' (its 1 node runs)") != std::string::npos);
  CHECK(output.find("the job finished without this node") != std::string::npos);
  const auto env = ReadEnvFile(out + "/env.0");
  CHECK(env.at("WORLD_SIZE") == "1");
  CHECK(env.at("GROUP_RANK") == "0");
  CHECK_FALSE(std::filesystem::exists(out + "/env.1"));
}

TEST_CASE("A failing worker's exit code is the Slurm job's exit code",
          "[slurm][e2e]") {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "fail");
  auto job = cluster.Submit(
      "fail", Script({"-N 2", "-t 5"},
                     SrunCtrunWorker("--nproc_per_node=2",
                                     absl::StrCat("fail ", out, " 3 7"))));
  const auto code = cluster.Wait(job, kJobTime);
  const std::string output = cluster.Output(job);
  INFO(output);
  CHECK(code == 7);
  CHECK(output.find("exitcode   : 7") != std::string::npos);
}

// Starts a two-node job whose workers count `signal` (USR1, TERM), waits
// until all four run, and has `scancel` send it with `scancel_args`.
// Returns the job's exit code and checks each worker saw it exactly once.
std::optional<int> SignalJob(const std::string& signal,
                             const std::vector<std::string>& scancel_args) {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "signal");
  auto job = cluster.Submit(
      "signal",
      Script({"-N 2", "-t 5"},
             SrunCtrunWorker("--nproc_per_node=2",
                             absl::StrCat("signal ", out, " ", signal))));
  std::vector<std::string> ready;
  for (int r = 0; r < 4; ++r) ready.push_back(absl::StrCat(out, "/ready.", r));
  INFO(cluster.Output(job));
  REQUIRE(WaitForFiles(ready, kJobTime));
  std::vector<std::string> scancel = {"/usr/bin/scancel"};
  scancel.insert(scancel.end(), scancel_args.begin(), scancel_args.end());
  scancel.push_back(job.id);
  cluster.Command(scancel);
  const auto code = cluster.Wait(job, kJobTime);
  INFO(cluster.Output(job));
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(absl::StrCat(out, "/", signal, ".", r));
    int count = 0;
    in >> count;
    INFO("rank " << r);
    CHECK(count == 1);
  }
  return code;
}

TEST_CASE("SIGUSR1 sent through Slurm reaches every worker once",
          "[slurm][e2e]") {
  // The workers carry on, and the job succeeds.
  CHECK(SignalJob("USR1", {"--signal=USR1"}) == 0);
}

TEST_CASE("SIGTERM sent through Slurm reaches every worker once",
          "[slurm][e2e]") {
  // ctrun stops with the workers and says why in its exit code, 128 + 15.
  // (A plain scancel also signals srun, which then SIGKILLs the step at
  // once: graceful stops go to the step, as here or with --signal.)
  CHECK(SignalJob("TERM", {"--signal=TERM"}) == 143);
}

TEST_CASE(
    "SIGUSR1 through Slurm stops every rank of two nodes at one step, and "
    "the job is requeued",
    "[slurm][e2e]") {
  SlurmCluster cluster;
  const std::string out = OutDir(cluster, "preempt");
  // Python workers stepping at their own pace, each saying when it runs
  // (a file) and the step ctrun.should_stop() stopped it at.
  const std::string stepper = absl::StrCat(
      SourceDir(), "/tests/support/stop_stepper.py --ready_dir=", out);
  auto job = cluster.Submit(
      "preempt",
      Script({"-N 2", "-t 5"},
             absl::StrCat("srun --ntasks-per-node=1 ", CtrunPath(),
                          " --nproc_per_node=2 ", stepper)),
      kPython, {"--requeue"});
  std::vector<std::string> ready;
  for (int r = 0; r < 4; ++r) ready.push_back(absl::StrCat(out, "/ready.", r));
  INFO(cluster.Output(job));
  REQUIRE(WaitForFiles(ready, kJobTime));
  cluster.Command({"/usr/bin/scancel", "--signal=USR1", job.id});
  // Requeued: pending again (Slurm holds a requeued job back until its
  // old credentials expire, minutes here; its next run is not waited for).
  std::string state;
  const absl::Time deadline = absl::Now() + kJobTime;
  while (absl::Now() < deadline) {
    // sbatch --wait ending means the job ended without a requeue.
    const bool ended = cluster.Wait(job, absl::Milliseconds(200)).has_value();
    state =
        cluster.TryCommand({"/usr/bin/scontrol", "show", "job", "-o", job.id})
            .value_or(state);
    if (ended || (state.find("Restarts=1") != std::string::npos &&
                  state.find("JobState=RUNNING") == std::string::npos &&
                  state.find("JobState=COMPLETING") == std::string::npos)) {
      break;
    }
  }
  const std::string output = cluster.Output(job);
  INFO(output << "\n" << state);
  CHECK(state.find("Restarts=1") != std::string::npos);
  CHECK(state.find("JobState=PENDING") != std::string::npos);
  std::set<std::string> steps, ranks;
  const std::regex line("stop rank=([0-3]) step=([0-9]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end;
       it != end; ++it) {
    ranks.insert((*it)[1]);
    steps.insert((*it)[2]);
  }
  CHECK(ranks.size() == 4);
  CHECK(steps.size() == 1);
  CHECK(output.find("ctrun: requeueing Slurm job " + job.id) !=
        std::string::npos);
}

}  // namespace
}  // namespace ctrun::testing
