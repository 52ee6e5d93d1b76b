// libctrun_worker in real workers under the real ctrun: the store
// contract, the NCCL unique-id exchange (on CPU), Gloo all-reduce, and the
// train example with and without an interruption.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(120);

struct Run {
  std::string out;
  std::string err;
  int code;
};

Run Launch(std::vector<std::string> args) {
  std::vector<std::string> argv = {CtrunPath(), "--standalone"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess p(argv);
  Run r;
  r.out = p.ReadAll(kWait);
  r.code = p.Wait(kWait).value_or(-1);
  r.err = p.Stderr();
  return r;
}

TEST_CASE("Workers read their identity and the store's scope",
          "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=2", WorkerProbePath(), "identity"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(CountMatches(r.out,
                     "ok identity rank=[01] local=[01] world=2 round=0 "
                     "job=ctrun-[0-9a-f]+ node=127.0.0.1") == 2);
}

TEST_CASE("Outside ctrun a worker says it was not started by ctrun",
          "[worker][integration]") {
  ChildProcess p({WorkerProbePath(), "store"});
  CHECK(p.Wait(kWait) == 2);
  CHECK(p.Stderr().find("not started by ctrun") != std::string::npos);
}

TEST_CASE("The store client honours the store contract in real workers",
          "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=4", WorkerProbePath(), "store"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(CountMatches(r.out, "ok store rank=[0-3]") == 4);
}

TEST_CASE("A 128-byte NCCL unique id from rank 0 reaches every rank",
          "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=4", WorkerProbePath(), "nccl-id"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::smatch m;
  std::set<std::string> digests;
  std::regex line("ok nccl-id rank=[0-3] bytes=128 digest=([0-9a-f]+)");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end;
       it != end; ++it) {
    digests.insert((*it)[1]);
  }
  CHECK(CountMatches(r.out, "ok nccl-id") == 4);
  CHECK(digests.size() == 1);
}

TEST_CASE("A unique id of the wrong size is refused", "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=2", WorkerProbePath(), "nccl-id", "100"});
  CHECK(r.code != 0);
  CHECK(r.err.find("DATA_LOSS") != std::string::npos);
  CHECK(r.err.find("has 100 bytes; expected 128") != std::string::npos);
}

TEST_CASE("Workers of one node that would share a GPU are refused by name",
          "[worker][integration]") {
  auto r =
      Launch({"--nproc_per_node=3", WorkerProbePath(), "gpu-share", "same"});
  CHECK(r.code != 0);
  CHECK(CountMatches(r.err,
                     "LOCAL_RANK=[12] and LOCAL_RANK=[01] would both use "
                     "GPU 0000:3b:00.0") >= 1);
  auto own =
      Launch({"--nproc_per_node=3", WorkerProbePath(), "gpu-share", "own"});
  INFO(own.err);
  CHECK(own.code == 0);
  CHECK(CountMatches(own.out, "ok gpu-share rank=[0-2] gpu=gpu-[0-2]") == 3);
}

TEST_CASE(
    "C++ workers stepping at different speeds stop at one step on a "
    "preemption signal, with ctrun::ShouldStop",
    "[worker][integration]") {
  ChildProcess p({CtrunPath(), "--standalone", "--nproc_per_node=4",
                  WorkerProbePath(), "stop"});
  for (int i = 0; i < 4; ++i) REQUIRE(p.WaitForLine("ready rank=", kWait));
  p.Signal(SIGUSR2);
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  CHECK(p.Wait(kWait) == 0);
  std::set<std::string> steps;
  const std::regex line(
      "ok stop rank=[0-3] step=([0-9]+) why=SIGUSR2 to ctrun on ");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end;
       ++it) {
    steps.insert((*it)[1]);
  }
  CHECK(CountMatches(out, "ok stop rank=") == 4);
  CHECK(steps.size() == 1);
}

TEST_CASE("Four workers all-reduce with Gloo through the job's store",
          "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=4", WorkerProbePath(), "gloo"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(CountMatches(r.out, "ok gloo rank=[0-3] sum=10") == 4);
}

TEST_CASE(
    "A C++ worker keeps its process across a peer's death and "
    "all-reduces correctly in the new round",
    "[worker][integration]") {
  auto r =
      Launch({"--nproc_per_node=3", "--max_restarts=1", "--recovery=inprocess",
              WorkerProbePath(), "resilient", "40"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  // rank -> pid when it first entered, and at the end.
  std::map<std::string, std::string> first, last;
  std::regex enter("enter rank=([0-9]) pid=([0-9]+) world=3 step=0");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), enter), end;
       it != end; ++it) {
    first[(*it)[1]] = (*it)[2];
  }
  std::regex ok("ok resilient rank=([0-9]) pid=([0-9]+) world=3 sum=6");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), ok), end; it != end;
       ++it) {
    last[(*it)[1]] = (*it)[2];
  }
  REQUIRE(first.size() == 3);
  REQUIRE(last.size() == 3);
  CHECK(last["0"] == first["0"]);
  CHECK(last["2"] == first["2"]);
  CHECK(last["1"] != first["1"]);
  // The survivors resumed where they were, with the new rank 1.
  CHECK(CountMatches(r.out, "enter rank=[0-2] pid=[0-9]+ world=3 step=10") ==
        3);
  CHECK(r.err.find("round 1: ranks 0,2 kept their processes; new process for "
                   "rank 1") != std::string::npos);
}

