// SlurmCluster: a real Slurm on this machine for end-to-end tests — a
// private munged, slurmctld and two slurmd standing for nodes ctn1 and
// ctn2 (both on 127.0.0.1, on their own ports), with two fake GPUs each.
//
// Everything lives in a fresh directory; the daemons run in the foreground
// as ChildProcesses. The node names resolve through lines added to
// /etc/hosts for the cluster's lifetime (so run one cluster at a time: the
// tests hold the ctest resource lock "slurm"; a new cluster drops lines
// that a killed test left behind). Needs root and Debian's
// slurmctld, slurmd, slurm-client and munge.
#ifndef CTRUN_TESTS_SUPPORT_SLURM_CLUSTER_H_
#define CTRUN_TESTS_SUPPORT_SLURM_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/child_process.h"
#include "tests/support/munged.h"

namespace ctrun::testing {

class SlurmCluster {
 public:
  // Starts the daemons and waits until both nodes are idle; fails the
  // current test when they are not within a minute.
  SlurmCluster();
  // Cancels every job, waits for them to end, stops the daemons by pid,
  // SIGKILLs whatever process still carries this cluster's SLURM_CONF and
  // removes the /etc/hosts lines.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Environment for Slurm's commands and for jobs: SLURM_CONF. (slurm.conf
  // names the private munge socket in AuthInfo.)
  std::vector<std::string> Env() const;
  // Where job output and files written by the tests' workers go.
  const std::string& work_dir() const { return work_dir_; }

  struct Job {
    std::string id;
    std::unique_ptr<ChildProcess> sbatch;  // `sbatch --wait`, exits with it
    std::string output_path;               // the batch step's stdout+stderr
  };
  // Submits `script` (a shell script with #SBATCH lines) with
  // `sbatch --wait` plus `sbatch_args` (which win over #SBATCH lines), and
  // `env` added to the job's environment; fails the current test when
  // sbatch refuses it.
  Job Submit(const std::string& name, const std::string& script,
             std::vector<std::string> env = {},
             std::vector<std::string> sbatch_args = {});
  // Waits for the job to end: its exit code (sbatch's), or nullopt.
  std::optional<int> Wait(Job& job, absl::Duration timeout);
  std::string Output(const Job& job) const;

  // Runs one of Slurm's commands (scancel, squeue, ...) with Env() and
  // returns its stdout; fails the current test unless it exits 0.
  std::string Command(std::vector<std::string> argv) const;
  // The same, nullopt when it fails (a busy slurmctld may time a query out).
  std::optional<std::string> TryCommand(std::vector<std::string> argv) const;

 private:
  void WaitForIdleNodes();
  void TearDown();
  void KillLeftovers() const;

  std::string work_dir_;
  std::string conf_path_;
  std::string hosts_marker_;
  std::unique_ptr<Munged> munged_;
  std::unique_ptr<ChildProcess> slurmctld_;
  std::vector<std::unique_ptr<ChildProcess>> slurmds_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_SLURM_CLUSTER_H_
