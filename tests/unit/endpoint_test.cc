#include "rendezvous/endpoint.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

TEST_CASE("Endpoints parse as HOST:PORT with IPv6 in brackets",
          "[endpoint][unit]") {
  auto a = ParseEndpoint("node1:29400");
  REQUIRE(a.ok());
  CHECK(a->host == "node1");
  CHECK(a->port == 29400);
  auto b = ParseEndpoint("[::1]:5");
  REQUIRE(b.ok());
  CHECK(b->host == "::1");
  CHECK(b->ToString() == "[::1]:5");
  CHECK(ParseEndpoint("head", 29400)->port == 29400);
}

TEST_CASE("Malformed endpoints are refused saying what is expected",
          "[endpoint][unit]") {
  for (const char* bad : {"", "head", "head:", ":80", "h:99999", "h:x", "[::1",
                          "[::1]x", "::1:80", "a b:1"}) {
    auto r = ParseEndpoint(bad);
    INFO(bad);
    REQUIRE(absl::IsInvalidArgument(r.status()));
    CHECK(r.status().message().find("expected HOST:PORT") != std::string::npos);
  }
}

TEST_CASE("Loopback is told apart from other addresses", "[endpoint][unit]") {
  CHECK(IsLoopbackHost("127.0.0.3"));
  CHECK(IsLoopbackHost("localhost"));
  CHECK_FALSE(IsLoopbackHost("10.0.0.1"));
  CHECK(ResolvesToLoopbackOnly("127.0.0.2"));
  CHECK(ResolvesToLoopbackOnly("localhost"));
  CHECK_FALSE(ResolvesToLoopbackOnly("10.0.0.1"));
}

}  // namespace
}  // namespace ctrun
