// ctrun with Debian's python3-torch (CPU, Gloo): real DDP training, a worker
// failing under @record, and the worker environment side by side with
// torchrun's.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"

extern char** environ;

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(180);
const std::string kPython = "PYTHON_EXEC=/usr/bin/python3";

std::string Example(const std::string& name) {
  return SourceDir() + "/examples/" + name;
}

TEST_CASE("A 4-worker PyTorch DDP training with Gloo runs under ctrun",
          "[ctrun][e2e]") {
  ChildProcess p({CtrunPath(), "--standalone", "--nproc_per_node=4",
                  Example("ddp_train.py"), "--steps", "150"},
                 {kPython});
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  REQUIRE(p.Wait(kWait) == 0);
  std::regex final_line(
      "final step=150 loss=([0-9.]+) params_sha256=([0-9a-f]{64}) rank=([0-3]) "
      "world=4 restart=0");
  std::set<std::string> digests, ranks;
  for (std::sregex_iterator it(out.begin(), out.end(), final_line), end;
       it != end; ++it) {
    CHECK(std::stod((*it)[1]) < 0.01);  // the loss fell
    digests.insert((*it)[2]);
    ranks.insert((*it)[3]);
  }
  CHECK(ranks.size() == 4);
  CHECK(digests.size() == 1);  // every rank holds the same parameters
  CHECK(out.find("step 1 loss") != std::string::npos);
}

TEST_CASE(
    "A worker raising under record produces the summary with its "
    "traceback",
    "[ctrun][e2e]") {
  ChildProcess p({CtrunPath(), "--standalone", "--nproc_per_node=2",
                  Example("ddp_train.py"), "--steps", "60", "--fail_rank", "1"},
                 {kPython});
  p.ReadAll(kWait);
  CHECK(p.Wait(kWait) == 1);
  const std::string err = p.Stderr();
  const size_t root = err.find("Root Cause (first observed failure)");
  REQUIRE(root != std::string::npos);
  CHECK(err.find("rank       : 1 (local_rank: 1)", root) != std::string::npos);
  CHECK(err.find("exitcode   : 1", root) != std::string::npos);
  CHECK(err.find("message    : RuntimeError: rank 1 fails on purpose", root) !=
        std::string::npos);
  CHECK(err.find("Traceback (most recent call last)", root) !=
        std::string::npos);
  CHECK(err.find("error.json", root) != std::string::npos);
}

TEST_CASE(
    "A job whose script never calls init_process_group is named once, and "
    "one that does is not",
    "[ctrun][e2e]") {
  const std::string script = SourceDir() + "/tests/e2e/python/pg_probe.py";
  const std::string said = "formed no process group within";
  // The forming run gets a wider window and outlives it: importing torch and
  // forming the group can take longer than 8 s on two loaded cores, and the
  // check must have run for "not named" to mean anything.
  struct Mode {
    const char* name;
    const char* window;
    const char* seconds;
  };
  std::map<std::string, std::unique_ptr<ChildProcess>> runs;
  for (const Mode& mode : {Mode{"none", "8", "12"}, Mode{"init", "20", "28"}}) {
    runs[mode.name] = std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CtrunPath(), "--standalone", "--nproc_per_node=2",
            absl::StrCat("--process_group_check=", mode.window), script,
            mode.name, mode.seconds},
        std::vector<std::string>{kPython});
  }
  for (auto& [mode, run] : runs) {
    run->ReadAll(absl::Seconds(120));
    INFO(mode << ": " << run->Stderr());
    CHECK(run->Wait(absl::Seconds(120)) == 0);  // said, never stopped
    const bool named = absl::StrContains(run->Stderr(), said);
    CHECK(named == (mode == "none"));
    if (mode == "none") {
      CHECK(absl::StrContains(
          run->Stderr(),
          "the job's 2 ranks formed no process group within 8s of their "
          "start: nothing listens on MASTER_PORT="));
    }
  }
}

TEST_CASE("PyTorch DDP trains across two nodes that meet at a ctrund",
          "[ctrun][e2e]") {
  Daemon daemon;
  auto node = [&](int n) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=2",
            "--nproc_per_node=2", "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=ddp-2n",
            Example("ddp_train.py"), "--steps", "150"},
        std::vector<std::string>{kPython});
  };
  auto a = node(2);
  auto b = node(3);
  const std::string out = a->ReadAll(kWait) + b->ReadAll(kWait);
  INFO(out << a->Stderr() << b->Stderr());
  REQUIRE(a->Wait(kWait) == 0);
  REQUIRE(b->Wait(kWait) == 0);
  std::regex final_line(
      "final step=150 loss=([0-9.]+) params_sha256=([0-9a-f]{64}) rank=([0-3]) "
      "world=4");
  std::set<std::string> digests, ranks;
  for (std::sregex_iterator it(out.begin(), out.end(), final_line), end;
       it != end; ++it) {
    digests.insert((*it)[2]);
    ranks.insert((*it)[3]);
  }
  CHECK(ranks.size() == 4);
  CHECK(digests.size() == 1);
}

