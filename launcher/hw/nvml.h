// NVML, loaded at run time: ctrun neither links it nor needs its header
// (the CUDA toolkit here ships none), so one ctrun binary runs on machines
// with and without NVIDIA's driver.
#ifndef CTRUN_LAUNCHER_HW_NVML_H_
#define CTRUN_LAUNCHER_HW_NVML_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "launcher/policy/health_gate.h"

namespace ctrun {

// A process with a context on a GPU.
struct GpuProcess {
  pid_t pid = 0;
  uint64_t used_bytes = 0;  // 0 when NVML cannot tell (no permission)
};

struct GpuDeviceReading {
  int gpu = 0;
  int utilization = -1;  // percent; -1 when NVML cannot tell
  std::vector<GpuProcess> processes;
};

class Nvml {
 public:
  // Loads the library named by CTRUN_NVML_LIBRARY (the tests' fake), else
  // libnvidia-ml.so.1 when NVIDIA's driver is there (/dev/nvidiactl), and
  // initialises it. Null when it is absent, fails to initialise or sees no
  // GPU: the caller then stays silent.
  static std::unique_ptr<Nvml> Load();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  int device_count() const { return device_count_; }

  // Every GPU's utilisation and compute processes, now. A GPU NVML fails
  // to read is left out.
  std::vector<GpuDeviceReading> Read();
  // Every GPU's health (health_gate.h): its ECC errors and pending retired
  // pages where NVML has the calls, and its compute processes.
  std::vector<GpuHealth> ReadHealth();

 private:
  struct Api;
  Nvml(void* library, std::unique_ptr<Api> api, int device_count);
  void* library_;
  std::unique_ptr<Api> api_;
  int device_count_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_HW_NVML_H_
