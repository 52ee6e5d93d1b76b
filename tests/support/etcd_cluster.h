// EtcdCluster: a real etcd (Debian's etcd-server) of several members on
// 127.0.0.1, with free client and peer ports, data under a temporary
// directory, every member a ChildProcess ended by its pid. Elections are
// quick (50 ms heartbeats, 500 ms election timeout), so that tests that
// kill a member wait little.
//
// Replica: one `ctrund --etcd` replica on a fixed loopback port.
#ifndef CTRUN_TESTS_SUPPORT_ETCD_CLUSTER_H_
#define CTRUN_TESTS_SUPPORT_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"
#include "tests/support/child_process.h"

namespace ctrun::testing {

class EtcdCluster {
 public:
  // Starts `members` members and waits until each answers. Fails the
  // current test if they do not within 30 s.
  explicit EtcdCluster(int members = 3);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // "127.0.0.1:P1,127.0.0.1:P2,...": every member's client address.
  std::string endpoints() const;
  std::string endpoint(int member) const;
  int size() const { return static_cast<int>(members_.size()); }
  // SIGKILLs member `member` and reaps it.
  void Kill(int member);
  // The member that leads etcd's raft now, as the live members agree;
  // fails the current test if none does within 10 s.
  int Leader();
  // A client of every member.
  std::unique_ptr<EtcdClient> Client() const;

 private:
  struct Member {
    int client_port = 0;
    int peer_port = 0;
    std::unique_ptr<ChildProcess> process;
  };
  std::string dir_;
  std::vector<Member> members_;
};

class Replica {
 public:
  // Starts ctrund --listen 127.0.0.1:`port` --etcd `etcd` plus `extra`,
  // and waits for its "standing by" line.
  Replica(int port, const std::string& etcd,
          std::vector<std::string> extra = {});
  const std::string& endpoint() const { return endpoint_; }
  ChildProcess& process() { return *process_; }
  // Whether it says it serves within `timeout`.
  bool WaitLeading(absl::Duration timeout);

 private:
  std::string endpoint_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace ctrun::testing

#endif  // CTRUN_TESTS_SUPPORT_ETCD_CLUSTER_H_