// The worker environments a launcher gives env_dump.py, by RANK.
std::map<std::string, std::map<std::string, std::string>> DumpEnvs(
    std::vector<std::string> launcher, int workers, const std::string& dir) {
  std::vector<std::string> keys;
  for (char** e = environ; *e != nullptr; ++e) {
    keys.push_back(std::string(*e).substr(0, std::string(*e).find('=')));
  }
  keys.push_back("PYTHON_EXEC");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  launcher.push_back(SourceDir() + "/tests/e2e/env_dump.py");
  ChildProcess p(launcher, {kPython, "DUMP_DIR=" + dir,
                            "BASE_ENV_KEYS=" + absl::StrJoin(keys, ",")});
  p.ReadAll(kWait);
  INFO(p.Stderr());
  REQUIRE(p.Wait(kWait) == 0);
  std::map<std::string, std::map<std::string, std::string>> by_rank;
  for (int r = 0; r < workers; ++r) {
    std::ifstream in(absl::StrCat(dir, "/", r, ".json"));
    std::stringstream text;
    text << in.rdbuf();
    google::protobuf::Struct s;
    REQUIRE(google::protobuf::util::JsonStringToMessage(text.str(), &s).ok());
    for (const auto& [k, v] : s.fields()) {
      by_rank[absl::StrCat(r)][k] = v.string_value();
    }
  }
  return by_rank;
}

TEST_CASE("A port held by PyTorch's TCPStore is named as no ctrun rendezvous",
          "[ctrun][e2e]") {
  // A torchrun job's store (or a torchrun rendezvous) on the endpoint: a
  // job cannot mix torchrun and ctrun nodes, and ctrun says so in seconds
  // instead of waiting out the join timeout.
  auto port = BindFreePort("127.0.0.1");
  REQUIRE(port.ok());
  ChildProcess store({"/usr/bin/python3", "-c",
                      absl::StrCat("import time\n"
                                   "from torch.distributed import TCPStore\n"
                                   "s = TCPStore('127.0.0.1', ",
                                   *port,
                                   ", 1, True)\n"
                                   "print('up', flush=True)\n"
                                   "time.sleep(120)\n")});
  REQUIRE(store.WaitForLine("up", kWait));
  const absl::Time start = absl::Now();
  ChildProcess agent({CtrunPath(), "--nnodes=2", "--rdzv_backend=c10d",
                      absl::StrCat("--rdzv_endpoint=127.0.0.1:", *port),
                      "--rdzv_id=mixed", "/bin/true"});
  CHECK(agent.Wait(absl::Seconds(30)) == 1);
  CHECK(absl::Now() - start < absl::Seconds(15));
  CHECK(agent.Stderr().find("is it a ctrun rendezvous (a ctrund or a ctrun "
                            "agent: a job cannot mix torchrun and ctrun "
                            "nodes)") != std::string::npos);
  store.Signal(SIGKILL);
  store.Wait(kWait);
}

TEST_CASE("Workers see the same variables under ctrun and torchrun",
          "[ctrun][e2e]") {
  const std::string base = std::filesystem::temp_directory_path() /
                           ("ctrun-envdump-" + std::to_string(getpid()));
  auto torchrun =
      DumpEnvs({"/usr/bin/python3", SourceDir() + "/scripts/torchrun-compat.py",
                "--standalone", "--nproc_per_node=2", "--monitor_interval=0.1"},
               2, base + "/torchrun");
  auto ctrun = DumpEnvs({CtrunPath(), "--standalone", "--nproc_per_node=2"}, 2,
                        base + "/ctrun");
  REQUIRE(torchrun.size() == 2);
  REQUIRE(ctrun.size() == 2);
  // The comparison scripts/gpu-check.sh also makes against the GPU
  // machine's torchrun: what differs must be explained.
  ChildProcess diff({"/usr/bin/python3", SourceDir() + "/tests/e2e/env_diff.py",
                     base + "/torchrun", base + "/ctrun"});
  const std::string report = diff.ReadAll(kWait);
  INFO(report << diff.Stderr());
  CHECK(diff.Wait(kWait) == 0);
  CHECK(report.find("0 unexplained difference(s) over 2 rank(s)") !=
        std::string::npos);
  for (const auto& rank : {"0", "1"}) {
    INFO("RANK " << rank);
    CHECK(absl::EndsWith(ctrun.at(rank).at("PYTHONPATH"), "/.ctrun/python"));
    CHECK(ctrun.at(rank).at("MASTER_ADDR") == "127.0.0.1");
    CHECK(torchrun.at(rank).at("MASTER_ADDR") == "localhost");
  }
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace ctrun::testing
