// What every gRPC listener of ctrund shares, the serving one and a
// standby's: its TLS credentials and its transport settings.
#ifndef CTRUN_RENDEZVOUS_SERVER_LISTENER_H_
#define CTRUN_RENDEZVOUS_SERVER_LISTENER_H_

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/rpc/endpoint.h"

namespace ctrun {

struct TlsServerFiles {
  std::string cert_file;       // PEM certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // when set, clients must present a cert
};

// Plain credentials without `tls`; TLS ones from its files otherwise, or
// the reason a file cannot be read (INVALID_ARGUMENT, user_file.h).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::optional<TlsServerFiles>& tls);

// No SO_REUSEPORT (a second listener on a port in use fails instead of
// sharing it), keepalive pings that find vanished peers, and a bounded
// handshake.
void SetListenerArguments(grpc::ServerBuilder* builder);

// TCP sockets listening on `endpoint`, as gRPC's AddListeningPort binds
// them but without gRPC: one per address its host resolves to, all on one
// port (the endpoint's, or one the system picks for port 0), non-blocking,
// closed on exec. UNAVAILABLE when the first cannot be bound ("address in
// use, or not an address of this machine"), NOT_FOUND when the host does
// not resolve.
struct Listeners {
  std::vector<int> fds;
  int port = 0;
};
absl::StatusOr<Listeners> ListenOn(const Endpoint& endpoint);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_SERVER_LISTENER_H_
