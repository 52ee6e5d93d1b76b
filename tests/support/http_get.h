// HttpGet: a plain HTTP/1.0 GET on loopback, for tests that read a metrics
// endpoint or Prometheus' API without a client library.
#ifndef CTRUN_TESTS_SUPPORT_HTTP_GET_H_
#define CTRUN_TESTS_SUPPORT_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ctrun::testing {

// The body of `path` at HOST:PORT; UNAVAILABLE when nothing answers within
// `timeout`, FAILED_PRECONDITION (with the status line) for a status other
// than 200.
absl::StatusOr<std::string> HttpGet(const std::string& host, int port,
                                    const std::string& path,
                                    absl::Duration timeout = absl::Seconds(5));

// `text` percent-encoded for a URL's query.
std::string UrlEncode(const std::string& text);

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_HTTP_GET_H_
