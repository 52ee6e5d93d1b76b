#include "launcher/policy/health_gate.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

TEST_CASE("The GPUs a node was given come from CUDA_VISIBLE_DEVICES or Slurm",
          "[health][unit]") {
  CHECK(GivenGpus("0,1,3", "8") == 3);
  CHECK(GivenGpus("", "8") == 0);
  CHECK(GivenGpus("GPU-3f2a,GPU-77c1", nullptr) == -1);  // UUIDs: not known
  CHECK(GivenGpus(nullptr, "4") == 4);
  CHECK(GivenGpus(nullptr, "x") == -1);
  CHECK(GivenGpus(nullptr, nullptr) == -1);
}

TEST_CASE(
    "GPUs are judged by count, ECC errors, retired pages and others' "
    "memory, every problem in one line",
    "[health][unit]") {
  std::vector<GpuHealth> gpus(4);
  for (int i = 0; i < 4; ++i) gpus[i].gpu = i;
  CHECK(JudgeGpus(4, 4, gpus).empty());
  CHECK(JudgeGpus(-1, 4, gpus).empty());
  // Unknown counts are no problem; a small context of another process
  // neither.
  gpus[1].uncorrected_ecc = 0;
  gpus[1].retired_pending = 0;
  gpus[2].processes = {{77, 300u << 20}};
  CHECK(JudgeGpus(4, 4, gpus).empty());

  CHECK(JudgeGpus(4, 3, gpus) ==
        "NVML sees 3 GPUs, fewer than the 4 this node was given");
  gpus[1].uncorrected_ecc = 5;
  gpus[3].retired_pending = 1;
  gpus[2].processes = {{4242, uint64_t{8} << 30}};
  CHECK(JudgeGpus(4, 4, gpus) ==
        "GPU 1 has 5 uncorrected ECC errors since boot; GPU 2 is held by "
        "another process (pid 4242, 8.0 GiB); GPU 3 has pages pending "
        "retirement (it needs a reset)");
}

}  // namespace
}  // namespace ctrun
