// EtcdReplica: one of several ctrund replicas on etcd (ctrund --etcd). It
// holds an etcd lease of its own, kept alive by a thread; campaigns by
// creating PREFIX/leader on that lease (whoever creates it leads, until
// the lease lapses and etcd deletes the key); and, while leading, says
// whether it may still serve (leader_lease.h). The leader's records live
// under PREFIX/log/ (etcd_log.h).
//
// Thread-safe.
#ifndef CTRUN_RENDEZVOUS_ETCD_ETCD_REPLICA_H_
#define CTRUN_RENDEZVOUS_ETCD_ETCD_REPLICA_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rendezvous/core/leader_lease.h"
#include "rendezvous/core/repeated_warning.h"
#include "rendezvous/durable/record_log.h"
#include "rendezvous/etcd/etcd_client.h"

namespace ctrun {

struct ReplicaOptions {
  EtcdOptions etcd;
  // Where this deployment's keys live; ends with '/'.
  std::string prefix = "/ctrund/";
  absl::Duration lease_ttl = absl::Seconds(5);
  // HOST:PORT that clients reach this replica at, for PREFIX/leader.
  std::string address;
  // Called (from any thread) when this replica must stop leading: its
  // lease lapsed or etcd says another replica leads. Must not return
  // (ctrund starts itself again as a standby).
  std::function<void(const std::string& why)> step_down;
};

// Who leads, as PREFIX/leader says.
struct LeaderRecord {
  std::string address;
  absl::Time since;
  int64_t revision = 0;  // the key's create revision
};

// PREFIX/leader's value for `address` leading since `since`, and back.
std::string FormatLeaderRecord(const std::string& address, absl::Time since);
std::optional<LeaderRecord> ParseLeaderRecord(const std::string& value);

// The leader of the deployment at `prefix`, or none; etcd's error when it
// cannot be asked.
absl::StatusOr<std::optional<LeaderRecord>> ReadLeader(
    EtcdClient& client, const std::string& prefix);

class EtcdReplica {
 public:
  // INVALID_ARGUMENT for unusable etcd options. Talks to nobody yet.
  static absl::StatusOr<std::unique_ptr<EtcdReplica>> Create(
      ReplicaOptions options);
  ~EtcdReplica();
  EtcdReplica(const EtcdReplica&) = delete;
  EtcdReplica& operator=(const EtcdReplica&) = delete;

  // Whether every key under the prefix is this deployment's: the leader
  // record or a log key. FAILED_PRECONDITION naming the first foreign key
  // (another deployment's prefix nested in this one, or this one nested in
  // another's: once both write, neither restores); UNAVAILABLE when etcd
  // cannot be asked.
  absl::Status CheckPrefix();

  // Stands by until this replica leads (true) or `stop` is notified
  // (false), saying who leads whenever that changes. Rides out an etcd
  // that cannot be reached, saying so.
  bool Campaign(absl::Notification* stop);

  // While standing by: the replica that leads, as the last look at
  // PREFIX/leader (every 200 ms) found it; none before the first look, while
  // none leads, and when the record is this replica's own (a lease that
  // has not lapsed yet after it stepped down).
  std::optional<std::string> Leader();
  // The first look, before the standby answers anyone (Campaign's first
  // look comes only after a lease is granted, which a loaded etcd takes a
  // while to do): a replica starting again after it stepped down names the
  // new leader from its first answer. Nothing when etcd cannot be asked.
  void LookUpLeader();

  // While leading: whether the lease still holds by this replica's clock
  // (ServerOptions::may_serve). Cheap: no call to etcd.
  bool MayServe() const;

  // The leader's log (ServerOptions::state_log), writes of at most
  // `max_write_bytes`; losing leadership through it steps down.
  RecordLogOpener LogOpener(size_t max_write_bytes);

  // Gives leadership up at once: revokes the lease, so that etcd deletes
  // PREFIX/leader and a standby takes over without waiting out the TTL.
  void Resign();

  EtcdClient& client() { return *client_; }

 private:
  EtcdReplica(ReplicaOptions options, std::unique_ptr<EtcdClient> client);
  // Grants a fresh lease; false (having said why) when etcd refuses.
  bool GrantLease();
  // Renews the lease on time; steps down when leading without one.
  void KeepAliveLoop();

  const ReplicaOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  absl::Notification stopping_;
  std::thread keepalive_;

  // Said once, then once a minute (KeepAliveLoop's and Campaign's own).
  RepeatedWarning renew_warning_;
  RepeatedWarning grant_warning_;

  absl::Mutex mu_;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LeaderLease> lease_ ABSL_GUARDED_BY(mu_);
  // Who leads, for Leader(); empty when unknown.
  std::string seen_leader_ ABSL_GUARDED_BY(mu_);
  // The create revision of PREFIX/leader while this replica leads.
  int64_t leader_revision_ ABSL_GUARDED_BY(mu_) = 0;
  // LeaderLease::valid_until while leading, in ns of MonotonicNow; read
  // without the mutex on every request.
  std::atomic<int64_t> serve_until_ns_{0};
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_ETCD_ETCD_REPLICA_H_
