#include "tests/support/etcd_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/daemon.h"

namespace ctrun::testing {
namespace {

int FreePort() {
  auto port = BindFreePort("127.0.0.1");
  REQUIRE(port.ok());
  return *port;
}

}  // namespace

EtcdCluster::EtcdCluster(int members) {
  static int made = 0;
  dir_ = std::filesystem::temp_directory_path() /
         absl::StrCat("ctrun-etcd-", getpid(), "-", made++);
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  members_.resize(members);
  std::string initial;
  for (int i = 0; i < members; ++i) {
    members_[i].client_port = FreePort();
    members_[i].peer_port = FreePort();
    absl::StrAppend(&initial, i ? "," : "", "m", i,
                    "=http://127.0.0.1:", members_[i].peer_port);
  }
  for (int i = 0; i < members; ++i) {
    const std::string client =
        absl::StrCat("http://127.0.0.1:", members_[i].client_port);
    const std::string peer =
        absl::StrCat("http://127.0.0.1:", members_[i].peer_port);
    members_[i].process = std::make_unique<ChildProcess>(
        std::vector<std::string>{"/usr/bin/etcd",
                                 "--name",
                                 absl::StrCat("m", i),
                                 "--data-dir",
                                 absl::StrCat(dir_, "/m", i),
                                 "--listen-client-urls",
                                 client,
                                 "--advertise-client-urls",
                                 client,
                                 "--listen-peer-urls",
                                 peer,
                                 "--initial-advertise-peer-urls",
                                 peer,
                                 "--initial-cluster",
                                 initial,
                                 "--initial-cluster-state",
                                 "new",
                                 "--initial-cluster-token",
                                 absl::StrCat("ctrun-test-", getpid()),
                                 "--heartbeat-interval",
                                 "50",
                                 "--election-timeout",
                                 "500",
                                 "--logger",
                                 "zap",
                                 "--log-level",
                                 "warn"});
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < members; ++i) {
    EtcdOptions options;
    options.endpoints = endpoint(i);
    options.timeout = absl::Seconds(1);
    auto client = EtcdClient::Open(options);
    REQUIRE(client.ok());
    bool up = false;
    while (!up && absl::Now() < deadline) {
      auto status = (*client)->Status();
      up = status.ok() && status->leader() != 0;
      if (!up) absl::SleepFor(absl::Milliseconds(100));
    }
    INFO("etcd member " << i << ": " << members_[i].process->Stderr());
    REQUIRE(up);
  }
}

EtcdCluster::~EtcdCluster() {
  members_.clear();  // each ChildProcess kills and reaps its member
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string EtcdCluster::endpoint(int member) const {
  return absl::StrCat("127.0.0.1:", members_[member].client_port);
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (int i = 0; i < size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", endpoint(i));
  }
  return out;
}

void EtcdCluster::Kill(int member) {
  members_[member].process->Signal(SIGKILL);
  REQUIRE(members_[member].process->Wait(absl::Seconds(10)));
}

int EtcdCluster::Leader() {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    for (int i = 0; i < size(); ++i) {
      EtcdOptions options;
      options.endpoints = endpoint(i);
      options.timeout = absl::Milliseconds(500);
      auto client = EtcdClient::Open(options);
      REQUIRE(client.ok());
      auto status = (*client)->Status();
      if (!status.ok() || status->leader() == 0) continue;
      if (status->leader() == status->header().member_id()) return i;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  FAIL("no etcd member leads");
  return -1;
}

std::unique_ptr<EtcdClient> EtcdCluster::Client() const {
  EtcdOptions options;
  options.endpoints = endpoints();
  auto client = EtcdClient::Open(options);
  REQUIRE(client.ok());
  return *std::move(client);
}

Replica::Replica(int port, const std::string& etcd,
                 std::vector<std::string> extra) {
  endpoint_ = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {CtrundPath(), "--listen", endpoint_,
                                   "--etcd", etcd};
  argv.insert(argv.end(), extra.begin(), extra.end());
  process_ = std::make_unique<ChildProcess>(argv);
  auto line = process_->ReadLine(absl::Seconds(10));
  INFO("ctrund stderr: " << process_->Stderr());
  REQUIRE(line);
  REQUIRE(line->rfind("ctrund standing by to serve " + endpoint_, 0) == 0);
}

bool Replica::WaitLeading(absl::Duration timeout) {
  return process_->WaitForLine("ctrund listening on " + endpoint_, timeout)
      .has_value();
}

}  // namespace ctrun::testing
