// GPU checks, tagged [gpu]: hidden from the default suite, run by
// scripts/gpu-check.sh on a machine with NVIDIA GPUs.
#include <catch2/catch.hpp>
#include <regex>

#include "tests/support/child_process.h"
#include "tests/support/daemon.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(240);

TEST_CASE("NCCL all-reduce across one worker per GPU", "[.gpu][gpu]") {
  ChildProcess p({CtrunPath(), "--standalone", "--nproc_per_node=gpu",
                  WorkerProbePath(), "nccl"});
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  REQUIRE(p.Wait(kWait) == 0);
  CHECK(CountMatches(out, "ok nccl rank=[0-9]+ device=[0-9]+ sum=") >= 1);
}

TEST_CASE("train with NCCL converges on every GPU", "[.gpu][gpu]") {
  ChildProcess p({CtrunPath(), "--standalone", "--nproc_per_node=gpu",
                  TrainPath(), "--backend", "nccl", "--steps", "300"});
  const std::string out = p.ReadAll(kWait);
  INFO(out << p.Stderr());
  REQUIRE(p.Wait(kWait) == 0);
  CHECK(CountMatches(out, "final step=300 loss=[0-9.]+ params_sha256=") >= 1);
}

}  // namespace
}  // namespace ctrun::testing
