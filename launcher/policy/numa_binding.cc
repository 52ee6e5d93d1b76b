#include "launcher/policy/numa_binding.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "launcher/policy/gpu_watch.h"

namespace ctrun {
namespace {

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

std::string CpuListString(const std::set<int>& cpus) {
  return FormatRanges(std::vector<int>(cpus.begin(), cpus.end()));
}

}  // namespace ctrun
