// GpuWatch: the "only GPU 0 is busy" warning and each rank's GPU usage,
// from GPU readings on a fake clock.
#include "launcher/policy/gpu_watch.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);
constexpr uint64_t kMiB = 1 << 20;

GpuWatch Watch(std::vector<int> job_gpus) {
  GpuWatchConfig config;
  config.job_gpus = std::move(job_gpus);
  return GpuWatch(config);
}

// Four GPUs; `placement[lr]` is where local rank lr holds 1 GiB.
std::vector<GpuReading> Readings(const std::vector<int>& placement,
                                 std::vector<int> utilization = {90, 0, 0, 0}) {
  std::vector<GpuReading> gpus(4);
  for (int g = 0; g < 4; ++g) {
    gpus[g].gpu = g;
    gpus[g].utilization = utilization[g];
  }
  for (int lr = 0; lr < static_cast<int>(placement.size()); ++lr) {
    gpus[placement[lr]].bytes_by_local_rank[lr] = 1024 * kMiB;
  }
  return gpus;
}

TEST_CASE("Ranks all on GPU 0 with GPUs idle are named once",
          "[gpu_watch][unit]") {
  GpuWatch w = Watch({0, 1, 2, 3});
  w.Start(kStart, {4, 5, 6, 7});
  CHECK(w.NextDue() == kStart + absl::Seconds(2));
  // Start-up is not judged: the ranks may not have called set_device yet.
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(2), Readings({0, 0, 0, 0})));
  auto warning = w.Observe(kStart + absl::Seconds(6), Readings({0, 0, 0, 0}));
  REQUIRE(warning);
  CHECK(*warning ==
        "ranks 4-7 all run on GPU 0; GPUs 1-3 are idle \xE2\x80\x94 call "
        "torch.cuda.set_device(LOCAL_RANK) before any CUDA work");
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(8), Readings({0, 0, 0, 0})));
  w.Start(kStart + absl::Seconds(10), {4, 5, 6, 7});
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(20), Readings({0, 0, 0, 0})));
}

TEST_CASE("Ranks each on their own GPU are not named", "[gpu_watch][unit]") {
  GpuWatch w = Watch({0, 1, 2, 3});
  w.Start(kStart, {0, 1, 2, 3});
  auto gpus = Readings({0, 1, 2, 3}, {90, 91, 92, 93});
  // Every rank also created a context on GPU 0 before set_device.
  for (int lr = 1; lr < 4; ++lr) gpus[0].bytes_by_local_rank[lr] = 300 * kMiB;
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(6), gpus));
  RankGpuUsage u = w.UsageOf(2);
  CHECK(u.gpu == 2);
  CHECK(u.peak_bytes == 1324 * kMiB);
}

TEST_CASE("More ranks than GPUs share them without a warning",
          "[gpu_watch][unit]") {
  GpuWatch w = Watch({0, 1});
  w.Start(kStart, {0, 1, 2, 3});
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(6), Readings({0, 0, 1, 1})));
}

TEST_CASE("Two crowded GPUs and one idle GPU are all named",
          "[gpu_watch][unit]") {
  GpuWatch w = Watch({0, 1, 2});
  w.Start(kStart, {0, 1, 2});
  auto warning = w.Observe(kStart + absl::Seconds(6), Readings({0, 0, 1}));
  REQUIRE(warning);
  CHECK(warning->starts_with("ranks 0-1 all run on GPU 0; GPU 2 is idle"));
}

TEST_CASE("Unknown job GPUs name no idle GPU", "[gpu_watch][unit]") {
  GpuWatch w = Watch({});
  w.Start(kStart, {0, 1});
  CHECK_FALSE(w.Observe(kStart + absl::Seconds(6), Readings({0, 0})));
}

