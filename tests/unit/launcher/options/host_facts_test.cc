// What the host has: GPUs, Intel GPUs.
#include "launcher/options/host_facts.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/options/command_line.h"

namespace ctrun {
namespace {

TEST_CASE("GPUs are counted from CUDA_VISIBLE_DEVICES or the driver",
          "[launcher][unit]") {
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "0,1,3"}}).gpu_count == 3);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", ""}}).gpu_count == 0);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "-1"}}).gpu_count == 0);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "0,-1,2"}}).gpu_count == 1);
  const std::string root = std::filesystem::temp_directory_path() /
                           ("ctrun-gpus-" + std::to_string(getpid()));
  std::filesystem::create_directories(root + "/proc/driver/nvidia/gpus/a");
  std::filesystem::create_directories(root + "/proc/driver/nvidia/gpus/b");
  CHECK(DetectHostFacts({}, root).gpu_count == 2);
  std::filesystem::remove_all(root);
  CHECK(DetectHostFacts({}).cpu_count >= 1);
}

TEST_CASE("Intel GPUs are counted from ZE_AFFINITY_MASK or the render nodes",
          "[launcher][unit]") {
  CHECK(DetectHostFacts({{"ZE_AFFINITY_MASK", "0,1.0,2"}}).xpu_count == 3);
  CHECK(DetectHostFacts({{"ZE_AFFINITY_MASK", ""}}).xpu_count == 0);
  const std::string root = std::filesystem::temp_directory_path() /
                           ("ctrun-xpus-" + std::to_string(getpid()));
  for (auto [node, vendor] :
       {std::pair{"renderD128", "0x8086"}, std::pair{"renderD129", "0x8086"},
        std::pair{"renderD130", "0x10de"}}) {
    const std::string dir =
        absl::StrCat(root, "/sys/class/drm/", node, "/device");
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/vendor") << vendor << "\n";
  }
  std::filesystem::create_directories(root + "/sys/class/drm/card0");
  const HostFacts facts = DetectHostFacts({}, root);
  CHECK(facts.xpu_count == 2);
  CHECK(facts.xpu_source == "Intel render nodes in /sys/class/drm");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ctrun
