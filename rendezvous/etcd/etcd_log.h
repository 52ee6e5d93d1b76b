// EtcdLog: the records of a ctrund on etcd (--etcd), kept under a key
// prefix so that several deployments can share one etcd:
//
//   PREFIX/leader              the leading replica's address and since when,
//                              on its lease (etcd_replica.h)
//   PREFIX/log/SEQ.LEADER      the framed records (journal.h) of one commit,
//                              SEQ counting up (20 digits), LEADER the
//                              revision at which its writer came to lead
//
// Reading the log keys in order gives the same record stream as a journal
// file, so restoring from etcd is restoring from a journal. Every write is
// a transaction that first checks that PREFIX/leader was created at this
// replica's revision: once its lease lapses the key is gone (or another
// replica's), and the write does not happen. A commit also checks that its
// key is new, so that one whose answer got lost can be settled: the replica
// then claims the key with an empty value, which the lost one can no
// longer overwrite, or finds that its own landed.
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_ETCD_ETCD_LOG_H_
#define CTRUN_RENDEZVOUS_ETCD_ETCD_LOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rendezvous/durable/record_log.h"
#include "rendezvous/etcd/etcd_client.h"

namespace ctrun {

// PREFIX/leader.
std::string EtcdLeaderKey(const std::string& prefix);
// PREFIX/log/ : every log key starts with it.
std::string EtcdLogPrefix(const std::string& prefix);
// PREFIX/log/SEQ.LEADER
std::string EtcdLogKey(const std::string& prefix, uint64_t seq, int64_t leader);
// The SEQ and LEADER of a log key; none for any other key.
struct EtcdLogKeyParts {
  uint64_t seq = 0;
  int64_t leader = 0;
};
std::optional<EtcdLogKeyParts> ParseEtcdLogKey(const std::string& prefix,
                                               const std::string& key);

class EtcdLog : public RecordLog {
 public:
  struct Options {
    EtcdClient* client = nullptr;  // must outlive the log
    std::string prefix;
    // The create revision of PREFIX/leader that this replica holds.
    int64_t leader_revision = 0;
    // The most bytes one write may carry (below etcd's
    // --max-request-bytes, 1.5 MiB by default).
    size_t max_write_bytes = 1 << 20;
    // Called when etcd says this replica no longer leads, or a commit's
    // fate cannot be learnt; the caller steps down. The call that found it
    // then fails with FAILED_PRECONDITION.
    std::function<void(const std::string& why)> on_deposed;
  };

  // Reads the log's records into `*jobs`. FAILED_PRECONDITION for a key
  // under PREFIX/log/ that is not a log key or records that do not read as
  // whole ones; etcd's error when it cannot be read.
  static absl::StatusOr<std::unique_ptr<EtcdLog>> Open(
      Options options, std::map<std::string, JournaledJob>* jobs);

  absl::Status Append(const v1::JournalRecord& record) override;
  absl::Status Commit(bool sync) override;
  // Writes the checkpoint in keys of at most max_write_bytes, then deletes
  // every older key in one transaction: a replica that dies in between
  // leaves the old records followed by part of a checkpoint of the state
  // they describe, which reads as the same state.
  absl::Status Rewrite(const std::vector<v1::JournalRecord>& records) override;
  bool WantsRewrite() const override;
  bool HasRoomFor(size_t bytes) const override;
  bool CommitsOverNetwork() const override { return true; }

 private:
  explicit EtcdLog(Options options, uint64_t next_seq);
  // Writes `value` as the next log key, if this replica still leads and
  // the key is new.
  absl::Status Write(const std::string& value);
  // After a write whose answer was lost: whether `value` is what `key`
  // holds, claiming the key with nothing if the write never landed.
  absl::StatusOr<bool> Settle(const std::string& key, const std::string& value);
  absl::Status Deposed(const std::string& why);
  etcdserverpb::TxnRequest Guarded() const;

  const Options options_;
  uint64_t next_seq_;
  std::string pending_;
  // Bytes and keys written since the last Rewrite, and the checkpoint's size.
  uint64_t written_bytes_ = 0;
  uint64_t written_keys_ = 0;
  uint64_t base_bytes_ = 0;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_ETCD_ETCD_LOG_H_
