// EtcdClient: the calls ctrund makes to etcd's v3 gRPC API
// (proto/etcd/rpc.proto), with a deadline on each.
//
// Thread-safe.
#ifndef CTRUN_RENDEZVOUS_ETCD_ETCD_CLIENT_H_
#define CTRUN_RENDEZVOUS_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/rpc.grpc.pb.h"

namespace ctrun {

struct EtcdOptions {
  // HOST:PORT[,HOST:PORT...]: etcd's client URLs, without the scheme.
  std::string endpoints;
  // TLS: the CA to verify etcd with, and a client certificate and key when
  // etcd asks for one. No CA: plain text.
  std::string ca_file, cert_file, key_file;
  // The longest a call may take.
  absl::Duration timeout = absl::Seconds(5);
};

class EtcdClient {
 public:
  // INVALID_ARGUMENT for a malformed endpoint list or unreadable TLS
  // files. Does not connect: the first call does.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Open(
      const EtcdOptions& options);

  // The keys in [key, range_end), by key; one key when range_end is empty.
  absl::StatusOr<std::vector<etcdserverpb::KeyValue>> Range(
      const std::string& key, const std::string& range_end = "");
  // `timeout` zero: the client's.
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request,
      absl::Duration timeout = absl::ZeroDuration());
  // A lease of (about) `ttl`: its id and the TTL etcd chose.
  absl::StatusOr<std::pair<int64_t, absl::Duration>> GrantLease(
      absl::Duration ttl);
  // Keeps lease `id` alive: the TTL it has left, zero once it is gone.
  // Waits at most `timeout` (shorter than the lease, so that a holder
  // that cannot renew notices in time).
  absl::StatusOr<absl::Duration> KeepAlive(int64_t id, absl::Duration timeout);
  absl::Status RevokeLease(int64_t id);
  // The answering member's status: its id (header().member_id()), and
  // which member leads etcd (leader()).
  absl::StatusOr<etcdserverpb::StatusResponse> Status();

  const std::string& endpoints() const { return endpoints_; }

 private:
  EtcdClient(std::string endpoints, std::shared_ptr<grpc::Channel> channel,
             absl::Duration timeout);
  void Prepare(grpc::ClientContext* context,
               absl::Duration timeout = absl::ZeroDuration()) const;
  // "etcd at ENDPOINTS: <gRPC status>", with the code kept.
  absl::Status Failed(const char* call, const grpc::Status& status) const;

  const std::string endpoints_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  const std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  const std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance_;
  const absl::Duration timeout_;
};

// The end of the range of every key that starts with `prefix`: `prefix`
// with its last byte raised by one (dropping trailing 0xff bytes).
std::string PrefixEnd(const std::string& prefix);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_ETCD_ETCD_CLIENT_H_
