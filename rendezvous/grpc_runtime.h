// The gRPC runtime's lifetime in a ctrun process.
#ifndef CTRUN_RENDEZVOUS_GRPC_RUNTIME_H_
#define CTRUN_RENDEZVOUS_GRPC_RUNTIME_H_

namespace ctrun {

// Keeps gRPC initialized until the process exits. gRPC otherwise shuts its
// runtime down whenever its last channel or server goes away and starts it
// again with the next one; in gRPC 1.51 that cycle races with the callback
// API's completion-queue threads and aborts the process ("assertion failed:
// prior > 0"), e.g. an agent reconnecting after its channels were freed.
// Idempotent and thread-safe; called by everything that creates channels or
// servers.
void KeepGrpcInitialized();

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_GRPC_RUNTIME_H_
