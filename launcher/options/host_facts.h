// What this machine offers workers: CPUs and visible GPUs.
#ifndef CTRUN_LAUNCHER_OPTIONS_HOST_FACTS_H_
#define CTRUN_LAUNCHER_OPTIONS_HOST_FACTS_H_

#include <string>

#include "launcher/options/command_line.h"

namespace ctrun {

// The host name, the CPUs this process may run on (sched_getaffinity). GPUs:
// the entries of CUDA_VISIBLE_DEVICES when it is set (empty, -1 or NoDevFiles:
// none); otherwise the NVIDIA devices the driver lists under
// /proc/driver/nvidia/gpus (or /dev/nvidiaN). Intel GPUs (XPUs): the
// entries of ZE_AFFINITY_MASK when it is set (Level Zero's device list),
// otherwise the DRM render nodes of vendor 0x8086 under /sys/class/drm.
// `root` prefixes those paths, for tests.
HostFacts DetectHostFacts(const EnvMap& env, const std::string& root = "");

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_HOST_FACTS_H_
