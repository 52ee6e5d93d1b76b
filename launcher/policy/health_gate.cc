#include "launcher/policy/health_gate.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ctrun {

int GivenGpus(const char* cuda_visible_devices,
              const char* slurm_gpus_on_node) {
  if (cuda_visible_devices != nullptr) {
    int n = 0;
    for (absl::string_view item :
         absl::StrSplit(cuda_visible_devices, ',', absl::SkipEmpty())) {
      int index = 0;
      if (!absl::SimpleAtoi(item, &index) || index < 0) return -1;  // UUIDs
      ++n;
    }
    return n;
  }
  int n = 0;
  if (slurm_gpus_on_node != nullptr &&
      absl::SimpleAtoi(slurm_gpus_on_node, &n) && n >= 0) {
    return n;
  }
  return -1;
}

std::string JudgeGpus(int given, int device_count,
                      const std::vector<GpuHealth>& gpus) {
  std::vector<std::string> problems;
  if (given >= 0 && device_count < given) {
    problems.push_back(absl::StrCat(
        "NVML sees ", device_count, " GPU", device_count == 1 ? "" : "s",
        ", fewer than the ", given, " this node was given"));
  }
  for (const GpuHealth& g : gpus) {
    if (g.uncorrected_ecc > 0) {
      problems.push_back(absl::StrCat("GPU ", g.gpu, " has ", g.uncorrected_ecc,
                                      " uncorrected ECC errors since boot"));
    }
    if (g.retired_pending == 1) {
      problems.push_back(absl::StrCat(
          "GPU ", g.gpu, " has pages pending retirement (it needs a reset)"));
    }
    for (const auto& [pid, bytes] : g.processes) {
      if (bytes <= kForeignGpuBytes) continue;
      problems.push_back(absl::StrFormat(
          "GPU %d is held by another process (pid %d, %.1f GiB)", g.gpu, pid,
          static_cast<double>(bytes) / (uint64_t{1} << 30)));
    }
  }
  return absl::StrJoin(problems, "; ");
}

}  // namespace ctrun
