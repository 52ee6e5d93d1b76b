#include "rendezvous/etcd/etcd_replica.h"

#include <spdlog/spdlog.h>

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rendezvous/etcd/etcd_log.h"
#include "rendezvous/server/rendezvous_server.h"

namespace ctrun {
namespace {

int64_t ToNs(absl::Time t) { return absl::ToUnixNanos(t); }

}  // namespace

std::string FormatLeaderRecord(const std::string& address, absl::Time since) {
  return absl::StrCat(address, "\n", absl::ToUnixMillis(since));
}

std::optional<LeaderRecord> ParseLeaderRecord(const std::string& value) {
  std::vector<std::string> lines = absl::StrSplit(value, '\n');
  if (lines.size() != 2 || lines[0].empty()) return std::nullopt;
  int64_t ms = 0;
  auto [end, ec] =
      std::from_chars(lines[1].data(), lines[1].data() + lines[1].size(), ms);
  if (ec != std::errc() || end != lines[1].data() + lines[1].size()) {
    return std::nullopt;
  }
  return LeaderRecord{lines[0], absl::FromUnixMillis(ms), 0};
}

absl::StatusOr<std::optional<LeaderRecord>> ReadLeader(
    EtcdClient& client, const std::string& prefix) {
  auto kvs = client.Range(EtcdLeaderKey(prefix));
  if (!kvs.ok()) return kvs.status();
  if (kvs->empty()) return std::nullopt;
  auto record = ParseLeaderRecord(kvs->front().value());
  if (!record) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd key ", EtcdLeaderKey(prefix),
                     " does not hold a ctrund leader record"));
  }
  record->revision = kvs->front().create_revision();
  return record;
}

absl::StatusOr<std::unique_ptr<EtcdReplica>> EtcdReplica::Create(
    ReplicaOptions options) {
  auto client = EtcdClient::Open(options.etcd);
  if (!client.ok()) return client.status();
  return std::unique_ptr<EtcdReplica>(
      new EtcdReplica(std::move(options), *std::move(client)));
}

EtcdReplica::EtcdReplica(ReplicaOptions options,
                         std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)), client_(std::move(client)) {}

EtcdReplica::~EtcdReplica() {
  stopping_.Notify();
  if (keepalive_.joinable()) keepalive_.join();
}

absl::Status EtcdReplica::CheckPrefix() {
  const std::string& prefix = options_.prefix;
  auto kvs = client_->Range(prefix, PrefixEnd(prefix));
  if (!kvs.ok()) return kvs.status();
  for (const auto& kv : *kvs) {
    if (kv.key() == EtcdLeaderKey(prefix) ||
        ParseEtcdLogKey(prefix, kv.key())) {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd key '", kv.key(), "' under --etcd-prefix ", prefix,
        " is not this deployment's (another ctrund's prefix nested in this "
        "one, or this one in another's?); give each deployment a prefix "
        "that no other one's keys live under"));
  }
  return absl::OkStatus();
}

bool EtcdReplica::GrantLease() {
  const absl::Time sent = MonotonicNow();
  auto granted = client_->GrantLease(options_.lease_ttl);
  if (!granted.ok()) {
    if (auto line = grant_warning_.Failed(
            absl::StrCat("cannot get a lease from etcd (trying again): ",
                         granted.status().message()),
            sent)) {
      spdlog::warn("{}", *line);
    }
    return false;
  }
  if (auto line = grant_warning_.Succeeded("got a lease from etcd")) {
    spdlog::info("{}", *line);
  }
  absl::MutexLock lock(&mu_);
  lease_id_ = granted->first;
  lease_.emplace(sent, granted->second);
  return true;
}

