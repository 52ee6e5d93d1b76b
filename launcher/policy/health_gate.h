// The health gate's verdict on a node's GPUs, from what NVML tells (the
// agent reads it, launcher/hw/nvml.h): pure, so that each condition is
// tested without a GPU.
#ifndef CTRUN_LAUNCHER_POLICY_HEALTH_GATE_H_
#define CTRUN_LAUNCHER_POLICY_HEALTH_GATE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ctrun {

// One GPU as NVML reads it.
struct GpuHealth {
  int gpu = 0;
  int64_t uncorrected_ecc = -1;  // volatile count (since boot); -1: unknown
  int retired_pending = -1;      // 1: pages wait to be retired; -1: unknown
  // Processes holding memory on it: pid, bytes (0 when NVML cannot tell).
  std::vector<std::pair<pid_t, uint64_t>> processes;
};

// Memory another process may hold on a GPU before the node is unfit.
inline constexpr uint64_t kForeignGpuBytes = uint64_t{1} << 30;

// The GPUs a node was given: the indexes CUDA_VISIBLE_DEVICES names (null:
// unset), else SLURM_GPUS_ON_NODE; -1 when neither says.
int GivenGpus(const char* cuda_visible_devices, const char* slurm_gpus_on_node);

// "" when the node's GPUs are fit to run a job: NVML sees at least the
// `given` GPUs (-1: not checked), none has uncorrected ECC errors since boot
// or pages pending retirement, and no process holds more than
// kForeignGpuBytes on one (the node's own workers are stopped whenever
// this runs). Else every problem, "; "-separated, in one line.
std::string JudgeGpus(int given, int device_count,
                      const std::vector<GpuHealth>& gpus);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_HEALTH_GATE_H_
