#include "rendezvous/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
  for (char c : ep.host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                    c == ':' || c == '_' || c == '%';
    if (!ok) return Malformed(text, "has a character not allowed in a host");
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

}  // namespace ctrun
