// MonotonicNow: the one clock that leases, heartbeats and timeouts are
// measured on, in the service and in the agent alike.
#ifndef CTRUN_RENDEZVOUS_RPC_MONOTONIC_CLOCK_H_
#define CTRUN_RENDEZVOUS_RPC_MONOTONIC_CLOCK_H_

#include "absl/time/time.h"

namespace ctrun {

// CLOCK_MONOTONIC as an absl::Time (since an arbitrary epoch): never jumps
// with the wall clock. Cores are fed this as `now`.
absl::Time MonotonicNow();

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_RPC_MONOTONIC_CLOCK_H_
