#include "launcher/workers/slurm_requeue.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "launcher/workers/run_briefly.h"

namespace ctrun {
namespace {

constexpr absl::Duration kScontrolTimeout = absl::Seconds(20);

}  // namespace

std::string RequeueSlurmJob(const std::string& job_id,
                            const std::function<void(std::string)>& say) {
  auto job =
      RunBriefly({"scontrol", "show", "job", "-o", job_id}, kScontrolTimeout);
  if (!job.ok()) {
    return absl::StrCat("cannot ask Slurm whether job ", job_id,
                        " may be requeued: ", job.status().message());
  }
  if (!absl::StrContains(*job, " Requeue=1")) {
    return absl::StrCat("Slurm job ", job_id,
                        " may not be requeued (sbatch --no-requeue, or the "
                        "cluster's JobRequeue=0): not requeued");
  }
  // Said first: the requeue ends this job's steps, this process with them.
  say(absl::StrCat("requeueing Slurm job ", job_id,
                   " (scontrol requeue): its next run resumes from the "
                   "checkpoint of this stop"));
  auto requeued = RunBriefly({"scontrol", "requeue", job_id}, kScontrolTimeout);
  if (!requeued.ok()) {
    return absl::StrCat("could not requeue Slurm job ", job_id, ": ",
                        requeued.status().message());
  }
  return absl::StrCat("Slurm job ", job_id, " is requeued");
}

}  // namespace ctrun
