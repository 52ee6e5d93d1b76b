// The machine as --numa_binding sees it: its topology from hwloc, loaded
// only when the flag asks, and the bindings of this node's workers planned
// on it (launcher/policy/numa_binding.h) within ctrun's own affinity.
#ifndef CTRUN_LAUNCHER_HW_TOPOLOGY_H_
#define CTRUN_LAUNCHER_HW_TOPOLOGY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/launch_options.h"
#include "launcher/policy/numa_binding.h"

namespace ctrun {

// The machine's topology, from hwloc (which honours HWLOC_XMLFILE).
absl::StatusOr<CpuTopology> LoadTopology();

// The bindings of a node's `local_world_size` workers, worker LOCAL_RANK on
// the LOCAL_RANK-th GPU that `cuda_visible_devices` (null: unset) shows,
// from the machine's topology and ctrun's own affinity. Errors say what
// prevents the binding, for a one-line message.
absl::StatusOr<std::vector<Binding>> PlanNodeBindings(
    NumaPolicy policy, int local_world_size, const char* cuda_visible_devices);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_HW_TOPOLOGY_H_
