// KvStore: one scope of a job's key-value store, as a pure data structure.
//
// No threads, sockets or clock: times come in as arguments. A waiting request
// is parked as a callback; operations that satisfy or expire waiters hand the
// callbacks back to the caller (as `Fired`) instead of running them, so the
// caller can run them after releasing its lock.
//
// Mutations can be staged: the service applies a change, journals it, and
// only then commits it (waking its waiters), or rolls it back when the
// journal refused it, so that a change a client was told failed is never
// seen by another.
//
// Not thread-safe: the owner serialises all calls.
#ifndef CTRUN_RENDEZVOUS_CORE_KV_STORE_H_
#define CTRUN_RENDEZVOUS_CORE_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ctrun {

struct KvStoreLimits {
  size_t max_key_bytes = 4096;
  size_t max_value_bytes = 1 << 20;  // 1 MiB
  size_t max_keys = 100000;
  // Keys plus values, in this store (one job's round).
  size_t max_job_bytes = size_t{256} << 20;
  size_t max_keys_per_request = 10000;
  size_t max_waiters = 100000;
};

// Bytes (keys plus values) held by every store that shares it: a daemon's
// limit across all its jobs. Each store adds what it holds and removes it
// when it drops keys or is destroyed.
struct StoreBudget {
  size_t used = 0;
  size_t limit = SIZE_MAX;
};

class KvStore {
 public:
  using Values = std::vector<std::string>;
  // Receives the values of the waited-for keys (in request order), or why
  // the wait ended: DEADLINE_EXCEEDED, ABORTED (scope reset), CANCELLED.
  using Callback = std::function<void(absl::StatusOr<Values>)>;
  using WaiterId = uint64_t;

  // A callback with the result to call it with, for the caller to run.
  struct Fired {
    Callback callback;
    absl::StatusOr<Values> result;
  };

  // One key's state after a mutation: its value, or none once deleted.
  struct Change {
    std::string key;
    std::optional<std::string> value;
  };
  // A point in the staged mutations to roll back to.
  using Mark = size_t;

  // `budget`, when given, must outlive the store.
  explicit KvStore(KvStoreLimits limits = {}, StoreBudget* budget = nullptr)
      : limits_(limits), budget_(budget) {}
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Each mutation appends the waiters it satisfies to `fired` (while
  // staging: on Commit).
  absl::Status Set(const std::string& key, std::string value,
                   std::vector<Fired>* fired);
  // All or nothing: when any pair is refused, nothing is set.
  absl::Status MultiSet(std::vector<std::pair<std::string, std::string>> kvs,
                        std::vector<Fired>* fired);
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta,
                              std::vector<Fired>* fired);
  struct CompareSetResult {
    bool swapped;
    std::string value;  // the value now stored; empty when missing
  };
  absl::StatusOr<CompareSetResult> CompareSet(const std::string& key,
                                              const std::string& expected,
                                              std::string desired,
                                              std::vector<Fired>* fired);

  // Whether the key existed. Waiters are not fired by a delete.
  absl::StatusOr<bool> Delete(const std::string& key);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) const;
  int64_t NumKeys() const { return static_cast<int64_t>(data_.size()); }
  // Calls `fn` with every key and value, in no particular order.
  void ForEach(const std::function<void(const std::string&,
                                        const std::string&)>& fn) const {
    for (const auto& [key, value] : data_) fn(key, value);
  }

  // Values of `keys` in order; NOT_FOUND naming the first missing key.
  absl::StatusOr<Values> MultiGet(const std::vector<std::string>& keys) const;

  // Parks `callback` until every key in `keys` is set (it then receives
  // their values) or `deadline` passes (DEADLINE_EXCEEDED). If every key is
  // already set, it is fired at once through `fired`. Returns the waiter's id
  // for Cancel, or RESOURCE_EXHAUSTED / INVALID_ARGUMENT without parking.
  absl::StatusOr<WaiterId> Park(std::vector<std::string> keys,
                                absl::Time deadline, Callback callback,
                                std::vector<Fired>* fired);
  // Removes a parked waiter without firing it. False when it is not parked
  // (already fired or expired).
  bool Cancel(WaiterId id);

  // Fires waiters whose deadline is at or before `now`.
  void ExpireWaiters(absl::Time now, std::vector<Fired>* fired);
  // The earliest parked deadline, or InfiniteFuture.
  absl::Time NextDeadline() const;

  // Drops every key and fires every waiter with `why`.
  void Reset(const absl::Status& why, std::vector<Fired>* fired);

  size_t num_waiters() const { return waiters_.size(); }
  // Keys plus values held.
  size_t total_bytes() const { return total_bytes_; }

  // Starts staging, if not yet, and returns the point to roll back to.
  // While staging, mutations are kept undoable and wake no waiter.
  Mark Stage();
  // The keys mutated since `mark`, each once, with their values now.
  std::vector<Change> ChangesSince(Mark mark) const;
  // Undoes every mutation since `mark`; staging goes on.
  void RollbackTo(Mark mark);
  // Ends staging, keeping its mutations: wakes the waiters they satisfy.
  void Commit(std::vector<Fired>* fired);

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    Callback callback;
  };

  absl::Status CheckKey(const std::string& key) const;
  absl::Status CheckValue(const std::string& key,
                          const std::string& value) const;
  // Stores without checks; the caller validated key, value and capacity.
  void Store(const std::string& key, std::string value,
             std::vector<Fired>* fired);
  // Adds (or with a negative `delta`, removes) bytes held, here and in the
  // budget.
  void Account(int64_t delta);
  // While staging, remembers `key`'s value before a mutation.
  void RememberBefore(const std::string& key);
  // Whether adding `added_keys` new keys and `added_bytes` bytes fits.
  absl::Status CheckCapacity(size_t added_keys, int64_t added_bytes) const;
  void Unpark(WaiterId id);
  void WakeWatchers(const std::string& key, std::vector<Fired>* fired);

  const KvStoreLimits limits_;
  StoreBudget* const budget_;
  absl::flat_hash_map<std::string, std::string> data_;
  size_t total_bytes_ = 0;

  // Staged mutations, oldest first: each key's value before it.
  bool staging_ = false;
  std::vector<Change> undo_;

  WaiterId next_waiter_id_ = 1;
  absl::flat_hash_map<WaiterId, Waiter> waiters_;
  // key -> waiters that wait for it (among other keys).
  absl::flat_hash_map<std::string, std::vector<WaiterId>> watchers_;
  std::set<std::pair<absl::Time, WaiterId>> deadlines_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_KV_STORE_H_
