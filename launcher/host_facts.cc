#include "launcher/host_facts.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <regex>

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

}  // namespace

HostFacts DetectHostFacts(const EnvMap& env, const std::string& root) {
  HostFacts facts;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  facts.hostname = name;
  facts.cpu_count = CountCpus();
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
