#include "rendezvous/rpc/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

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

TEST_CASE("Endpoint lists name replicas, each a whole endpoint",
          "[endpoint][unit]") {
  auto list = ParseEndpointList("h1:1,[::1]:2,10.0.0.3", 29400);
  REQUIRE(list.ok());
  REQUIRE(list->size() == 3);
  CHECK((*list)[1].host == "::1");
  CHECK((*list)[2].port == 29400);
  CHECK(JoinEndpoints(*list) == "h1:1,[::1]:2,10.0.0.3:29400");
  auto one = ParseEndpointList("h1:1");
  REQUIRE(one.ok());
  CHECK(one->size() == 1);

  auto empty_entry = ParseEndpointList("h1:1,,h2:2");
  REQUIRE(absl::IsInvalidArgument(empty_entry.status()));
  CHECK(empty_entry.status().message() ==
        "endpoint list 'h1:1,,h2:2' has an empty entry; expected "
        "HOST:PORT,HOST:PORT,...");
  CHECK(ParseEndpointList("h1:1,").status().message().find("empty entry") !=
        std::string::npos);
  auto twice = ParseEndpointList("h1:1,h1:1");
  CHECK(twice.status().message() ==
        "endpoint list 'h1:1,h1:1' names h1:1 twice");
  // The bad one is named as a single endpoint would be.
  CHECK(ParseEndpointList("h1:1,h2:x").status().message().find("'h2:x'") !=
        std::string::npos);
}

TEST_CASE("A channel to several replicas lists their addresses in order",
          "[endpoint][unit]") {
  CHECK(*ChannelTarget({{"somehost", 5}}) == "somehost:5");
  CHECK(*ChannelTarget({{"127.0.0.2", 5}, {"localhost", 6}}) ==
        "ipv4:127.0.0.2:5,127.0.0.1:6");
  CHECK(*ChannelTarget({{"::1", 5}, {"::1", 6}}) == "ipv6:[::1]:5,[::1]:6");
  auto mixed = ChannelTarget({{"127.0.0.1", 5}, {"::1", 6}});
  CHECK(absl::IsInvalidArgument(mixed.status()));
  CHECK(mixed.status().message().find("mixes IPv4 and IPv6") !=
        std::string::npos);
  auto unknown = ChannelTarget({{"127.0.0.1", 5}, {"no-such-host.invalid", 6}});
  CHECK(absl::IsNotFound(unknown.status()));
  CHECK(unknown.status().message() ==
        "endpoint no-such-host.invalid:6: host 'no-such-host.invalid' does "
        "not resolve");
}

TEST_CASE("Hosts are IP addresses or host names, nothing else",
          "[endpoint][unit]") {
  for (const char* good :
       {"127.0.0.1", "10.0.0.2", "::1", "fe80::1%eth0", "node-01",
        "node01.cluster.example", "fqdn.example.", "gpu_7", "a"}) {
    INFO(good);
    CHECK(ValidateHost(good).ok());
  }
  const std::pair<const char*, const char*> bad[] = {
      {"127.0.0.300", "not an IPv4 address"}, {"10.0.0", "not an IPv4 address"},
      {"1.2.3.4.5", "not an IPv4 address"},   {"::g", "not an IPv6 address"},
      {"-node", "not a host name"},           {"node..b", "not a host name"},
      {"bad!host", "not a host name"},        {"", "empty"},
  };
  for (const auto& [host, why] : bad) {
    INFO(host);
    auto s = ValidateHost(host);
    REQUIRE(absl::IsInvalidArgument(s));
    CHECK(s.message().find(why) != std::string::npos);
  }
  CHECK_FALSE(ValidateHost(std::string(64, 'a')).ok());  // one label > 63
  CHECK_FALSE(ValidateHost(std::string(254, '1')).ok());
  auto ep = ParseEndpoint("127.0.0.300:29400");
  REQUIRE(absl::IsInvalidArgument(ep.status()));
  CHECK(ep.status().message().find("has a host that is not an IPv4") !=
        std::string::npos);
}

TEST_CASE("BindFreePort finds a port on this machine's addresses only",
          "[endpoint][unit]") {
  auto loopback = BindFreePort("127.0.0.2");
  REQUIRE(loopback.ok());
  CHECK(*loopback > 0);
  CHECK(BindFreePort("localhost").ok());
  // 192.0.2.0/24 is reserved for documentation (RFC 5737): never an address
  // of this machine. Binding sends nothing on any network.
  auto foreign = BindFreePort("192.0.2.1");
  REQUIRE(absl::IsFailedPrecondition(foreign.status()));
  CHECK(foreign.status().message() ==
        "cannot bind to '192.0.2.1': Cannot assign requested address");
}

TEST_CASE("BindFreePort binds a given port only while nothing listens on it",
          "[endpoint][unit]") {
  auto port = BindFreePort("127.0.0.2");
  REQUIRE(port.ok());
  CHECK(BindFreePort("127.0.0.2", *port).value_or(0) == *port);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  inet_pton(AF_INET, "127.0.0.2", &addr.sin_addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 1) == 0);
  auto taken = BindFreePort("127.0.0.2", *port);
  close(fd);
  REQUIRE(absl::IsFailedPrecondition(taken.status()));
  CHECK(taken.status().message() ==
        absl::StrCat("cannot bind to '127.0.0.2' port ", *port,
                     ": Address already in use"));
}

TEST_CASE("Loopback is told apart from other addresses", "[endpoint][unit]") {
  CHECK(IsLoopbackHost("127.0.0.3"));
  CHECK(IsLoopbackHost("localhost"));
  CHECK_FALSE(IsLoopbackHost("10.0.0.1"));
  CHECK(ResolvesToLoopbackOnly("127.0.0.2"));
  CHECK(ResolvesToLoopbackOnly("localhost"));
  CHECK_FALSE(ResolvesToLoopbackOnly("10.0.0.1"));
}

TEST_CASE("WaitUntilListening sees a listener and gives up on none",
          "[endpoint][unit]") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const Endpoint endpoint{"127.0.0.1", ntohs(a.sin_port)};
  // Bound but not listening: refused until the deadline.
  const absl::Time start = absl::Now();
  CHECK_FALSE(WaitUntilListening(endpoint, absl::Milliseconds(50)));
  CHECK(absl::Now() - start >= absl::Milliseconds(50));
  CHECK(absl::Now() - start < absl::Seconds(5));
  REQUIRE(listen(fd, 1) == 0);
  CHECK(WaitUntilListening(endpoint, absl::Seconds(5)));
  close(fd);
}

}  // namespace
}  // namespace ctrun
