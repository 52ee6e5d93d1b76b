// HOST:PORT endpoints as users type them.
#ifndef CTRUN_RENDEZVOUS_RPC_ENDPOINT_H_
#define CTRUN_RENDEZVOUS_RPC_ENDPOINT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ctrun {

struct Endpoint {
  std::string host;  // without brackets for IPv6
  int port = 0;      // 0..65535; 0 asks the OS for a free port when listening

  // "host:port", with brackets around an IPv6 host.
  std::string ToString() const;
};

// Parses "HOST:PORT", "[IPV6]:PORT", or "HOST" when `default_port` is given.
// INVALID_ARGUMENT, naming the text and the accepted form, otherwise.
absl::StatusOr<Endpoint> ParseEndpoint(
    absl::string_view text, std::optional<int> default_port = std::nullopt);

// Parses "HOST:PORT[,HOST:PORT...]" (replicas of one service, tried in
// order): each as ParseEndpoint does; INVALID_ARGUMENT naming the bad one,
// an empty entry, or one named twice.
absl::StatusOr<std::vector<Endpoint>> ParseEndpointList(
    absl::string_view text, std::optional<int> default_port = std::nullopt);

// A --metrics_listen value: HOST:PORT, or PORT alone for 127.0.0.1:PORT
// (metrics tell who runs what: loopback unless asked). INVALID_ARGUMENT
// naming both forms otherwise.
absl::StatusOr<Endpoint> ParseMetricsListen(const std::string& text);

// "HOST:PORT,HOST:PORT", as ParseEndpointList reads it.
std::string JoinEndpoints(const std::vector<Endpoint>& endpoints);

// The gRPC target for a channel to `endpoints`: "HOST:PORT" for one (DNS
// resolves it, and tries every address of a name); for several, gRPC's
// "ipv4:"/"ipv6:" address list, each host resolved now to its first
// address, which a channel's pick_first policy tries in order until one
// accepts. NOT_FOUND naming a host that does not resolve; INVALID_ARGUMENT
// when the list mixes IPv4 and IPv6 (gRPC takes one family per list).
absl::StatusOr<std::string> ChannelTarget(
    const std::vector<Endpoint>& endpoints);

// OK when `host` is an IPv4 address (four numbers 0..255), an IPv6 address
// (without brackets, optionally with a %scope), or a host name (dot-separated
// labels of letters, digits, '-' and '_', 63 bytes each, 253 in all).
// INVALID_ARGUMENT otherwise, saying what `host` is not ("not an IPv4
// address (...)": no host is named only by digits and dots).
absl::Status ValidateHost(absl::string_view host);

// Binds a TCP socket to `port` of `host`'s first address (as getaddrinfo
// resolves it) and returns the port bound, closing the socket: a port free
// now, and proof that `host` is an address of this machine. Port 0 lets the
// OS choose one; a given port is bound with SO_REUSEADDR, as a server that
// takes it would (a port whose last connections linger in TIME_WAIT is
// free). FAILED_PRECONDITION, with the system's reason, when it cannot be
// bound; NOT_FOUND when `host` does not resolve.
absl::StatusOr<int> BindFreePort(absl::string_view host, int port = 0);

// Whether `host` names this machine's loopback: localhost, 127.0.0.0/8, ::1.
// Looks at the text only.
bool IsLoopbackHost(absl::string_view host);

// Whether every address `host` resolves to is a loopback address (a name
// mapped to 127.0.0.1, as emulated cluster nodes are). False when it does
// not resolve.
bool ResolvesToLoopbackOnly(absl::string_view host);

// Whether something accepts TCP connections at `endpoint` within `timeout`,
// trying every few milliseconds. gRPC waits at least 100 ms before it
// reconnects to an address that refused it; agents started together with
// the one that hosts their rendezvous wait here instead.
bool WaitUntilListening(const Endpoint& endpoint, absl::Duration timeout);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_ENDPOINT_H_
