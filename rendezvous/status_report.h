// Human-readable views of the service's jobs, for `ctrund status`.
#ifndef CTRUN_RENDEZVOUS_STATUS_REPORT_H_
#define CTRUN_RENDEZVOUS_STATUS_REPORT_H_

#include <string>
#include <vector>

#include "ctrun/v1/admin.pb.h"

namespace ctrun {

// One block per job: a summary line, then a table of its nodes.
std::string FormatJobs(const std::vector<v1::JobStatus>& jobs);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_STATUS_REPORT_H_
