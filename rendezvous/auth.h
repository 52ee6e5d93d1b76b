// What guards the rendezvous service: a shared-secret token, or munge
// credentials (munge.h).
//
// Clients send either as gRPC metadata: "authorization: Bearer <token>",
// compared in constant time, or "authorization: Munge <credential>".
#ifndef CTRUN_RENDEZVOUS_AUTH_H_
#define CTRUN_RENDEZVOUS_AUTH_H_

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

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_AUTH_H_
