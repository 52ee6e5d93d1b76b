// --numa_binding: which CPUs (and, for `node`, which memory) each worker is
// bound to, from where its GPU sits in the machine. torchrun's policies:
//
//   node          the CPUs of the GPU's NUMA node; memory preferred there
//   socket        the CPUs of every NUMA node of the GPU's socket
//   exclusive     the GPU's NUMA node's physical cores, split between the
//                 GPUs on that node so that no two workers share a core
//   core-complex  one last-level-cache domain of the GPU's NUMA node per
//                 GPU, the fullest first, shared round-robin when the GPUs
//                 outnumber them
//
// Only CPUs that ctrun itself may run on are used. Pure: the topology comes
// from hwloc (launcher/hw/topology.h), the policy from the options.
#ifndef CTRUN_LAUNCHER_POLICY_NUMA_BINDING_H_
#define CTRUN_LAUNCHER_POLICY_NUMA_BINDING_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "launcher/options/launch_options.h"

namespace ctrun {

// A machine as binding sees it.
struct CpuTopology {
  struct Cpu {
    int os_index = 0;   // the kernel's CPU number
    int core = 0;       // its physical core (hyperthreads share it)
    int socket = 0;     // its package
    int numa_node = 0;  // its NUMA node
    int cache = 0;      // its last-level cache domain (a core complex)
  };
  std::vector<Cpu> cpus;
  // The NUMA node of each NVIDIA GPU, in PCI bus order (CUDA's and NVML's
  // numbering of GPUs).
  std::vector<int> gpu_numa_nodes;
};

struct Binding {
  std::set<int> cpus;    // kernel CPU numbers
  int memory_node = -1;  // preferred NUMA node for memory; -1: none
};

// The binding of the worker on GPU `gpu` (a CpuTopology index). `allowed`:
// the CPUs ctrun may use (its own affinity). FAILED_PRECONDITION when the
// GPU is not in the topology or its share has no usable CPU.
absl::StatusOr<Binding> PlanBinding(const CpuTopology& topology,
                                    NumaPolicy policy, int gpu,
                                    const std::set<int>& allowed);

// "0-3,8": the Cpus_allowed_list format.
std::string CpuListString(const std::set<int>& cpus);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_NUMA_BINDING_H_
