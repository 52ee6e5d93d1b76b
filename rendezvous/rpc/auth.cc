#include "rendezvous/rpc/auth.h"

// SHA-256's own functions, which OpenSSL 3 marks deprecated in favour of
// EVP; see HmacSha256 for why they are used.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "rendezvous/rpc/user_file.h"

namespace ctrun {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  // Room for the newlines and spaces around a token of the largest size.
  auto text = ReadUserFile(path, "token file", kMaxTokenBytes + 64);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' is empty"));
  }
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file '", path, "' holds more than ", kMaxTokenBytes, " bytes"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token in '", path,
          "' must be one word of printable ASCII (no spaces or newlines)"));
    }
  }
  return token;
}

std::string GenerateToken() {
  std::random_device rd;
  std::string bytes(24, '\0');
  for (char& b : bytes) b = static_cast<char>(rd() & 0xff);
  return absl::BytesToHexString(bytes);
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

std::string MungeValue(absl::string_view credential) {
  return absl::StrCat("Munge ", credential);
}

std::optional<std::string> MungeCredentialIn(absl::string_view received) {
  if (!absl::ConsumePrefix(&received, "Munge ")) return std::nullopt;
  return std::string(received);
}

namespace {

constexpr absl::string_view kJobTokenPrefix = "job.";

bool ConstantTimeEquals(absl::string_view received,
                        absl::string_view expected) {
  // Every byte of the expected value is looked at whatever arrives, so the
  // time taken does not tell how much of a guess was right.
  unsigned char diff = received.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char got =
        i < received.size() ? static_cast<unsigned char>(received[i]) : 0;
    diff |= got ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

using Sha256Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

Sha256Digest Sha256(std::initializer_list<absl::string_view> parts) {
  SHA256_CTX context;
  SHA256_Init(&context);
  for (absl::string_view part : parts) {
    SHA256_Update(&context, part.data(), part.size());
  }
  Sha256Digest digest;
  SHA256_Final(digest.data(), &context);
  OPENSSL_cleanse(&context, sizeof context);
  return digest;
}

absl::string_view Bytes(const auto& array) {
  return absl::string_view(reinterpret_cast<const char*>(array.data()),
                           array.size());
}

// HMAC-SHA256 (RFC 2104) on SHA-256's own functions. OpenSSL 3's HMAC(),
// EVP digests and even SHA256() first load its configuration file and
// provider tables: over a MiB of the agent's memory, the largest part of
// its start-up, for the one MAC a launch makes.
Sha256Digest HmacSha256(absl::string_view key, absl::string_view message) {
  constexpr size_t kBlock = SHA256_CBLOCK;
  Sha256Digest hashed_key;
  if (key.size() > kBlock) {
    hashed_key = Sha256({key});
    key = Bytes(hashed_key);
  }
  std::array<char, kBlock> inner_pad, outer_pad;
  for (size_t i = 0; i < kBlock; ++i) {
    const char k = i < key.size() ? key[i] : 0;
    inner_pad[i] = static_cast<char>(k ^ 0x36);
    outer_pad[i] = static_cast<char>(k ^ 0x5c);
  }
  const Sha256Digest inner = Sha256({Bytes(inner_pad), message});
  const Sha256Digest mac = Sha256({Bytes(outer_pad), Bytes(inner)});
  // The pads are the key in other words; like OpenSSL's HMAC, leave none
  // of it behind.
  OPENSSL_cleanse(hashed_key.data(), hashed_key.size());
  OPENSSL_cleanse(inner_pad.data(), inner_pad.size());
  OPENSSL_cleanse(outer_pad.data(), outer_pad.size());
  return mac;
}

std::string JobMac(absl::string_view secret, absl::string_view job_id) {
  // Bound to its purpose, so that the MAC is of no use anywhere else.
  return absl::BytesToHexString(
      Bytes(HmacSha256(secret, absl::StrCat("ctrun job token v1\n", job_id))));
}

}  // namespace

std::string JobToken(absl::string_view secret, absl::string_view job_id) {
  return absl::StrCat(kJobTokenPrefix, job_id, ".", JobMac(secret, job_id));
}

std::optional<std::string> JobAdmittedBy(absl::string_view received,
                                         absl::string_view secret) {
  if (!absl::ConsumePrefix(&received, "Bearer ") ||
      !absl::ConsumePrefix(&received, kJobTokenPrefix)) {
    return std::nullopt;
  }
  // Job ids may hold dots; the MAC (hex) holds none.
  const size_t dot = received.rfind('.');
  if (dot == absl::string_view::npos || dot == 0) return std::nullopt;
  const absl::string_view job_id = received.substr(0, dot);
  if (!ConstantTimeEquals(received.substr(dot + 1), JobMac(secret, job_id))) {
    return std::nullopt;
  }
  return std::string(job_id);
}

bool BearerMatches(absl::string_view received, absl::string_view token) {
  return ConstantTimeEquals(received, BearerValue(token));
}

}  // namespace ctrun
