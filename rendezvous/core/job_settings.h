// Job settings: the server's defaults and their validation.
#ifndef CTRUN_RENDEZVOUS_CORE_JOB_SETTINGS_H_
#define CTRUN_RENDEZVOUS_CORE_JOB_SETTINGS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

// Defaults follow torchrun where it has the setting; failure detection
// (heartbeat_timeout) is ours and much shorter than torchrun's.
inline constexpr int64_t kDefaultJoinTimeoutMs = 600'000;
inline constexpr int64_t kDefaultLastCallTimeoutMs = 30'000;
inline constexpr int64_t kDefaultHeartbeatTimeoutMs = 5'000;

// The largest job the service accepts; rounds are O(nodes) to close.
inline constexpr int32_t kMaxNodesPerJob = 65536;
// JobSettings.spares at most.
inline constexpr int32_t kMaxSpares = 1024;

// INVALID_ARGUMENT unless `id` is 1..128 bytes of [A-Za-z0-9._:/-].
absl::Status CheckJobId(absl::string_view id);
// INVALID_ARGUMENT unless `segment` (Join.segment, --segment) is empty or
// 1..63 bytes of [A-Za-z0-9._:/-].
absl::Status CheckSegment(absl::string_view segment);

// `settings` with zero fields replaced by defaults, validated.
// INVALID_ARGUMENT names the field and the accepted range.
absl::StatusOr<v1::JobSettings> ResolveJobSettings(v1::JobSettings settings);

// "" when equal; otherwise the first differing field, as
// "max_nodes is 4 for the job, 3 in this join".
std::string DescribeSettingsDifference(const v1::JobSettings& job,
                                       const v1::JobSettings& join);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_JOB_SETTINGS_H_
