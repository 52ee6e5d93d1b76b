#include "launcher/hw/nvml.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

namespace ctrun {
namespace {

// NVML's ABI, declared here from its documentation: the handful of types
// and calls ctrun uses. Return 0 is NVML_SUCCESS.
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
// nvmlProcessInfo_t of the _v2 and _v3 calls.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;  // NOLINT: NVML's own type
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;  // NOLINT

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*count)(unsigned int*);
  nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);
  // Optional (health gate): null when the library lacks them.
  nvmlReturn_t (*ecc_errors)(nvmlDevice_t, int, int,
                             unsigned long long*);  // NOLINT: NVML's type
  nvmlReturn_t (*retired_pending)(nvmlDevice_t, int*);
};

namespace {

// The device node NVIDIA's driver creates on every machine with its GPUs
// (in containers given GPUs too).
constexpr char kNvidiaControlDevice[] = "/dev/nvidiactl";

template <typename F>
bool Bind(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::Load() {
  const char* name = getenv("CTRUN_NVML_LIBRARY");
  const bool named = name != nullptr && *name != '\0';
  // Without NVIDIA's driver there is no GPU to read, and no reason to
  // search the library path for its library on every start.
  if (!named && access(kNvidiaControlDevice, F_OK) != 0) return nullptr;
  void* library =
      dlopen(named ? name : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  auto api = std::make_unique<Api>();
  const bool bound =
      Bind(library, "nvmlInit_v2", &api->init) &&
      Bind(library, "nvmlShutdown", &api->shutdown) &&
      Bind(library, "nvmlDeviceGetCount_v2", &api->count) &&
      Bind(library, "nvmlDeviceGetHandleByIndex_v2", &api->handle) &&
      Bind(library, "nvmlDeviceGetUtilizationRates", &api->utilization) &&
      (Bind(library, "nvmlDeviceGetComputeRunningProcesses_v3",
            &api->processes) ||
       Bind(library, "nvmlDeviceGetComputeRunningProcesses_v2",
            &api->processes));
  // nvmlDeviceGetTotalEccErrors(device, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
  // NVML_VOLATILE_ECC, &count); nvmlDeviceGetRetiredPagesPendingStatus.
  Bind(library, "nvmlDeviceGetTotalEccErrors", &api->ecc_errors);
  Bind(library, "nvmlDeviceGetRetiredPagesPendingStatus",
       &api->retired_pending);
  unsigned int count = 0;
  if (!bound || api->init() != kNvmlSuccess) {
    dlclose(library);
    return nullptr;
  }
  if (api->count(&count) != kNvmlSuccess || count == 0) {
    api->shutdown();
    dlclose(library);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(
      new Nvml(library, std::move(api), static_cast<int>(count)));
}

Nvml::Nvml(void* library, std::unique_ptr<Api> api, int device_count)
    : library_(library), api_(std::move(api)), device_count_(device_count) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(library_);
}

std::vector<GpuDeviceReading> Nvml::Read() {
  std::vector<GpuDeviceReading> out;
  for (int i = 0; i < device_count_; ++i) {
    nvmlDevice_t device = nullptr;
    if (api_->handle(static_cast<unsigned int>(i), &device) != kNvmlSuccess) {
      continue;
    }
    GpuDeviceReading r;
    r.gpu = i;
    nvmlUtilization_t utilization{};
    if (api_->utilization(device, &utilization) == kNvmlSuccess) {
      r.utilization = static_cast<int>(utilization.gpu);
    }
    // The list can grow between the two calls: ask again with room.
    std::vector<nvmlProcessInfo_t> infos(16);
    nvmlReturn_t rc;
    while (true) {
      unsigned int n = static_cast<unsigned int>(infos.size());
      rc = api_->processes(device, &n, infos.data());
      if (rc == kNvmlInsufficientSize && n < 65536) {
        infos.resize(n + 16);
        continue;
      }
      if (rc == kNvmlSuccess) infos.resize(n);
      break;
    }
    if (rc != kNvmlSuccess) continue;
    for (const nvmlProcessInfo_t& p : infos) {
      r.processes.push_back(GpuProcess{
          static_cast<pid_t>(p.pid),
          p.usedGpuMemory == kNvmlValueNotAvailable ? 0 : p.usedGpuMemory});
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<GpuHealth> Nvml::ReadHealth() {
  constexpr int kUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
  constexpr int kVolatile = 0;     // NVML_VOLATILE_ECC: since the last boot
  std::vector<GpuHealth> out;
  for (const GpuDeviceReading& reading : Read()) {
    GpuHealth h;
    h.gpu = reading.gpu;
    for (const GpuProcess& p : reading.processes) {
      h.processes.emplace_back(p.pid, p.used_bytes);
    }
    nvmlDevice_t device = nullptr;
    if (api_->handle(static_cast<unsigned int>(reading.gpu), &device) ==
        kNvmlSuccess) {
      unsigned long long ecc = 0;  // NOLINT: NVML's type
      if (api_->ecc_errors != nullptr &&
          api_->ecc_errors(device, kUncorrected, kVolatile, &ecc) ==
              kNvmlSuccess) {
        h.uncorrected_ecc = static_cast<int64_t>(ecc);
      }
      int pending = 0;
      if (api_->retired_pending != nullptr &&
          api_->retired_pending(device, &pending) == kNvmlSuccess) {
        h.retired_pending = pending != 0 ? 1 : 0;
      }
    }
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace ctrun
