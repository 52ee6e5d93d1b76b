#include "rendezvous/rpc/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ctrun {
namespace {

absl::Status Malformed(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "endpoint '", text, "' ", why,
      "; expected HOST:PORT, e.g. 127.0.0.1:29400 or [::1]:29400"));
}

}  // namespace

std::string Endpoint::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text,
                                       std::optional<int> default_port) {
  if (text.empty()) return Malformed(text, "is empty");
  if (text.size() > 300) return Malformed(text.substr(0, 40), "is too long");
  Endpoint ep;
  absl::string_view port_text;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) {
      return Malformed(text, "has no closing ']'");
    }
    ep.host = std::string(text.substr(1, close - 1));
    absl::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return Malformed(text, "has text after ']'");
      port_text = rest.substr(1);
      if (port_text.empty()) return Malformed(text, "has an empty port");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != absl::string_view::npos && text.find(':') != colon) {
      return Malformed(text, "looks like IPv6 without brackets");
    }
    if (colon == absl::string_view::npos) {
      ep.host = std::string(text);
    } else {
      ep.host = std::string(text.substr(0, colon));
      port_text = text.substr(colon + 1);
      if (port_text.empty()) return Malformed(text, "has an empty port");
    }
  }
  if (ep.host.empty()) return Malformed(text, "has an empty host");
  if (auto s = ValidateHost(ep.host); !s.ok()) {
    return Malformed(text, absl::StrCat("has a host that is ", s.message()));
  }
  if (port_text.empty()) {
    if (!default_port) return Malformed(text, "has no port");
    ep.port = *default_port;
    return ep;
  }
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(),
                                   port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() ||
      port < 0 || port > 65535) {
    return Malformed(text, "has a port that is not 0..65535");
  }
  ep.port = port;
  return ep;
}

absl::StatusOr<std::vector<Endpoint>> ParseEndpointList(
    absl::string_view text, std::optional<int> default_port) {
  std::vector<Endpoint> endpoints;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (part.empty() && text.find(',') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint list '", text,
          "' has an empty entry; expected HOST:PORT,HOST:PORT,..."));
    }
    auto endpoint = ParseEndpoint(part, default_port);
    if (!endpoint.ok()) return endpoint.status();
    for (const Endpoint& seen : endpoints) {
      if (seen.host == endpoint->host && seen.port == endpoint->port) {
        return absl::InvalidArgumentError(
            absl::StrCat("endpoint list '", text, "' names ",
                         endpoint->ToString(), " twice"));
      }
    }
    endpoints.push_back(*std::move(endpoint));
  }
  return endpoints;
}

std::string JoinEndpoints(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const Endpoint& e : endpoints) {
    absl::StrAppend(&out, out.empty() ? "" : ",", e.ToString());
  }
  return out;
}

absl::StatusOr<std::string> ChannelTarget(
    const std::vector<Endpoint>& endpoints) {
  if (endpoints.size() == 1) return endpoints[0].ToString();
  std::string addresses;
  int family = AF_UNSPEC;
  for (const Endpoint& e : endpoints) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(e.host.c_str(), nullptr, &hints, &found) != 0 ||
        found == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "endpoint ", e.ToString(), ": host '", e.host, "' does not resolve"));
    }
    char text[INET6_ADDRSTRLEN] = {};
    const int this_family = found->ai_family;
    if (this_family == AF_INET) {
      inet_ntop(AF_INET,
                &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text,
                sizeof text);
    } else {
      inet_ntop(AF_INET6,
                &reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr,
                text, sizeof text);
    }
    freeaddrinfo(found);
    if (family != AF_UNSPEC && family != this_family) {
      return absl::InvalidArgumentError(absl::StrCat(
          "endpoint list '", JoinEndpoints(endpoints),
          "' mixes IPv4 and IPv6 addresses; give addresses of one family"));
    }
    family = this_family;
    absl::StrAppend(&addresses, addresses.empty() ? "" : ",",
                    Endpoint{text, e.port}.ToString());
  }
  return absl::StrCat(family == AF_INET ? "ipv4:" : "ipv6:", addresses);
}