bool EtcdReplica::Campaign(absl::Notification* stop) {
  constexpr absl::Duration kPoll = absl::Milliseconds(200);
  const std::string key = EtcdLeaderKey(options_.prefix);
  std::string said;  // what was last said of who leads
  while (!stop->HasBeenNotified()) {
    bool have_lease;
    int64_t lease_id;
    {
      absl::MutexLock lock(&mu_);
      have_lease = lease_ && !lease_->lost();
      lease_id = lease_id_;
    }
    if (!have_lease) {
      if (!GrantLease()) {
        stop->WaitForNotificationWithTimeout(absl::Seconds(1));
        continue;
      }
      if (!keepalive_.joinable()) {
        keepalive_ = std::thread([this] { KeepAliveLoop(); });
      }
      continue;
    }
    etcdserverpb::TxnRequest txn;
    auto* absent = txn.add_compare();
    absent->set_key(key);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_create_revision(0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(FormatLeaderRecord(options_.address, absl::Now()));
    put->set_lease(lease_id);
    txn.add_failure()->mutable_request_range()->set_key(key);
    auto response = client_->Txn(txn);
    if (response.ok() && response->succeeded()) {
      absl::MutexLock lock(&mu_);
      seen_leader_.clear();
      leader_revision_ = response->header().revision();
      serve_until_ns_ = ToNs(lease_->valid_until());
      spdlog::info("leading, as {} (etcd revision {}, lease TTL {})",
                   options_.address, leader_revision_,
                   absl::FormatDuration(lease_->ttl()));
      return true;
    }
    std::string now_said;
    if (!response.ok()) {
      now_said = absl::StrCat("cannot reach etcd (trying again): ",
                              response.status().message());
    } else {
      const auto& kvs = response->responses(0).response_range().kvs();
      auto leader =
          kvs.empty() ? std::nullopt : ParseLeaderRecord(kvs[0].value());
      {
        absl::MutexLock lock(&mu_);
        seen_leader_ = leader && leader->address != options_.address
                           ? leader->address
                           : std::string();
      }
      now_said =
          absl::StrCat("standing by; ",
                       leader ? absl::StrCat("the leader is ", leader->address)
                              : std::string("the leader is leaving"));
    }
    if (now_said != said) {
      spdlog::info("{}", now_said);
      said = now_said;
    }
    stop->WaitForNotificationWithTimeout(kPoll);
  }
  return false;
}

void EtcdReplica::LookUpLeader() {
  auto kvs = client_->Range(EtcdLeaderKey(options_.prefix));
  if (!kvs.ok() || kvs->empty()) return;
  const auto leader = ParseLeaderRecord((*kvs)[0].value());
  if (!leader || leader->address == options_.address) return;
  absl::MutexLock lock(&mu_);
  seen_leader_ = leader->address;
}

std::optional<std::string> EtcdReplica::Leader() {
  absl::MutexLock lock(&mu_);
  if (seen_leader_.empty()) return std::nullopt;
  return seen_leader_;
}

bool EtcdReplica::MayServe() const {
  return ToNs(MonotonicNow()) < serve_until_ns_.load(std::memory_order_relaxed);
}

RecordLogOpener EtcdReplica::LogOpener(size_t max_write_bytes) {
  return [this, max_write_bytes](std::map<std::string, JournaledJob>* jobs)
             -> absl::StatusOr<std::unique_ptr<RecordLog>> {
    EtcdLog::Options log;
    log.client = client_.get();
    log.prefix = options_.prefix;
    {
      absl::MutexLock lock(&mu_);
      log.leader_revision = leader_revision_;
    }
    log.max_write_bytes = max_write_bytes;
    log.on_deposed = options_.step_down;
    auto opened = EtcdLog::Open(std::move(log), jobs);
    if (!opened.ok()) return opened.status();
    return std::unique_ptr<RecordLog>(*std::move(opened));
  };
}

void EtcdReplica::Resign() {
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = lease_id_;
    leader_revision_ = 0;
    serve_until_ns_ = 0;
  }
  if (id == 0) return;
  if (auto s = client_->RevokeLease(id); !s.ok()) {
    spdlog::warn(
        "cannot hand leadership over (a standby takes over when "
        "the lease lapses): {}",
        std::string(s.message()));
  }
}

void EtcdReplica::KeepAliveLoop() {
  constexpr absl::Duration kTick = absl::Milliseconds(50);
  while (!stopping_.WaitForNotificationWithTimeout(kTick)) {
    int64_t id;
    bool leading, due;
    {
      absl::MutexLock lock(&mu_);
      if (!lease_) continue;
      const absl::Time now = MonotonicNow();
      leading = leader_revision_ != 0;
      if (leading && !lease_->Valid(now)) {
        const std::string why =
            lease_->lost()
                ? std::string("etcd says its lease expired")
                : absl::StrCat(
                      "its etcd lease was not renewed for ",
                      absl::FormatDuration(now - lease_->valid_until() +
                                           lease_->ttl() * 2 / 3));
        serve_until_ns_ = 0;
        options_.step_down(why);  // does not return
      }
      if (lease_->lost()) continue;  // Campaign grants another
      id = lease_id_;
      due = now >= lease_->next_renewal();
    }
    if (!due) continue;
    const absl::Time sent = MonotonicNow();
    auto left = client_->KeepAlive(id, options_.lease_ttl / 3);
    if (!left.ok()) {
      if (auto line = renew_warning_.Failed(
              absl::StrCat("cannot renew the etcd lease: ",
                           left.status().message()),
              sent)) {
        spdlog::warn("{}", *line);
      }
      // Not every tick: a tenth of the lease apart, as long as it fails.
      stopping_.WaitForNotificationWithTimeout(options_.lease_ttl / 10);
      continue;
    }
    if (auto line = renew_warning_.Succeeded("renewed the etcd lease")) {
      spdlog::info("{}", *line);
    }
    absl::MutexLock lock(&mu_);
    if (id != lease_id_ || !lease_) continue;
    lease_->OnRenewed(sent, *left);
    if (leader_revision_ != 0 && !lease_->lost()) {
      serve_until_ns_ = ToNs(lease_->valid_until());
    }
  }
}

}  // namespace ctrun
