#include "launcher/hw/topology.h"

#include <dlfcn.h>
#include <hwloc.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "launcher/policy/gpu_watch.h"

namespace ctrun {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // VGA and 3D controllers

// hwloc 2's library. ctrun does not link it: a run without --numa_binding
// maps neither it nor what it pulls in (udev, libxml), and a machine
// without it fails only the flag. Only the functions proper are taken from
// it; the header's inline helpers would bind to the library at link time,
// so the few used are spelled out below.
constexpr char kHwlocLibrary[] = "libhwloc.so.15";

struct Hwloc {
  void* library = nullptr;
  unsigned (*api_version)();
  int (*topology_init)(hwloc_topology_t*);
  int (*set_io_types_filter)(hwloc_topology_t, enum hwloc_type_filter_e);
  int (*topology_load)(hwloc_topology_t);
  void (*topology_destroy)(hwloc_topology_t);
  int (*type_depth)(hwloc_topology_t, hwloc_obj_type_t);
  hwloc_obj_t (*obj_by_depth)(hwloc_topology_t, int, unsigned);
  int (*bitmap_isset)(hwloc_const_bitmap_t, unsigned);
  int (*bitmap_first)(hwloc_const_bitmap_t);

  ~Hwloc() {
    if (library != nullptr) dlclose(library);
  }

  // hwloc_get_next_obj_by_type.
  hwloc_obj_t Next(hwloc_topology_t t, hwloc_obj_type_t type,
                   hwloc_obj_t prev) const {
    const int depth = type_depth(t, type);
    if (depth == HWLOC_TYPE_DEPTH_UNKNOWN ||
        depth == HWLOC_TYPE_DEPTH_MULTIPLE) {
      return nullptr;
    }
    if (prev == nullptr) return obj_by_depth(t, depth, 0);
    return prev->depth == depth ? prev->next_cousin : nullptr;
  }
};

template <typename F>
bool Bind(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

// `h.library` from CTRUN_HWLOC_LIBRARY (the tests' stand-in) or hwloc's.
absl::Status LoadHwloc(Hwloc& h) {
  const char* name = getenv("CTRUN_HWLOC_LIBRARY");
  h.library = dlopen(name != nullptr && *name != '\0' ? name : kHwlocLibrary,
                     RTLD_NOW | RTLD_LOCAL);
  if (h.library == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the machine's topology comes from hwloc, which is not installed (",
        dlerror(),
        "): install it (Debian and Ubuntu: libhwloc15) or leave out "
        "--numa_binding"));
  }
  const bool bound =
      Bind(h.library, "hwloc_get_api_version", &h.api_version) &&
      Bind(h.library, "hwloc_topology_init", &h.topology_init) &&
      Bind(h.library, "hwloc_topology_set_io_types_filter",
           &h.set_io_types_filter) &&
      Bind(h.library, "hwloc_topology_load", &h.topology_load) &&
      Bind(h.library, "hwloc_topology_destroy", &h.topology_destroy) &&
      Bind(h.library, "hwloc_get_type_depth", &h.type_depth) &&
      Bind(h.library, "hwloc_get_obj_by_depth", &h.obj_by_depth) &&
      Bind(h.library, "hwloc_bitmap_isset", &h.bitmap_isset) &&
      Bind(h.library, "hwloc_bitmap_first", &h.bitmap_first);
  // The objects' layout is the header's: the major version must match.
  if (!bound || (h.api_version() >> 16) != (HWLOC_API_VERSION >> 16)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the machine's topology comes from hwloc 2 (", kHwlocLibrary,
        "); the library found is another version or not hwloc"));
  }
  return absl::OkStatus();
}

bool IsDataCache(hwloc_obj_type_t type) {
  return type >= HWLOC_OBJ_L1CACHE && type <= HWLOC_OBJ_L5CACHE;
}

}  // namespace

