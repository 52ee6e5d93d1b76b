// gRPC's own log lines, routed into spdlog.
#ifndef CTRUN_RENDEZVOUS_RPC_GRPC_LOG_H_
#define CTRUN_RENDEZVOUS_RPC_GRPC_LOG_H_

namespace ctrun {

// From now on gRPC's log lines go to spdlog's default logger at debug level
// (shown with --log-level=debug) instead of to stderr: every failure they
// describe (a port in use, an unreachable peer) reaches the user as ctrun's
// own one-line message, with what to do about it.
void RouteGrpcLogsToSpdlog();

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_GRPC_LOG_H_
