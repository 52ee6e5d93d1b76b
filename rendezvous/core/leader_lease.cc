#include "rendezvous/core/leader_lease.h"

#include <algorithm>

namespace ctrun {

LeaderLease::LeaderLease(absl::Time sent, absl::Duration ttl) : ttl_(ttl) {
  OnRenewed(sent, ttl);
}

void LeaderLease::OnRenewed(absl::Time sent, absl::Duration ttl_left) {
  if (ttl_left <= absl::ZeroDuration()) {
    lost_ = true;
    return;
  }
  // A late answer to an old keepalive must not shorten what a newer one
  // gave.
  valid_until_ = std::max(valid_until_, sent + ttl_left * 2 / 3);
  next_renewal_ = sent + ttl_ / 4;
}

}  // namespace ctrun
