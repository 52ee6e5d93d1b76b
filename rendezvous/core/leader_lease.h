// LeaderLease: what a ctrund replica knows of its etcd lease, by its own
// monotonic clock. Pure: fed the time, no I/O.
//
// etcd expires a lease TTL seconds after it last heard a keepalive for it.
// The replica counts from when it *sent* the keepalive that etcd confirmed
// (earlier than etcd heard it) and acts as leader for only two thirds of
// the TTL etcd reported: a replica that pauses or loses etcd stops serving
// before etcd can expire its lease and let another replica lead. Renewals
// go out every quarter TTL, so one lost keepalive costs nothing.
#ifndef CTRUN_RENDEZVOUS_CORE_LEADER_LEASE_H_
#define CTRUN_RENDEZVOUS_CORE_LEADER_LEASE_H_

#include "absl/time/time.h"

namespace ctrun {

class LeaderLease {
 public:
  // A lease of `ttl` granted by a request sent at `sent`.
  LeaderLease(absl::Time sent, absl::Duration ttl);

  // etcd answered a keepalive sent at `sent` with `ttl_left`; zero or less
  // means the lease is gone.
  void OnRenewed(absl::Time sent, absl::Duration ttl_left);

  // Whether the replica may still act on the lease at `now`.
  bool Valid(absl::Time now) const { return !lost_ && now < valid_until_; }
  // Whether etcd said the lease is gone.
  bool lost() const { return lost_; }
  // Until when Valid holds, unless renewed.
  absl::Time valid_until() const { return valid_until_; }
  // When the next keepalive should go out.
  absl::Time next_renewal() const { return next_renewal_; }
  absl::Duration ttl() const { return ttl_; }

 private:
  const absl::Duration ttl_;
  absl::Time valid_until_;
  absl::Time next_renewal_;
  bool lost_ = false;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_LEADER_LEASE_H_
