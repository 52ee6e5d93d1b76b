// Prints this worker's identity, or why it has none.
#include <cstdio>

#include "ctrun/worker.h"

int main() {
  auto id = ctrun::WorkerIdentity::FromEnvironment();
  if (!id.ok()) {
    std::printf("consumer: %s\n", id.status().ToString().c_str());
    return 3;
  }
  std::printf("consumer: rank %d of %d\n", id->rank, id->world_size);
  return 0;
}
