// absl::Status <-> grpc::Status, code for code.
#ifndef CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_
#define CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ctrun {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_GRPC_STATUS_H_
