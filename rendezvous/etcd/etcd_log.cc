#include "rendezvous/etcd/etcd_log.h"

#include <spdlog/spdlog.h>

#include <charconv>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rendezvous/durable/journal.h"

namespace ctrun {
namespace {

constexpr int kSeqDigits = 20;
// Room for the key and the transaction around a write's value.
constexpr size_t kWriteOverhead = 4096;
// How long a write may take, in tries of at most kAttemptTimeout, before it
// is refused; and as long again to learn the fate of one left unanswered.
constexpr absl::Duration kWriteBudget = absl::Seconds(10);
constexpr absl::Duration kAttemptTimeout = absl::Seconds(2);

void AddPut(etcdserverpb::TxnRequest* txn, const std::string& key,
            const std::string& value) {
  auto* put = txn->add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
}

// Makes `txn` happen only if `key` does not exist yet.
void AddKeyIsNew(etcdserverpb::TxnRequest* txn, const std::string& key) {
  auto* fresh = txn->add_compare();
  fresh->set_key(key);
  fresh->set_target(etcdserverpb::Compare::VERSION);
  fresh->set_result(etcdserverpb::Compare::EQUAL);
  fresh->set_version(0);
}

}  // namespace

std::string EtcdLeaderKey(const std::string& prefix) {
  return prefix + "leader";
}

std::string EtcdLogPrefix(const std::string& prefix) { return prefix + "log/"; }

std::string EtcdLogKey(const std::string& prefix, uint64_t seq,
                       int64_t leader) {
  return absl::StrCat(EtcdLogPrefix(prefix),
                      absl::StrFormat("%0*d", kSeqDigits, seq), ".", leader);
}

std::optional<EtcdLogKeyParts> ParseEtcdLogKey(const std::string& prefix,
                                               const std::string& key) {
  const std::string log = EtcdLogPrefix(prefix);
  if (!absl::StartsWith(key, log)) return std::nullopt;
  const std::string_view rest = std::string_view(key).substr(log.size());
  if (rest.size() < kSeqDigits + 2 || rest[kSeqDigits] != '.') {
    return std::nullopt;
  }
  EtcdLogKeyParts parts;
  const char* seq_end = rest.data() + kSeqDigits;
  auto seq = std::from_chars(rest.data(), seq_end, parts.seq);
  if (seq.ec != std::errc() || seq.ptr != seq_end) return std::nullopt;
  const char* end = rest.data() + rest.size();
  auto leader = std::from_chars(seq_end + 1, end, parts.leader);
  if (leader.ec != std::errc() || leader.ptr != end || parts.leader <= 0) {
    return std::nullopt;
  }
  return parts;
}

absl::StatusOr<std::unique_ptr<EtcdLog>> EtcdLog::Open(
    Options options, std::map<std::string, JournaledJob>* jobs) {
  const std::string log = EtcdLogPrefix(options.prefix);
  auto kvs = options.client->Range(log, PrefixEnd(log));
  if (!kvs.ok()) return kvs.status();
  std::string bytes;
  uint64_t last_seq = 0;
  for (const auto& kv : *kvs) {
    auto parts = ParseEtcdLogKey(options.prefix, kv.key());
    if (!parts) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd key '", kv.key(), "' is under ", log,
          " but is not a ctrund log key (is the prefix shared with "
          "something else? see ctrund --etcd-prefix)"));
    }
    last_seq = parts->seq;
    bytes += kv.value();
  }
  JournalContents contents = ReadJournal(bytes);
  if (!contents.damage.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the records under ", log, " in etcd do not read as whole records (",
        contents.damage.size(), " damaged spans); ctrund cannot restore them"));
  }
  *jobs = std::move(contents.jobs);
  auto opened =
      std::unique_ptr<EtcdLog>(new EtcdLog(std::move(options), last_seq + 1));
  opened->base_bytes_ = bytes.size();
  return opened;
}

EtcdLog::EtcdLog(Options options, uint64_t next_seq)
    : options_(std::move(options)), next_seq_(next_seq) {}

absl::Status EtcdLog::Append(const v1::JournalRecord& record) {
  pending_ += FrameRecord(record);
  return absl::OkStatus();
}

absl::Status EtcdLog::Commit(bool /*sync: etcd always is*/) {
  if (pending_.empty()) return absl::OkStatus();
  std::string value = std::move(pending_);
  pending_.clear();
  return Write(value);
}

bool EtcdLog::HasRoomFor(size_t bytes) const {
  return pending_.empty() ||
         pending_.size() + bytes + kWriteOverhead <= options_.max_write_bytes;
}

bool EtcdLog::WantsRewrite() const {
  return written_keys_ > 4096 ||
         written_bytes_ >
             std::max<uint64_t>(uint64_t{64} << 20, 2 * base_bytes_);
}

