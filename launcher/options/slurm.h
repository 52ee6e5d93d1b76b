// What Slurm tells a process inside an allocation, read from its
// environment, and Slurm's hostlist syntax.
#ifndef CTRUN_LAUNCHER_OPTIONS_SLURM_H_
#define CTRUN_LAUNCHER_OPTIONS_SLURM_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/options/command_line.h"

namespace ctrun {

// Expands a Slurm hostlist: "node[01-04,07]", several bracket groups
// ("r[1-2]-n[1-2]", expanded left to right), suffixes ("gpu-[1-2]-ib"),
// and comma-separated lists of those ("a1,b[1-2],c"). Zero padding follows
// the range's first number. INVALID_ARGUMENT naming the position for an
// unbalanced bracket, an empty or reversed range, a non-number, or more
// than 1,000,000 hosts.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(
    const std::string& hostlist);

struct SlurmFacts {
  std::string job_id;
  std::string step_id;  // empty in the batch step
  int num_nodes = 0;    // of the step when in one, else of the job
  int node_id = 0;      // SLURM_NODEID: this node's index in the list
  std::vector<std::string> nodes;  // expanded, step's or job's
  int gpus_on_node = -1;           // SLURM_GPUS_ON_NODE, -1 when unset

  bool in_step() const { return !step_id.empty(); }
};

// nullopt outside an allocation (no SLURM_JOB_ID). INVALID_ARGUMENT,
// naming the variable, when what Slurm set is missing or inconsistent.
absl::StatusOr<std::optional<SlurmFacts>> ReadSlurmFacts(const EnvMap& env);

// The value of `key` (case-insensitive) in slurm.conf ($SLURM_CONF, else
// /etc/slurm/slurm.conf), unquoted; empty when absent or unreadable.
std::string SlurmConfValue(const EnvMap& env, absl::string_view key);

// Whether a signal that Slurm sends a step (scancel --signal, preemption)
// reaches every process of it, the workers included, by the step's process
// tracking.
bool SlurmSignalsWholeStep(const EnvMap& env);

// The socket of the munged that this node's Slurm uses, for munge.h:
// $CTRUN_MUNGE_SOCKET, else socket= in the AuthInfo of slurm.conf
// ($SLURM_CONF, else /etc/slurm/slurm.conf), else empty (munge's default).
std::string MungeSocketFor(const EnvMap& env);

// The rendezvous port of a Slurm job: derived from its id, below Linux's
// ephemeral range, so that concurrent jobs on a node rarely meet.
int SlurmRendezvousPort(const std::string& job_id);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_OPTIONS_SLURM_H_
