// A stand-in for libnvidia-ml.so.1 (CTRUN_NVML_LIBRARY), so that ctrun's
// GPU watch runs on machines without GPUs. What it reports comes from
// CTRUN_FAKE_NVML, space-separated:
//
//   gpus=4            how many GPUs there are
//   util=90,0,0,0     each GPU's utilisation, percent
//   placement=0,0     the GPU each worker runs on, by its LOCAL_RANK
//   mib=1024          the memory each worker holds there
//   ecc=0,3           each GPU's uncorrected ECC errors since boot
//   retired=0,1       each GPU's pages pending retirement (1: some)
//   other=2:4096      another process (pid 1) holding 4096 MiB on GPU 2
//
// The workers are the calling process's children (ctrun's agent) whose
// environment has LOCAL_RANK, read from /proc like NVML would see them.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Spec {
  unsigned gpus = 1;
  std::vector<unsigned> util;
  std::vector<int> placement;
  unsigned long long mib = 1024;
  std::vector<int> ecc, retired;
  int other_gpu = -1;
  unsigned long long other_mib = 0;
};

std::vector<int> Numbers(const std::string& list) {
  std::vector<int> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

Spec Read() {
  Spec spec;
  const char* text = getenv("CTRUN_FAKE_NVML");
  std::stringstream in(text ? text : "");
  std::string word;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    if (key == "gpus") spec.gpus = std::atoi(value.c_str());
    if (key == "util") {
      for (int u : Numbers(value)) spec.util.push_back(u);
    }
    if (key == "placement") spec.placement = Numbers(value);
    if (key == "mib") spec.mib = std::strtoull(value.c_str(), nullptr, 10);
    if (key == "ecc") spec.ecc = Numbers(value);
    if (key == "retired") spec.retired = Numbers(value);
    if (key == "other") {
      spec.other_gpu = std::atoi(value.c_str());
      const auto colon = value.find(':');
      if (colon != std::string::npos) {
        spec.other_mib = std::strtoull(value.c_str() + colon + 1, nullptr, 10);
      }
    }
  }
  return spec;
}

// The LOCAL_RANK of each child of this process that has one, by pid.
std::map<unsigned, int> Workers() {
  std::map<unsigned, int> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  const std::string me = std::to_string(getpid());
  while (dirent* e = readdir(proc)) {
    const unsigned pid = std::strtoul(e->d_name, nullptr, 10);
    if (pid == 0) continue;
    std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::stringstream fields(line.substr(paren + 2));
    std::string state, ppid;
    fields >> state >> ppid;
    if (ppid != me) continue;
    std::ifstream environ(std::string("/proc/") + e->d_name + "/environ");
    std::string var;
    while (std::getline(environ, var, '\0')) {
      if (var.rfind("LOCAL_RANK=", 0) == 0) {
        out[pid] = std::atoi(var.c_str() + 11);
      }
    }
  }
  closedir(proc);
  return out;
}

struct Utilization {
  unsigned gpu, memory;
};
struct ProcessInfo {
  unsigned pid;
  unsigned long long used;
  unsigned gpu_instance, compute_instance;
};

}  // namespace

extern "C" {

int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = Read().gpus;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index >= Read().gpus) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<void*>(static_cast<uintptr_t>(index) + 1);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  const Spec spec = Read();
  const size_t gpu = reinterpret_cast<uintptr_t>(device) - 1;
  u->gpu = gpu < spec.util.size() ? spec.util[gpu] : 0;
  u->memory = 0;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count,
                                            ProcessInfo* infos) {
  const Spec spec = Read();
  const int gpu = static_cast<int>(reinterpret_cast<uintptr_t>(device) - 1);
  std::vector<ProcessInfo> here;
  for (const auto& [pid, local_rank] : Workers()) {
    if (local_rank < static_cast<int>(spec.placement.size()) &&
        spec.placement[local_rank] == gpu) {
      here.push_back(ProcessInfo{pid, spec.mib << 20, 0, 0});
    }
  }
  if (spec.other_gpu == gpu) {
    here.push_back(ProcessInfo{1, spec.other_mib << 20, 0, 0});
  }
  if (here.size() > *count) {
    *count = static_cast<unsigned>(here.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  *count = static_cast<unsigned>(here.size());
  std::copy(here.begin(), here.end(), infos);
  return 0;
}

int nvmlDeviceGetTotalEccErrors(void* device, int type, int counter,
                                unsigned long long* count) {
  const Spec spec = Read();
  const size_t gpu = reinterpret_cast<uintptr_t>(device) - 1;
  if (type != 1 || counter != 0) return 2;  // uncorrected, volatile only
  *count = gpu < spec.ecc.size() ? spec.ecc[gpu] : 0;
  return 0;
}

int nvmlDeviceGetRetiredPagesPendingStatus(void* device, int* pending) {
  const Spec spec = Read();
  const size_t gpu = reinterpret_cast<uintptr_t>(device) - 1;
  *pending = gpu < spec.retired.size() ? spec.retired[gpu] : 0;
  return 0;
}

}  // extern "C"
