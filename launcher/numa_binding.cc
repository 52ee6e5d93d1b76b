#include "launcher/numa_binding.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "launcher/gpu_watch.h"

namespace ctrun {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // VGA and 3D controllers

// The usable CPUs of NUMA node `node`, grouped by `key` (a core, a cache),
// groups ordered by their lowest CPU.
template <typename Key>
std::vector<std::set<int>> Groups(const CpuTopology& topology, int node,
                                  const std::set<int>& allowed, Key key) {
  std::map<int, std::set<int>> by_key;
  for (const CpuTopology::Cpu& cpu : topology.cpus) {
    if (cpu.numa_node == node && allowed.contains(cpu.os_index)) {
      by_key[key(cpu)].insert(cpu.os_index);
    }
  }
  std::vector<std::set<int>> groups;
  for (auto& [k, cpus] : by_key) groups.push_back(std::move(cpus));
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return *a.begin() < *b.begin();
  });
  return groups;
}

}  // namespace

const char* NumaPolicyName(NumaPolicy policy) {
  switch (policy) {
    case NumaPolicy::kNode:
      return "node";
    case NumaPolicy::kSocket:
      return "socket";
    case NumaPolicy::kExclusive:
      return "exclusive";
    case NumaPolicy::kCoreComplex:
      return "core-complex";
  }
  return "?";
}

absl::StatusOr<NumaPolicy> ParseNumaPolicy(absl::string_view text) {
  if (text == "node") return NumaPolicy::kNode;
  if (text == "socket") return NumaPolicy::kSocket;
  if (text == "exclusive") return NumaPolicy::kExclusive;
  if (text == "core-complex") return NumaPolicy::kCoreComplex;
  return absl::InvalidArgumentError(
      "expected node, socket, exclusive or core-complex");
}

absl::StatusOr<Binding> PlanBinding(const CpuTopology& topology,
                                    NumaPolicy policy, int gpu,
                                    const std::set<int>& allowed) {
  const int gpus = static_cast<int>(topology.gpu_numa_nodes.size());
  if (gpu < 0 || gpu >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", gpu, " is not in the machine's topology (hwloc found ", gpus,
        gpus == 1 ? " NVIDIA GPU)" : " NVIDIA GPUs)"));
  }
  const int node = topology.gpu_numa_nodes[gpu];
  // This GPU's place among the GPUs of its NUMA node.
  int position = 0, node_gpus = 0;
  for (int g = 0; g < gpus; ++g) {
    if (topology.gpu_numa_nodes[g] != node) continue;
    if (g < gpu) ++position;
    ++node_gpus;
  }
  Binding b;
  switch (policy) {
    case NumaPolicy::kNode:
      for (const CpuTopology::Cpu& cpu : topology.cpus) {
        if (cpu.numa_node == node && allowed.contains(cpu.os_index)) {
          b.cpus.insert(cpu.os_index);
        }
      }
      b.memory_node = node;
      break;
    case NumaPolicy::kSocket: {
      std::set<int> sockets;
      for (const CpuTopology::Cpu& cpu : topology.cpus) {
        if (cpu.numa_node == node) sockets.insert(cpu.socket);
      }
      for (const CpuTopology::Cpu& cpu : topology.cpus) {
        if (sockets.contains(cpu.socket) && allowed.contains(cpu.os_index)) {
          b.cpus.insert(cpu.os_index);
        }
      }
      break;
    }
    case NumaPolicy::kExclusive: {
      const auto cores = Groups(topology, node, allowed,
                                [](const auto& cpu) { return cpu.core; });
      const int per_gpu = static_cast<int>(cores.size()) / node_gpus;
      const int extra = static_cast<int>(cores.size()) % node_gpus;
      if (per_gpu < 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "NUMA node ", node, " has ", cores.size(),
            " usable physical cores for its ", node_gpus,
            " GPUs; --numa_binding=exclusive needs at least one each"));
      }
      // The first `extra` GPUs of the node get one core more.
      const int start = position * per_gpu + std::min(position, extra);
      const int end = start + per_gpu + (position < extra ? 1 : 0);
      for (int c = start; c < end; ++c)
        b.cpus.insert(cores[c].begin(), cores[c].end());
      break;
    }
    case NumaPolicy::kCoreComplex: {
      auto caches = Groups(topology, node, allowed,
                           [](const auto& cpu) { return cpu.cache; });
      // The fullest cache domains first; ties by lowest CPU (stable).
      std::stable_sort(
          caches.begin(), caches.end(),
          [](const auto& a, const auto& b) { return a.size() > b.size(); });
      if (!caches.empty()) b.cpus = caches[position % caches.size()];
      break;
    }
  }
  if (b.cpus.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CPU of GPU ", gpu, "'s NUMA node ", node,
        " is usable (ctrun may run on CPUs ", CpuListString(allowed), ")"));
  }
  return b;
}

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

std::string CpuListString(const std::set<int>& cpus) {
  return FormatRanges(std::vector<int>(cpus.begin(), cpus.end()));
}

}  // namespace ctrun
