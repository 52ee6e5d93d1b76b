// The service's jobs as `ctrun status` and `ctrund status` ask for and
// print them.
#ifndef CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_
#define CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ctrun/v1/admin.pb.h"
#include "rendezvous/client/client.h"

namespace ctrun {

// One block per job: a summary line, then a table of its nodes.
std::string FormatJobs(const std::vector<v1::JobStatus>& jobs);

// The jobs as indented JSON with proto field names and every field present.
// Unlike protobuf's JSON mapping, 64-bit integers are numbers, not strings
// ("round": 3), as tools reading the status expect; the counts and ages
// they hold stay far below 2^53.
std::string FormatJobsJson(const v1::ListJobsResponse& jobs);

// The jobs the service behind `admin` holds: `job` alone (its NOT_FOUND
// when the service holds no such job), or every job when `job` is empty.
absl::StatusOr<v1::ListJobsResponse> FetchJobs(AdminClient& admin,
                                               const std::string& job);

// Writes `jobs` to `out`, as FormatJobs (then the quarantined nodes, when
// there are any) or, with `json`, FormatJobsJson.
// When a standby replica sent the calls on (Connection::leader), a line
// "leader: B (A stands by)" comes first, A being `asked`; with `json` it
// goes to `notes` instead, so that `out` holds JSON only.
void PrintJobs(const v1::ListJobsResponse& jobs, bool json,
               const Connection& connection, const std::string& asked,
               std::ostream& out, std::ostream& notes);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CLIENT_STATUS_REPORT_H_
