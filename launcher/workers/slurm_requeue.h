// Asking Slurm to requeue the batch job this agent runs in, after the job
// stopped at one step on SIGUSR1 (Slurm's "--signal=USR1@SECONDS" before
// the time limit): the job's next run resumes from the checkpoint the
// ranks saved there.
#ifndef CTRUN_LAUNCHER_WORKERS_SLURM_REQUEUE_H_
#define CTRUN_LAUNCHER_WORKERS_SLURM_REQUEUE_H_

#include <functional>
#include <string>

namespace ctrun {

// Requeues Slurm job `job_id` when Slurm lets it be requeued (`scontrol
// show job` says Requeue=1: sbatch --requeue, or the cluster's JobRequeue
// default), with `scontrol requeue`, having told `say` so first (the
// requeue ends the job's steps, the caller's with them). The line to say
// after, either way.
std::string RequeueSlurmJob(const std::string& job_id,
                            const std::function<void(std::string)>& say);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_WORKERS_SLURM_REQUEUE_H_
