#include "rendezvous/core/kv_store.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

constexpr size_t kShownKeyBytes = 64;

// Keys in error messages are cut so that a hostile key cannot flood a log.
std::string Quote(const std::string& key) {
  if (key.size() <= kShownKeyBytes) return absl::StrCat("'", key, "'");
  return absl::StrCat("'", key.substr(0, kShownKeyBytes), "...' (", key.size(),
                      " bytes)");
}

}  // namespace

KvStore::~KvStore() {
  if (budget_ != nullptr) budget_->used -= total_bytes_;
}

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("store key is empty");
  if (key.size() > limits_.max_key_bytes) {
    // The size is the point here, so it is said once.
    return absl::InvalidArgumentError(absl::StrCat(
        "store key '", key.substr(0, kShownKeyBytes), "...' has ", key.size(),
        " bytes; the limit is ", limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckValue(const std::string& key,
                                 const std::string& value) const {
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value for store key ", Quote(key), " has ", value.size(),
                     " bytes; the limit is ", limits_.max_value_bytes,
                     " (ctrund --max-value-bytes)"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckCapacity(size_t added_keys,
                                    int64_t added_bytes) const {
  if (data_.size() + added_keys > limits_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store holds ", data_.size(), " keys; the limit is ",
                     limits_.max_keys, " (ctrund --max-keys)"));
  }
  if (added_bytes <= 0) return absl::OkStatus();
  const size_t added = static_cast<size_t>(added_bytes);
  if (total_bytes_ + added > limits_.max_job_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job's store holds ", total_bytes_,
                     " bytes and this adds ", added, "; the limit is ",
                     limits_.max_job_bytes, " (ctrund --max-job-store-bytes)"));
  }
  if (budget_ != nullptr && budget_->used + added > budget_->limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the stores of all jobs hold ", budget_->used,
                     " bytes and this adds ", added, "; the limit is ",
                     budget_->limit, " (ctrund --max-store-bytes)"));
  }
  return absl::OkStatus();
}

void KvStore::Account(int64_t delta) {
  total_bytes_ += delta;
  if (budget_ != nullptr) budget_->used += delta;
}

void KvStore::RememberBefore(const std::string& key) {
  if (!staging_) return;
  auto it = data_.find(key);
  undo_.push_back({key, it == data_.end()
                            ? std::nullopt
                            : std::optional<std::string>(it->second)});
}

void KvStore::Store(const std::string& key, std::string value,
                    std::vector<Fired>* fired) {
  RememberBefore(key);
  auto [it, inserted] = data_.try_emplace(key);
  const int64_t before =
      inserted ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  Account(static_cast<int64_t>(key.size() + value.size()) - before);
  it->second = std::move(value);
  if (!staging_) WakeWatchers(key, fired);
}

absl::Status KvStore::Set(const std::string& key, std::string value,
                          std::vector<Fired>* fired) {
  if (auto s = CheckKey(key); !s.ok()) return s;
  if (auto s = CheckValue(key, value); !s.ok()) return s;
  auto it = data_.find(key);
  const bool is_new = it == data_.end();
  const int64_t delta = static_cast<int64_t>(value.size()) -
                        (is_new ? -static_cast<int64_t>(key.size())
                                : static_cast<int64_t>(it->second.size()));
  if (auto s = CheckCapacity(is_new ? 1 : 0, delta); !s.ok()) return s;
  Store(key, std::move(value), fired);
  return absl::OkStatus();
}