etcdserverpb::TxnRequest EtcdLog::Guarded() const {
  etcdserverpb::TxnRequest txn;
  auto* leads = txn.add_compare();
  leads->set_key(EtcdLeaderKey(options_.prefix));
  leads->set_target(etcdserverpb::Compare::CREATE);
  leads->set_result(etcdserverpb::Compare::EQUAL);
  leads->set_create_revision(options_.leader_revision);
  return txn;
}

absl::Status EtcdLog::Deposed(const std::string& why) {
  if (options_.on_deposed) options_.on_deposed(why);
  return absl::FailedPreconditionError(why);
}

absl::Status EtcdLog::Write(const std::string& value) {
  if (value.size() + kWriteOverhead > options_.max_write_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a write of ", value.size(),
                     " bytes does not fit in etcd's request "
                     "limit of ",
                     options_.max_write_bytes,
                     " bytes (ctrund --etcd-max-request-bytes, as etcd's "
                     "--max-request-bytes)"));
  }
  // etcd electing a leader of its own drops the writes it was given; they
  // are settled and tried again, so that clients see a delay, not an
  // error.
  const absl::Time give_up = absl::Now() + kWriteBudget;
  absl::Status last;
  while (true) {
    const std::string key =
        EtcdLogKey(options_.prefix, next_seq_, options_.leader_revision);
    etcdserverpb::TxnRequest txn = Guarded();
    AddKeyIsNew(&txn, key);
    AddPut(&txn, key, value);
    auto response = options_.client->Txn(txn, kAttemptTimeout);
    bool landed = false;
    if (response.ok()) {
      if (!response->succeeded()) {
        return Deposed(absl::StrCat("etcd refused a write to ", key,
                                    ": another replica leads now"));
      }
      landed = true;
    } else {
      last = response.status();
      spdlog::warn("a write to etcd went unanswered ({}); settling it",
                   std::string(last.message()));
      auto settled = Settle(key, value);
      if (!settled.ok()) return settled.status();
      landed = *settled;
    }
    ++next_seq_;  // used either way: a claimed key stays empty
    if (landed) break;
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(
          absl::StrCat("etcd did not take the write: ", last.message()));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  written_bytes_ += value.size();
  ++written_keys_;
  return absl::OkStatus();
}

absl::StatusOr<bool> EtcdLog::Settle(const std::string& key,
                                     const std::string& value) {
  etcdserverpb::TxnRequest claim = Guarded();
  AddKeyIsNew(&claim, key);
  AddPut(&claim, key, "");
  auto* read = claim.add_failure()->mutable_request_range();
  read->set_key(key);
  const absl::Time give_up = absl::Now() + kWriteBudget;
  absl::Status last;
  while (absl::Now() < give_up) {
    auto response = options_.client->Txn(claim, kAttemptTimeout);
    if (!response.ok()) {
      last = response.status();
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (response->succeeded()) return false;  // claimed: ours never lands
    const auto& kvs = response->responses(0).response_range().kvs();
    if (kvs.empty()) {
      return Deposed(absl::StrCat("etcd refused a write to ", key,
                                  ": another replica leads now"));
    }
    if (kvs[0].value() == value) return true;
    return Deposed(
        absl::StrCat("etcd key ", key, " holds another writer's records"));
  }
  return Deposed(absl::StrCat("cannot tell whether a write to etcd key ", key,
                              " landed: ", last.message()));
}

absl::Status EtcdLog::Rewrite(const std::vector<v1::JournalRecord>& records) {
  const uint64_t first = next_seq_;
  const size_t chunk = options_.max_write_bytes - kWriteOverhead;
  std::string value;
  uint64_t total = 0;
  for (const auto& record : records) {
    std::string framed = FrameRecord(record);
    if (!value.empty() && value.size() + framed.size() > chunk) {
      if (auto s = Write(value); !s.ok()) return s;
      value.clear();
    }
    total += framed.size();
    value += framed;
  }
  if (!value.empty()) {
    if (auto s = Write(value); !s.ok()) return s;
  }
  etcdserverpb::TxnRequest drop = Guarded();
  auto* old = drop.add_success()->mutable_request_delete_range();
  old->set_key(EtcdLogPrefix(options_.prefix));
  old->set_range_end(absl::StrCat(EtcdLogPrefix(options_.prefix),
                                  absl::StrFormat("%0*d", kSeqDigits, first)));
  auto response = options_.client->Txn(drop);
  if (!response.ok()) return response.status();
  if (!response->succeeded()) {
    return Deposed(
        "etcd refused a compaction of the log: another replica "
        "leads now");
  }
  written_bytes_ = 0;
  written_keys_ = 0;
  base_bytes_ = total;
  return absl::OkStatus();
}

}  // namespace ctrun
