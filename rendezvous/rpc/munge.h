// Munge credentials, Slurm's own authentication, for the rendezvous.
//
// A client proves its uid with a credential from its node's munged; the
// service decodes it through its own munged, which shares the cluster's
// key. Credentials carry a payload that names the job, are valid for a few
// minutes and are refused when replayed, so clients make one per call.
// libmunge is loaded when first needed: ctrun runs where munge is absent.
#ifndef CTRUN_RENDEZVOUS_RPC_MUNGE_H_
#define CTRUN_RENDEZVOUS_RPC_MUNGE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ctrun {

// Who may speak to a rendezvous: clients with a credential for `job_id`,
// or, with no `job_id`, clients that only read its jobs' status (`ctrun
// status` from another step of the same Slurm job). A service accepts only
// credentials of its own uid.
struct MungeAuth {
  std::string socket;  // munged's socket; empty for munge's default
  std::string job_id;
};

struct MungeIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string payload;
};

// A fresh credential carrying `payload`. UNAVAILABLE, with munge's reason,
// when libmunge cannot be loaded or munged does not answer.
absl::StatusOr<std::string> MungeEncode(const std::string& socket,
                                        absl::string_view payload);

// UNAUTHENTICATED with munge's reason for an invalid, expired or replayed
// credential; UNAVAILABLE as for MungeEncode.
absl::StatusOr<MungeIdentity> MungeDecode(const std::string& socket,
                                          const std::string& credential);

// The payload that binds a credential to a job; for an empty `job_id`, the
// one that allows reading the status of the service's jobs and no more.
std::string MungePayload(absl::string_view job_id);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_MUNGE_H_
