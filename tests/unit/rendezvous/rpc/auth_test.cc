#include "rendezvous/rpc/auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

// The MAC as OpenSSL's own HMAC makes it: tokens made by any ctrund, older
// ones included, must keep admitting their jobs.
std::string ReferenceJobToken(const std::string& secret,
                              const std::string& job_id) {
  const std::string message = absl::StrCat("ctrun job token v1\n", job_id);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       mac, &length);
  return absl::StrCat("job.", job_id, ".",
                      absl::BytesToHexString(absl::string_view(
                          reinterpret_cast<const char*>(mac), length)));
}

TEST_CASE("A job token is the HMAC-SHA256 of its job id under the secret",
          "[auth][unit]") {
  // Keys shorter than, as long as and longer than SHA-256's 64-byte block
  // (a longer key is hashed first), up to the largest token file.
  for (size_t size : {1, 32, 63, 64, 65, 200, 4096}) {
    std::string secret;
    for (size_t i = 0; i < size; ++i) secret += static_cast<char>('!' + i % 90);
    for (const std::string& job :
         {std::string("j"), std::string("train.42"), std::string(128, 'x')}) {
      INFO("secret of " << size << " bytes, job " << job);
      const std::string token = JobToken(secret, job);
      CHECK(token == ReferenceJobToken(secret, job));
      CHECK(JobAdmittedBy(BearerValue(token), secret) == job);
    }
  }
}

TEST_CASE("A job token admits nothing when its MAC or its secret is another",
          "[auth][unit]") {
  const std::string token = JobToken("service-secret", "train");
  CHECK(JobAdmittedBy(BearerValue(token), "other-secret") == std::nullopt);
  std::string forged = token;
  forged.back() = forged.back() == '0' ? '1' : '0';
  CHECK(JobAdmittedBy(BearerValue(forged), "service-secret") == std::nullopt);
  // The same MAC does not carry over to another job.
  const std::string mac = token.substr(token.rfind('.'));
  CHECK(JobAdmittedBy(BearerValue(absl::StrCat("job.other", mac)),
                      "service-secret") == std::nullopt);
  CHECK(JobAdmittedBy(token, "service-secret") == std::nullopt);  // no Bearer
}

}  // namespace
}  // namespace ctrun