absl::StatusOr<CpuTopology> LoadTopology() {
  Hwloc h;
  if (absl::Status loaded = LoadHwloc(h); !loaded.ok()) return loaded;
  hwloc_topology_t t;
  if (h.topology_init(&t) != 0) {
    return absl::InternalError("hwloc_topology_init failed");
  }
  // PCI devices are left out by default; GPUs are among them.
  h.set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (h.topology_load(t) != 0) {
    h.topology_destroy(t);
    return absl::InternalError("hwloc could not read the machine's topology");
  }
  CpuTopology out;
  for (hwloc_obj_t pu = h.Next(t, HWLOC_OBJ_PU, nullptr); pu != nullptr;
       pu = h.Next(t, HWLOC_OBJ_PU, pu)) {
    CpuTopology::Cpu cpu;
    cpu.os_index = static_cast<int>(pu->os_index);
    cpu.core = static_cast<int>(pu->logical_index) + 1'000'000;
    cpu.cache = cpu.core;
    unsigned deepest_cache = 0;
    for (hwloc_obj_t up = pu->parent; up != nullptr; up = up->parent) {
      if (up->type == HWLOC_OBJ_CORE)
        cpu.core = static_cast<int>(up->logical_index);
      if (up->type == HWLOC_OBJ_PACKAGE) {
        cpu.socket = static_cast<int>(up->logical_index);
      }
      if (IsDataCache(up->type) && up->attr->cache.depth > deepest_cache) {
        deepest_cache = up->attr->cache.depth;
        cpu.cache = static_cast<int>(up->gp_index);
      }
    }
    for (hwloc_obj_t n = h.Next(t, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
         n = h.Next(t, HWLOC_OBJ_NUMANODE, n)) {
      if (h.bitmap_isset(n->cpuset, pu->os_index)) {
        cpu.numa_node = static_cast<int>(n->os_index);
        break;
      }
    }
    out.cpus.push_back(cpu);
  }
  std::vector<std::tuple<unsigned, unsigned, unsigned, unsigned, int>> gpus;
  for (hwloc_obj_t d = h.Next(t, HWLOC_OBJ_PCI_DEVICE, nullptr); d != nullptr;
       d = h.Next(t, HWLOC_OBJ_PCI_DEVICE, d)) {
    const auto& pci = d->attr->pcidev;
    if (pci.vendor_id != kNvidiaVendor ||
        (pci.class_id >> 8) != kDisplayClass) {
      continue;
    }
    // The closest object with CPUs (hwloc_get_non_io_ancestor_obj).
    hwloc_obj_t local = d;
    while (local != nullptr && local->cpuset == nullptr) local = local->parent;
    const int node = local ? h.bitmap_first(local->nodeset) : -1;
    gpus.emplace_back(pci.domain, pci.bus, pci.dev, pci.func,
                      std::max(node, 0));
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& g : gpus) out.gpu_numa_nodes.push_back(std::get<4>(g));
  h.topology_destroy(t);
  return out;
}

absl::StatusOr<std::vector<Binding>> PlanNodeBindings(
    NumaPolicy policy, int local_world_size, const char* cuda_visible_devices) {
  auto topology = LoadTopology();
  if (!topology.ok()) return topology.status();
  const int gpus = static_cast<int>(topology->gpu_numa_nodes.size());
  const std::vector<int> job_gpus =
      JobGpus(cuda_visible_devices, gpus, local_world_size);
  if (static_cast<int>(job_gpus.size()) < local_world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "binding follows each worker's GPU, but hwloc found ", gpus,
        gpus == 1 ? " NVIDIA GPU" : " NVIDIA GPUs",
        cuda_visible_devices
            ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", cuda_visible_devices, ")")
            : "",
        " for ", local_world_size,
        local_world_size == 1 ? " worker" : " workers"));
  }
  cpu_set_t mine;
  CPU_ZERO(&mine);
  std::set<int> allowed;
  if (sched_getaffinity(0, sizeof mine, &mine) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mine)) allowed.insert(c);
    }
  }
  std::vector<Binding> out;
  for (int lr = 0; lr < local_world_size; ++lr) {
    auto b = PlanBinding(*topology, policy, job_gpus[lr], allowed);
    if (!b.ok()) return b.status();
    out.push_back(std::move(*b));
  }
  return out;
}

}  // namespace ctrun