TEST_CASE("A rank's usage is its peak memory and its GPU's mean utilisation",
          "[gpu_watch][unit]") {
  GpuWatch w = Watch({0, 1});
  w.Start(kStart, {0, 1});
  CHECK(w.UsageOf(0).gpu == -1);
  auto first = Readings({0, 1}, {40, 10, 0, 0});
  first[0].bytes_by_local_rank[0] = 2048 * kMiB;
  w.Observe(kStart + absl::Seconds(2), first);
  w.Observe(kStart + absl::Seconds(4), Readings({0, 1}, {80, 20, 0, 0}));
  RankGpuUsage u = w.UsageOf(0);
  CHECK(u.gpu == 0);
  CHECK(u.peak_bytes == 2048 * kMiB);
  CHECK(u.mean_utilization == 60);
  CHECK(w.UsageOf(1).mean_utilization == 15);
  // A new round starts from nothing.
  w.Start(kStart + absl::Seconds(5), {0, 1});
  CHECK(w.UsageOf(0).peak_bytes == 0);
}

TEST_CASE("The end-of-job line names wall time, memory and the GPU",
          "[gpu_watch][unit]") {
  CHECK(RankUsageLine(3, absl::Seconds(72.345), 2254857830, {}) ==
        "rank 3: wall 1m12s, peak RSS 2.1 GiB");
  RankGpuUsage gpu{3, 31ULL << 30, 87};
  CHECK(RankUsageLine(3, absl::Seconds(5), 700 * 1024, gpu) ==
        "rank 3: wall 5.0s, peak RSS 700 KiB, GPU 3: peak memory 31.0 GiB, "
        "mean utilization 87%");
  gpu.mean_utilization = -1;
  CHECK(RankUsageLine(0, absl::Milliseconds(249), 3 << 20, gpu) ==
        "rank 0: wall 0.2s, peak RSS 3.0 MiB, GPU 3: peak memory 31.0 GiB");
}

TEST_CASE("A node's ranks end with one line: the spread of their figures",
          "[gpu_watch][unit]") {
  constexpr uint64_t kGiB = 1ULL << 30;
  std::vector<RankUsage> ranks = {
      {0, absl::Seconds(12), 2 * kGiB, {}},
      {1, absl::Seconds(12.5), 2 * kGiB + kGiB / 10, {}},
      {2, absl::Seconds(11), 2 * kGiB + kGiB / 5, {}},
      {3, absl::Seconds(12), 2 * kGiB + kGiB * 3 / 10, {}}};
  CHECK(NodeUsageLine(ranks) ==
        "ranks 0-3: wall 12.5s, peak RSS 2.0 GiB / 2.2 GiB / 2.3 GiB (min / "
        "median / max)");
  // With NVML: the GPU memory's spread, and the mean of the ranks' means
  // (a rank never seen on a GPU counts in neither).
  ranks[0].gpu = {0, 31 * kGiB, 80};
  ranks[1].gpu = {1, 32 * kGiB, 90};
  ranks[2].gpu = {2, 30 * kGiB, -1};
  CHECK(NodeUsageLine(ranks) ==
        "ranks 0-3: wall 12.5s, peak RSS 2.0 GiB / 2.2 GiB / 2.3 GiB (min / "
        "median / max), GPU peak memory 30.0 GiB / 31.0 GiB / 32.0 GiB, mean "
        "utilization 85%");
  // One rank keeps its own line.
  CHECK(NodeUsageLine({ranks[3]}) == "rank 3: wall 12.0s, peak RSS 2.3 GiB");
  CHECK(NodeUsageLine({}).empty());
}

TEST_CASE("Rank lists are written as ranges", "[gpu_watch][unit]") {
  CHECK(FormatRanges({3, 0, 1, 2}) == "0-3");
  CHECK(FormatRanges({0, 2, 5, 6, 7}) == "0,2,5-7");
  CHECK(FormatRanges({}).empty());
}

TEST_CASE("The job's GPUs follow CUDA_VISIBLE_DEVICES and the worker count",
          "[gpu_watch][unit]") {
  CHECK(JobGpus(nullptr, 8, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(JobGpus("4,5", 8, 4) == std::vector<int>{4, 5});
  CHECK(JobGpus("1,9,2", 8, 4) == std::vector<int>{1});
  CHECK(JobGpus("GPU-8a1c", 8, 4).empty());
  CHECK(JobGpus("", 8, 4).empty());
}

}  // namespace
}  // namespace ctrun