absl::Status KvStore::MultiSet(
    std::vector<std::pair<std::string, std::string>> kvs,
    std::vector<Fired>* fired) {
  if (kvs.size() > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("multi_set of ", kvs.size(), " keys; the limit is ",
                     limits_.max_keys_per_request));
  }
  size_t new_keys = 0;
  int64_t delta = 0;
  // A key may repeat inside one request; the last value wins, and it is new
  // only once.
  absl::flat_hash_map<std::string, int64_t> seen;
  for (const auto& [key, value] : kvs) {
    if (auto s = CheckKey(key); !s.ok()) return s;
    if (auto s = CheckValue(key, value); !s.ok()) return s;
    auto [sit, first] = seen.try_emplace(key, 0);
    auto it = data_.find(key);
    int64_t old_size;
    if (!first) {
      old_size = sit->second;
    } else if (it == data_.end()) {
      ++new_keys;
      delta += static_cast<int64_t>(key.size());
      old_size = 0;
    } else {
      old_size = static_cast<int64_t>(it->second.size());
    }
    delta += static_cast<int64_t>(value.size()) - old_size;
    sit->second = static_cast<int64_t>(value.size());
  }
  if (auto s = CheckCapacity(new_keys, delta); !s.ok()) return s;
  for (auto& [key, value] : kvs) Store(key, std::move(value), fired);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta,
                                     std::vector<Fired>* fired) {
  if (auto s = CheckKey(key); !s.ok()) return s;
  int64_t current = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    const std::string& text = it->second;
    auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), current);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("add on store key ", Quote(key),
                       " whose value is not a decimal integer"));
    }
  }
  int64_t result;
  if (__builtin_add_overflow(current, delta, &result)) {
    return absl::OutOfRangeError(absl::StrCat("add of ", delta, " to ", current,
                                              " on store key ", Quote(key),
                                              " overflows int64"));
  }
  if (auto s = Set(key, absl::StrCat(result), fired); !s.ok()) return s;
  return result;
}

absl::StatusOr<KvStore::CompareSetResult> KvStore::CompareSet(
    const std::string& key, const std::string& expected, std::string desired,
    std::vector<Fired>* fired) {
  if (auto s = CheckKey(key); !s.ok()) return s;
  auto it = data_.find(key);
  const bool matches =
      it == data_.end() ? expected.empty() : it->second == expected;
  if (!matches) {
    return CompareSetResult{false,
                            it == data_.end() ? std::string() : it->second};
  }
  std::string stored = desired;
  if (auto s = Set(key, std::move(desired), fired); !s.ok()) return s;
  return CompareSetResult{true, std::move(stored)};
}

absl::StatusOr<bool> KvStore::Delete(const std::string& key) {
  if (auto s = CheckKey(key); !s.ok()) return s;
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  RememberBefore(key);
  Account(-static_cast<int64_t>(key.size() + it->second.size()));
  data_.erase(it);
  return true;
}

KvStore::Mark KvStore::Stage() {
  staging_ = true;
  return undo_.size();
}

std::vector<KvStore::Change> KvStore::ChangesSince(Mark mark) const {
  std::vector<Change> changes;
  absl::flat_hash_map<std::string, bool> seen;
  for (size_t i = mark; i < undo_.size(); ++i) {
    const std::string& key = undo_[i].key;
    if (!seen.try_emplace(key, true).second) continue;
    auto it = data_.find(key);
    changes.push_back({key, it == data_.end()
                                ? std::nullopt
                                : std::optional<std::string>(it->second)});
  }
  return changes;
}

void KvStore::RollbackTo(Mark mark) {
  while (undo_.size() > mark) {
    Change& before = undo_.back();
    auto it = data_.find(before.key);
    if (it != data_.end()) {
      Account(-static_cast<int64_t>(it->first.size() + it->second.size()));
      data_.erase(it);
    }
    if (before.value) {
      Account(static_cast<int64_t>(before.key.size() + before.value->size()));
      data_.emplace(std::move(before.key), std::move(*before.value));
    }
    undo_.pop_back();
  }
}

void KvStore::Commit(std::vector<Fired>* fired) {
  std::vector<Change> changes = ChangesSince(0);
  staging_ = false;
  undo_.clear();
  for (const auto& change : changes) WakeWatchers(change.key, fired);
}

absl::StatusOr<bool> KvStore::Check(
    const std::vector<std::string>& keys) const {
  if (keys.size() > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("check of ", keys.size(), " keys; the limit is ",
                     limits_.max_keys_per_request));
  }
  for (const auto& key : keys) {
    if (auto s = CheckKey(key); !s.ok()) return s;
  }
  return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) {
    return data_.contains(k);
  });
}

