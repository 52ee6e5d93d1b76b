#include "rendezvous/status_report.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ctrun {
namespace {

std::string Lower(const std::string& name) {
  return absl::AsciiStrToLower(name);
}

std::string Ranks(const v1::NodeStatus& n) {
  if (n.first_global_rank() < 0) return "-";
  const int last = n.first_global_rank() + n.local_world_size() - 1;
  return last == n.first_global_rank()
             ? absl::StrCat(last)
             : absl::StrCat(n.first_global_rank(), "-", last);
}

}  // namespace

std::string FormatJobs(const std::vector<v1::JobStatus>& jobs) {
  if (jobs.empty()) return "no jobs\n";
  std::string out;
  for (const auto& job : jobs) {
    const auto& s = job.settings();
    absl::StrAppendFormat(
        &out,
        "job %s  %s  round %d  nodes %d (min %d, max %d)  world %d  "
        "restarts %d/%d",
        job.job_id(), Lower(v1::JobStatus::Phase_Name(job.phase())),
        job.round(), job.nodes_size(), s.min_nodes(), s.max_nodes(),
        job.world_size(), job.restart_count(), s.max_restarts());
    if (!job.master_addr().empty()) {
      absl::StrAppendFormat(&out, "  master %s:%d", job.master_addr(),
                            job.master_port());
    }
    absl::StrAppend(&out, "  keys ", job.num_keys(), "\n");
    if (!job.failure().empty()) {
      absl::StrAppend(&out, "  failure: ", job.failure(), "\n");
    }
    absl::StrAppendFormat(&out, "  %-5s %-24s %-22s %-8s %-14s %-11s %s\n",
                          "GROUP", "HOST", "ADDRESS", "PID", "STATE", "RANKS",
                          "HEARTBEAT");
    for (const auto& n : job.nodes()) {
      absl::StrAppendFormat(
          &out, "  %-5s %-24s %-22s %-8d %-14s %-11s %s\n",
          n.group_rank() < 0 ? "-" : absl::StrCat(n.group_rank()),
          n.node().hostname(), n.address(), n.node().pid(),
          Lower(v1::NodeStatus::State_Name(n.state())), Ranks(n),
          n.resuming()
              ? std::string("resuming")
              : absl::StrFormat("%.1fs ago", n.heartbeat_age_ms() / 1000.0));
    }
    for (const auto& lost : job.lost_nodes()) {
      absl::StrAppend(&out, "  lost: ", lost, "\n");
    }
  }
  return out;
}

}  // namespace ctrun
