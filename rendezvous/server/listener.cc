#include "rendezvous/server/listener.h"

#include <grpcpp/grpcpp.h>

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

}  // namespace ctrun
