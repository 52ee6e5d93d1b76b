// absl::Status <-> grpc::Status, code for code; and what a refusal may
// carry besides its status.
#ifndef CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_
#define CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ctrun {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Trailing metadata of a standby replica's UNAVAILABLE (ctrund --etcd):
// HOST:PORT of the replica that leads, where the call belongs. Clients go
// there at once (client.h, Connection::Follow).
inline constexpr char kLeaderMetadataKey[] = "ctrun-leader";

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_