absl::Status ValidateHost(absl::string_view host) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(why);
  };
  if (host.empty()) return bad("empty");
  if (host.size() > 253) return bad("longer than 253 bytes");
  if (absl::StrContains(host, ':')) {
    // The scope of a link-local address is an interface name or number.
    const absl::string_view address = host.substr(0, host.find('%'));
    in6_addr unused{};
    if (inet_pton(AF_INET6, std::string(address).c_str(), &unused) != 1) {
      return bad("not an IPv6 address");
    }
    return absl::OkStatus();
  }
  const bool dotted = std::all_of(host.begin(), host.end(), [](char c) {
    return c == '.' || (c >= '0' && c <= '9');
  });
  if (dotted) {
    in_addr unused{};
    if (inet_pton(AF_INET, std::string(host).c_str(), &unused) != 1) {
      return bad("not an IPv4 address (four numbers 0..255, e.g. 10.0.0.2)");
    }
    return absl::OkStatus();
  }
  // A host name; one trailing dot (fully qualified) is allowed.
  absl::string_view name = absl::StripSuffix(host, ".");
  for (absl::string_view label : absl::StrSplit(name, '.')) {
    const bool chars_ok = std::all_of(label.begin(), label.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '-' || c == '_';
    });
    if (label.empty() || label.size() > 63 || !chars_ok ||
        label.front() == '-' || label.back() == '-') {
      return bad(
          "not a host name (dot-separated labels of letters, digits and "
          "'-') or an IP address");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BindFreePort(absl::string_view host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(std::string(host).c_str(), "0", &hints, &found);
      rc != 0) {
    return absl::NotFoundError(
        absl::StrCat("'", host, "' does not resolve: ", gai_strerror(rc)));
  }
  absl::Status status = absl::OkStatus();
  const int fd =
      socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, found->ai_protocol);
  sockaddr_storage bound{};
  std::memcpy(&bound, found->ai_addr, found->ai_addrlen);
  const uint16_t wanted = htons(static_cast<uint16_t>(port));
  if (bound.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port = wanted;
  } else {
    reinterpret_cast<sockaddr_in*>(&bound)->sin_port = wanted;
  }
  const int reuse = 1;
  if (fd >= 0 && port != 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
  }
  socklen_t len = sizeof bound;
  if (fd < 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&bound), found->ai_addrlen) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot bind to '", host, "'",
                     port != 0 ? absl::StrCat(" port ", port) : "", ": ",
                     std::strerror(errno)));
  } else {
    port = ntohs(bound.ss_family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (!status.ok()) return status;
  return port;
}

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr addr{};
  if (inet_pton(AF_INET, std::string(host).c_str(), &addr) == 1) {
    return (ntohl(addr.s_addr) >> 24) == 127;
  }
  return false;
}

bool ResolvesToLoopbackOnly(absl::string_view host) {
  if (IsLoopbackHost(host)) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(std::string(host).c_str(), nullptr, &hints, &result) != 0) {
    return false;
  }
  bool any = false, all_loopback = true;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    any = true;
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all_loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all_loopback &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      all_loopback = false;
    }
  }
  freeaddrinfo(result);
  return any && all_loopback;
}

bool WaitUntilListening(const Endpoint& endpoint, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found) != 0) {
    return false;
  }
  bool listening = false;
  while (!listening) {
    for (addrinfo* a = found; a != nullptr && !listening; a = a->ai_next) {
      const int fd =
          socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        listening = true;
      } else if (errno == EINPROGRESS) {
        // A remote host may take long to answer: never past the deadline.
        pollfd p{fd, POLLOUT, 0};
        const int64_t ms = std::clamp<int64_t>(
            absl::ToInt64Milliseconds(deadline - absl::Now()), 1, 200);
        int error = 0;
        socklen_t len = sizeof error;
        listening = poll(&p, 1, static_cast<int>(ms)) == 1 &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 &&
                    error == 0;
      }
      close(fd);
    }
    if (listening || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  freeaddrinfo(found);
  return listening;
}

absl::StatusOr<Endpoint> ParseMetricsListen(const std::string& text) {
  int port;
  if (absl::SimpleAtoi(text, &port)) {
    if (port < 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("port ", text,
                       " is not 0..65535; give HOST:PORT, or PORT for "
                       "127.0.0.1:PORT"));
    }
    return Endpoint{"127.0.0.1", port};
  }
  auto endpoint = ParseEndpoint(text);
  if (!endpoint.ok()) {
    // ParseEndpoint's message ends with the HOST:PORT forms it expects.
    return absl::InvalidArgumentError(absl::StrCat(
        endpoint.status().message(), ", or PORT alone for 127.0.0.1:PORT"));
  }
  return endpoint;
}

}  // namespace ctrun
