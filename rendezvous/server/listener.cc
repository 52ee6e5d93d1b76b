#include "rendezvous/server/listener.h"

#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rendezvous/rpc/endpoint.h"
#include "rendezvous/rpc/user_file.h"

namespace ctrun {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::optional<TlsServerFiles>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  auto cert = ReadUserFile(tls->cert_file, "TLS certificate", kMaxPemBytes);
  if (!cert.ok()) return cert.status();
  auto key = ReadUserFile(tls->key_file, "TLS key", kMaxPemBytes);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      tls->client_ca_file.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls->client_ca_file.empty()) {
    auto ca = ReadUserFile(tls->client_ca_file, "TLS client CA", kMaxPemBytes);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

void SetListenerArguments(grpc::ServerBuilder* builder) {
  // gRPC sets SO_REUSEPORT by default, so a second service on a port in use
  // would start and take half of the first one's connections.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A dead peer's connection is noticed by TCP itself; these pings find
  // connections that vanished without a reset (a partitioned host).
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A connection that never completes its handshake (a port scanner, a
  // client that never speaks) is dropped after this, not gRPC's 120 s.
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10'000);
}

absl::StatusOr<Listeners> ListenOn(const Endpoint& endpoint) {
  const std::string& host = endpoint.host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0",
                                 &hints, &found);
      rc != 0) {
    return absl::NotFoundError(
        absl::StrCat("'", host, "' does not resolve: ", gai_strerror(rc)));
  }
  Listeners listeners;
  listeners.port = endpoint.port;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage address{};
    std::memcpy(&address, a->ai_addr, a->ai_addrlen);
    const uint16_t wanted = htons(static_cast<uint16_t>(listeners.port));
    if (address.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = wanted;
    } else {
      reinterpret_cast<sockaddr_in*>(&address)->sin_port = wanted;
    }
    const int fd =
        socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int on = 1, off = 0;
    if (fd >= 0) {
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      // "::" serves IPv4 too, as gRPC's listener does.
      if (a->ai_family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      }
    }
    socklen_t length = sizeof address;
    if (fd < 0 ||
        bind(fd, reinterpret_cast<sockaddr*>(&address), a->ai_addrlen) != 0 ||
        listen(fd, 4096) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      if (fd >= 0) close(fd);
      // Another address of the name (IPv6 where only IPv4 works) is
      // skipped once one listens, as gRPC skips it.
      continue;
    }
    listeners.port =
        ntohs(address.ss_family == AF_INET6
                  ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                  : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
    listeners.fds.push_back(fd);
  }
  freeaddrinfo(found);
  if (listeners.fds.empty()) {
    // The words of gRPC's listener, which ctrund uses with TLS.
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", endpoint.ToString(),
                     " (address in use, or not an address of this machine)"));
  }
  return listeners;
}

}  // namespace ctrun
