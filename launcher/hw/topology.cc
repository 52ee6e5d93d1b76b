#include "launcher/hw/topology.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "launcher/policy/gpu_watch.h"

namespace ctrun {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // VGA and 3D controllers

}  // namespace

absl::StatusOr<CpuTopology> LoadTopology() {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) {
    return absl::InternalError("hwloc_topology_init failed");
  }
  // PCI devices are left out by default; GPUs are among them.
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    return absl::InternalError("hwloc could not read the machine's topology");
  }
  CpuTopology out;
  for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PU, nullptr);
       pu != nullptr; pu = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PU, pu)) {
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
      if (hwloc_obj_type_is_dcache(up->type) &&
          up->attr->cache.depth > deepest_cache) {
        deepest_cache = up->attr->cache.depth;
        cpu.cache = static_cast<int>(up->gp_index);
      }
    }
    for (hwloc_obj_t n =
             hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr);
         n != nullptr;
         n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
      if (hwloc_bitmap_isset(n->cpuset, pu->os_index)) {
        cpu.numa_node = static_cast<int>(n->os_index);
        break;
      }
    }
    out.cpus.push_back(cpu);
  }
  std::vector<std::tuple<unsigned, unsigned, unsigned, unsigned, int>> gpus;
  for (hwloc_obj_t d = hwloc_get_next_pcidev(t, nullptr); d != nullptr;
       d = hwloc_get_next_pcidev(t, d)) {
    const auto& pci = d->attr->pcidev;
    if (pci.vendor_id != kNvidiaVendor ||
        (pci.class_id >> 8) != kDisplayClass) {
      continue;
    }
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(t, d);
    const int node = local ? hwloc_bitmap_first(local->nodeset) : -1;
    gpus.emplace_back(pci.domain, pci.bus, pci.dev, pci.func,
                      std::max(node, 0));
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& g : gpus) out.gpu_numa_nodes.push_back(std::get<4>(g));
  hwloc_topology_destroy(t);
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
