// WorkerStore: the job's key-value store, scoped to the current round.
//
// Keys set in one round are gone in the next (a restart starts clean), and a
// worker left over from an ended round gets ABORTED instead of stale data.
// Thread-safe; one stream to the store carries every thread's calls.
#ifndef CTRUN_STORE_H_
#define CTRUN_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/worker.h"

namespace ctrun {

class WorkerStore {
 public:
  // FAILED_PRECONDITION when `identity` has no store (not started by
  // ctrun); INVALID_ARGUMENT for a malformed endpoint. Does not connect
  // until the first call.
  static absl::StatusOr<std::unique_ptr<WorkerStore>> Connect(
      const WorkerIdentity& identity);
  ~WorkerStore();

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `wait` for the key; DEADLINE_EXCEEDED after it, NOT_FOUND
  // at once with a zero wait.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration wait = absl::ZeroDuration());
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout);
  absl::StatusOr<bool> Delete(const std::string& key);

  class Impl;

 private:
  explicit WorkerStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun

#endif  // CTRUN_STORE_H_
