// One store request (store.proto) applied to a job's KvStore: the Store
// service's handler without its stream, pure like the store itself.
#ifndef CTRUN_RENDEZVOUS_STORE_REQUEST_H_
#define CTRUN_RENDEZVOUS_STORE_REQUEST_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ctrun/v1/store.pb.h"
#include "rendezvous/kv_store.h"

namespace ctrun {

// Receives the response of a parked request once its wait ends (the values,
// or why not), with `id` already set.
using AnswerLater = std::function<void(v1::StoreResponse)>;

// Applies `request` at `now`, filling `response` (its id is the caller's to
// set). A read that waits is parked instead: `*parked` then holds its
// waiter id (0 when it was answered at once through `answer_later`), and
// the caller must not answer it. Waiters that the request satisfies are
// appended to `fired`. INVALID_ARGUMENT for a request without an operation
// or with a negative wait; the store's own codes otherwise.
absl::Status ApplyStoreRequest(KvStore& store, const v1::StoreRequest& request,
                               absl::Time now, AnswerLater answer_later,
                               v1::StoreResponse* response,
                               std::optional<KvStore::WaiterId>* parked,
                               std::vector<KvStore::Fired>* fired);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_STORE_REQUEST_H_
