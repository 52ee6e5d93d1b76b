// Human-readable views of the service's jobs, for `ctrund status`.
#ifndef CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_
#define CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_

#include <string>
#include <vector>

#include "ctrun/v1/admin.pb.h"

namespace ctrun {

// One block per job: a summary line, then a table of its nodes.
std::string FormatJobs(const std::vector<v1::JobStatus>& jobs);

// The jobs as indented JSON with proto field names and every field present.
// Unlike protobuf's JSON mapping, 64-bit integers are numbers, not strings
// ("round": 3), as tools reading the status expect; the counts and ages
// they hold stay far below 2^53.
std::string FormatJobsJson(const v1::ListJobsResponse& jobs);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_
