#include "rendezvous/grpc_runtime.h"

#include <grpc/grpc.h>

namespace ctrun {

void KeepGrpcInitialized() {
  // One reference that is never released.
  static const bool initialized = [] {
    grpc_init();
    return true;
  }();
  (void)initialized;
}

}  // namespace ctrun