std::set<std::string> Checksums(const std::string& out) {
  std::set<std::string> sums;
  std::regex line("final step=300 loss=([0-9.]+) params_sha256=([0-9a-f]{64})");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end;
       ++it) {
    sums.insert((*it)[2]);
  }
  return sums;
}

TEST_CASE("train converges with 4 workers and every rank ends equal",
          "[worker][integration]") {
  auto r = Launch({"--nproc_per_node=4", TrainPath(), "--steps", "300"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(CountMatches(r.out, "final step=300") == 4);
  CHECK(Checksums(r.out).size() == 1);
  std::smatch first, last;
  REQUIRE(std::regex_search(r.out, first, std::regex("step 1 loss ([0-9.]+)")));
  REQUIRE(std::regex_search(r.out, last,
                            std::regex("final step=300 loss=([0-9.]+)")));
  CHECK(std::stod(last[1]) < std::stod(first[1]) / 100);
}

TEST_CASE(
    "A worker killed mid-run resumes from the checkpoint to the same "
    "parameters",
    "[worker][integration]") {
  const std::string base = std::filesystem::temp_directory_path() /
                           ("ctrun-ckpt-" + std::to_string(getpid()));
  std::filesystem::create_directories(base + "/a");
  std::filesystem::create_directories(base + "/b");
  auto plain = Launch({"--nproc_per_node=4", TrainPath(), "--steps", "300",
                       "--checkpoint_dir", base + "/a"});
  REQUIRE(plain.code == 0);
  auto crashed = Launch({"--nproc_per_node=4", "--max_restarts=1", TrainPath(),
                         "--steps", "300", "--checkpoint_dir", base + "/b",
                         "--crash_at_step", "170", "--crash_rank", "2"});
  INFO(crashed.err);
  REQUIRE(crashed.code == 0);
  // Rank 2 dies; its peers may notice (and fail) first, so only the restart
  // itself is certain.
  CHECK(crashed.err.find("restarting the workers (round 1") !=
        std::string::npos);
  CHECK(crashed.out.find("resuming from step 160 (restart 1)") !=
        std::string::npos);
  const auto a = Checksums(plain.out);
  const auto b = Checksums(crashed.out);
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(*a.begin() == *b.begin());
  std::filesystem::remove_all(base);
}

TEST_CASE(
    "A spare's C++ workers park in WaitForSlot and take the lost node's rank",
    "[worker][integration][spares]") {
  Daemon daemon;
  auto node = [&](int n) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=1",
        "--nproc_per_node=2", "--spares=1", "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=park",
        WorkerProbePath(), "park", "30"});
  };
  auto active = node(2);
  REQUIRE(active->WaitForLine("slot rank=1 world=2", kWait));
  auto spare = node(3);
  std::set<std::string> parked;
  for (int i = 0; i < 2; ++i) {
    auto line = spare->WaitForLine("parked pid=", kWait);
    REQUIRE(line);
    std::smatch m;
    REQUIRE(std::regex_search(*line, m,
                              std::regex("parked pid=([0-9]+) rank=none")));
    parked.insert(m[1]);
  }
  ::kill(active->pid(), SIGKILL);
  CHECK(active->Wait(kWait) == 128 + SIGKILL);
  std::set<std::string> took;
  for (int i = 0; i < 2; ++i) {
    auto line = spare->WaitForLine("slot rank=", kWait);
    REQUIRE(line);
    std::smatch m;
    REQUIRE(std::regex_search(
        *line, m,
        std::regex("\\[[^:]+:([01])\\]: slot rank=([01]) world=2 "
                   "pid=([0-9]+)")));
    CHECK(m[1] == m[2]);  // the line carries the rank taken
    took.insert(m[3]);
  }
  CHECK(took == parked);  // the parked processes themselves
  INFO(spare->Stderr());
  CHECK(spare->StderrContains("its parked workers take ranks 0,1",
                              absl::Seconds(1)));
  spare->Signal(SIGTERM);
  CHECK(spare->Wait(kWait) == 128 + SIGTERM);
}

// Fails before: the spare of 1 worker was admitted, and promoted it would
// have turned the world of 2 into 1.
TEST_CASE("A spare with another --nproc_per_node is refused at its join",
          "[worker][integration][spares]") {
  Daemon daemon;
  auto node = [&](int n, int workers) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=1",
        absl::StrCat("--nproc_per_node=", workers), "--spares=1",
        "--rdzv_backend=c10d", "--rdzv_endpoint=" + daemon.endpoint(),
        "--rdzv_id=sizes", WorkerProbePath(), "park", "30"});
  };
  auto active = node(2, 2);
  REQUIRE(active->WaitForLine("slot rank=1 world=2", kWait));
  auto spare = node(3, 1);
  const std::optional<int> code = spare->Wait(kWait);
  INFO(spare->Stderr());
  CHECK(code.has_value());
  CHECK(code != 0);
  CHECK(spare->StderrContains(
      "job 'sizes' runs nodes of --nproc_per_node=2; a spare takes a lost "
      "node's ranks, so it needs as many workers as that node: this node has "
      "1",
      absl::Seconds(1)));
  active->Signal(SIGTERM);
  CHECK(active->Wait(kWait) == 128 + SIGTERM);
}

}  // namespace
}  // namespace ctrun::testing
