#include "launcher/options/host_facts.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ctrun/environment.h"

namespace ctrun {
namespace {

int CountCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return 1;
}

int CountEntries(const std::string& dir, const std::regex& name) {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (std::regex_match(e.path().filename().string(), name)) ++n;
  }
  return n;
}

// Intel GPUs as PyTorch's torch.xpu sees them through Level Zero.
void CountXpus(const EnvMap& env, const std::string& root, HostFacts* facts) {
  if (auto it = env.find("ZE_AFFINITY_MASK"); it != env.end()) {
    const std::vector<absl::string_view> devices =
        absl::StrSplit(it->second, ',', absl::SkipWhitespace());
    facts->xpu_count = static_cast<int>(devices.size());
    facts->xpu_source = absl::StrCat("ZE_AFFINITY_MASK=", it->second);
    return;
  }
  std::error_code ec;
  int n = 0;
  const std::string drm = root + "/sys/class/drm";
  for (const auto& e : std::filesystem::directory_iterator(drm, ec)) {
    if (!absl::StartsWith(e.path().filename().string(), "renderD")) continue;
    std::ifstream vendor(e.path() / "device" / "vendor");
    std::string id;
    if (vendor >> id && id == "0x8086") ++n;
  }
  facts->xpu_count = n;
  facts->xpu_source = n > 0 ? "Intel render nodes in /sys/class/drm"
                            : "no Intel GPU in /sys/class/drm";
}

}  // namespace

HostFacts DetectHostFacts(const EnvMap& env, const std::string& root) {
  HostFacts facts;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  facts.hostname = name;
  facts.cpu_count = CountCpus();
  CountXpus(env, root, &facts);
  if (auto it = env.find(env::kCudaVisibleDevices); it != env.end()) {
    const std::string& v = it->second;
    int n = 0;
    if (v != "-1" && v != "NoDevFiles") {
      for (absl::string_view d : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        if (d == "-1") break;  // CUDA stops at the first invalid entry
        ++n;
      }
    }
    facts.gpu_count = n;
    facts.gpu_source = absl::StrCat("CUDA_VISIBLE_DEVICES=", v);
    return facts;
  }
  facts.gpu_count =
      CountEntries(root + "/proc/driver/nvidia/gpus", std::regex(".+"));
  facts.gpu_source = "/proc/driver/nvidia/gpus";
  if (facts.gpu_count == 0) {
    facts.gpu_count = CountEntries(root + "/dev", std::regex("nvidia[0-9]+"));
    facts.gpu_source = "no NVIDIA device in /proc/driver/nvidia/gpus or /dev";
  }
  return facts;
}

}  // namespace ctrun
