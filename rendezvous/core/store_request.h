// One store request (store.proto) applied to a job's KvStore: the Store
// service's handler without its stream, pure like the store itself.
#ifndef CTRUN_RENDEZVOUS_CORE_STORE_REQUEST_H_
#define CTRUN_RENDEZVOUS_CORE_STORE_REQUEST_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ctrun/v1/store.pb.h"
#include "rendezvous/core/kv_store.h"

namespace ctrun {

// Receives the response of a parked request once its wait ends (the values,
// or why not), with `id` already set.
using AnswerLater = std::function<void(v1::StoreResponse)>;

// Whether `request` may change the store (set, add, compare_set, multi_set,
// delete); every other operation only reads it.
bool IsStoreMutation(const v1::StoreRequest& request);

// Applies `request` at `now`, filling `response` (its id is the caller's to
// set). A mutation is staged (kv_store.h): `*changed` gets the keys it
// changed with their new values, and the caller journals them, then
// commits the store or rolls it back; a mutation that fails leaves the store
// as it was. A read that waits is parked instead: `*parked` then holds its
// waiter id (0 when it was answered at once through `answer_later`), and
// the caller must not answer it. Waiters that a read satisfies at once are
// appended to `fired`. INVALID_ARGUMENT for a request without an operation
// or with a negative wait; the store's own codes otherwise.
absl::Status ApplyStoreRequest(KvStore& store, const v1::StoreRequest& request,
                               absl::Time now, AnswerLater answer_later,
                               v1::StoreResponse* response,
                               std::optional<KvStore::WaiterId>* parked,
                               std::vector<KvStore::Fired>* fired,
                               std::vector<KvStore::Change>* changed);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_STORE_REQUEST_H_
