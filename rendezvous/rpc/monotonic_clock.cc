#include "rendezvous/rpc/monotonic_clock.h"

#include <chrono>

namespace ctrun {

absl::Time MonotonicNow() {
  return absl::UnixEpoch() +
         absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace ctrun
