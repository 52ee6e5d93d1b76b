// What guards the rendezvous service: a shared-secret token, tokens for one
// job derived from it, or munge credentials (munge.h).
//
// Clients send either as gRPC metadata: "authorization: Bearer <token>",
// compared in constant time, or "authorization: Munge <credential>".
//
// The service's own token admits every job; a job token admits one: it is
// "job.<job id>.<HMAC-SHA256 of the id under the service's token, hex>", so
// the service checks it without keeping a list, and its holder cannot make
// one for another job.
#ifndef CTRUN_RENDEZVOUS_RPC_AUTH_H_
#define CTRUN_RENDEZVOUS_RPC_AUTH_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ctrun {

inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr size_t kMaxTokenBytes = 4096;

// The token in `path`, without surrounding whitespace. INVALID_ARGUMENT or
// NOT_FOUND naming the file when it is unreadable, empty, too long, or holds
// more than one line.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// A fresh random token (hex), for services that make their own.
std::string GenerateToken();

// "Bearer <token>".
std::string BearerValue(absl::string_view token);

// "Munge <credential>" (munge.h), and the credential in such a value, or
// nullopt when `received` is not one.
std::string MungeValue(absl::string_view credential);
std::optional<std::string> MungeCredentialIn(absl::string_view received);

// Constant-time comparison of a received metadata value with the expected
// "Bearer <token>".
bool BearerMatches(absl::string_view received, absl::string_view token);

// The token that admits job `job_id` only, under the service token
// `secret`. The id must be valid (CheckJobId).
std::string JobToken(absl::string_view secret, absl::string_view job_id);
// The job that a received "Bearer <job token>" value admits under `secret`,
// or nullopt when it is not a valid job token.
std::optional<std::string> JobAdmittedBy(absl::string_view received,
                                         absl::string_view secret);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_AUTH_H_