absl::StatusOr<KvStore::Values> KvStore::MultiGet(
    const std::vector<std::string>& keys) const {
  if (keys.size() > limits_.max_keys_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("get of ", keys.size(), " keys; the limit is ",
                     limits_.max_keys_per_request));
  }
  Values values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    if (auto s = CheckKey(key); !s.ok()) return s;
    auto it = data_.find(key);
    if (it == data_.end()) {
      return absl::NotFoundError(
          absl::StrCat("store key ", Quote(key), " is not set"));
    }
    values.push_back(it->second);
  }
  return values;
}

absl::StatusOr<KvStore::WaiterId> KvStore::Park(std::vector<std::string> keys,
                                                absl::Time deadline,
                                                Callback callback,
                                                std::vector<Fired>* fired) {
  if (keys.empty()) return absl::InvalidArgumentError("wait for no keys");
  auto values = MultiGet(keys);
  if (values.ok()) {
    fired->push_back({std::move(callback), std::move(values)});
    return 0;
  }
  if (!absl::IsNotFound(values.status())) return values.status();
  if (waiters_.size() >= limits_.max_waiters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("store has ", waiters_.size(),
                     " parked waits; the limit is ", limits_.max_waiters));
  }
  const WaiterId id = next_waiter_id_++;
  std::vector<std::string> distinct = keys;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (const auto& key : distinct) watchers_[key].push_back(id);
  deadlines_.emplace(deadline, id);
  waiters_.emplace(id, Waiter{std::move(keys), deadline, std::move(callback)});
  return id;
}

void KvStore::Unpark(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  for (const auto& key : it->second.keys) {
    auto wit = watchers_.find(key);
    if (wit == watchers_.end()) continue;
    auto& ids = wit->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) watchers_.erase(wit);
  }
  deadlines_.erase({it->second.deadline, id});
  waiters_.erase(it);
}

bool KvStore::Cancel(WaiterId id) {
  if (!waiters_.contains(id)) return false;
  Unpark(id);
  return true;
}

void KvStore::WakeWatchers(const std::string& key, std::vector<Fired>* fired) {
  auto wit = watchers_.find(key);
  if (wit == watchers_.end()) return;
  // Copy: Unpark edits the list we iterate.
  const std::vector<WaiterId> ids = wit->second;
  for (WaiterId id : ids) {
    auto it = waiters_.find(id);
    // A waiter for several keys fires when the last one is set; a key set
    // earlier may have been deleted since, so all are checked again.
    auto values = MultiGet(it->second.keys);
    if (!values.ok()) continue;
    fired->push_back({std::move(it->second.callback), std::move(values)});
    Unpark(id);
  }
}

void KvStore::ExpireWaiters(absl::Time now, std::vector<Fired>* fired) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const WaiterId id = deadlines_.begin()->second;
    auto& waiter = waiters_.at(id);
    std::string missing;
    for (const auto& key : waiter.keys) {
      if (data_.contains(key)) continue;
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", Quote(key));
    }
    fired->push_back({std::move(waiter.callback),
                      absl::DeadlineExceededError(absl::StrCat(
                          "timed out waiting for store key(s) ", missing))});
    Unpark(id);
  }
}

absl::Time KvStore::NextDeadline() const {
  return deadlines_.empty() ? absl::InfiniteFuture()
                            : deadlines_.begin()->first;
}

void KvStore::Reset(const absl::Status& why, std::vector<Fired>* fired) {
  for (auto& [id, waiter] : waiters_) {
    fired->push_back({std::move(waiter.callback), why});
  }
  waiters_.clear();
  watchers_.clear();
  deadlines_.clear();
  data_.clear();
  Account(-static_cast<int64_t>(total_bytes_));
  staging_ = false;
  undo_.clear();
}

}  // namespace ctrun
