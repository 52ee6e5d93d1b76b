#include "rendezvous/core/store_request.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

using Fill = std::function<void(v1::StoreResponse*, KvStore::Values)>;

absl::Status Apply(KvStore& store, const v1::StoreRequest& req, absl::Time now,
                   AnswerLater answer_later, v1::StoreResponse* resp,
                   std::optional<KvStore::WaiterId>* parked,
                   std::vector<KvStore::Fired>* fired) {
  auto read = [&](std::vector<std::string> keys, int64_t wait_ms,
                  Fill fill) -> absl::Status {
    if (wait_ms < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("wait timeout of ", wait_ms, " ms must be >= 0"));
    }
    if (wait_ms == 0) {
      auto values = store.MultiGet(keys);
      if (values.ok()) fill(resp, std::move(*values));
      return values.status();
    }
    const uint64_t id = req.id();
    auto answer = [answer_later, id,
                   fill](absl::StatusOr<KvStore::Values> result) {
      v1::StoreResponse later;
      later.set_id(id);
      if (result.ok()) {
        fill(&later, std::move(*result));
      } else {
        later.set_code(static_cast<int32_t>(result.status().code()));
        later.set_message(std::string(result.status().message()));
      }
      answer_later(std::move(later));
    };
    auto waiter = store.Park(std::move(keys), now + absl::Milliseconds(wait_ms),
                             std::move(answer), fired);
    if (!waiter.ok()) return waiter.status();
    *parked = *waiter;
    return absl::OkStatus();
  };
  auto keys_of = [](const auto& repeated) {
    return std::vector<std::string>(repeated.begin(), repeated.end());
  };

  switch (req.op_case()) {
    case v1::StoreRequest::kSet:
      return store.Set(req.set().key(), req.set().value(), fired);
    case v1::StoreRequest::kGet:
      return read({req.get().key()}, req.get().wait_timeout_ms(),
                  [](v1::StoreResponse* r, KvStore::Values v) {
                    r->mutable_get()->set_value(std::move(v.front()));
                  });
    case v1::StoreRequest::kMultiGet:
      return read(keys_of(req.multi_get().keys()),
                  req.multi_get().wait_timeout_ms(),
                  [](v1::StoreResponse* r, KvStore::Values v) {
                    auto* out = r->mutable_multi_get();
                    for (auto& value : v) out->add_values(std::move(value));
                  });
    case v1::StoreRequest::kWait:
      if (req.wait().timeout_ms() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "wait timeout_ms must be > 0, got ", req.wait().timeout_ms()));
      }
      return read(keys_of(req.wait().keys()), req.wait().timeout_ms(),
                  [](v1::StoreResponse*, KvStore::Values) {});
    case v1::StoreRequest::kAdd: {
      auto value = store.Add(req.add().key(), req.add().delta(), fired);
      if (value.ok()) resp->mutable_add()->set_value(*value);
      return value.status();
    }
    case v1::StoreRequest::kCompareSet: {
      const auto& cs = req.compare_set();
      auto r = store.CompareSet(cs.key(), cs.expected(), cs.desired(), fired);
      if (!r.ok()) return r.status();
      resp->mutable_compare_set()->set_swapped(r->swapped);
      resp->mutable_compare_set()->set_value(std::move(r->value));
      return absl::OkStatus();
    }
    case v1::StoreRequest::kDelete: {
      auto deleted = store.Delete(req.delete_().key());
      if (deleted.ok()) resp->mutable_delete_()->set_deleted(*deleted);
      return deleted.status();
    }
    case v1::StoreRequest::kCheck: {
      auto all = store.Check(keys_of(req.check().keys()));
      if (all.ok()) resp->mutable_check()->set_all_set(*all);
      return all.status();
    }
    case v1::StoreRequest::kNumKeys:
      resp->mutable_num_keys()->set_num_keys(store.NumKeys());
      return absl::OkStatus();
    case v1::StoreRequest::kMultiSet: {
      std::vector<std::pair<std::string, std::string>> kvs;
      kvs.reserve(req.multi_set().entries_size());
      for (const auto& e : req.multi_set().entries()) {
        kvs.emplace_back(e.key(), e.value());
      }
      return store.MultiSet(std::move(kvs), fired);
    }
    case v1::StoreRequest::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("store request without an operation");
}

}  // namespace

bool IsStoreMutation(const v1::StoreRequest& request) {
  switch (request.op_case()) {
    case v1::StoreRequest::kSet:
    case v1::StoreRequest::kAdd:
    case v1::StoreRequest::kCompareSet:
    case v1::StoreRequest::kMultiSet:
    case v1::StoreRequest::kDelete:
      return true;
    default:
      return false;
  }
}

absl::Status ApplyStoreRequest(KvStore& store, const v1::StoreRequest& request,
                               absl::Time now, AnswerLater answer_later,
                               v1::StoreResponse* response,
                               std::optional<KvStore::WaiterId>* parked,
                               std::vector<KvStore::Fired>* fired,
                               std::vector<KvStore::Change>* changed) {
  if (!IsStoreMutation(request)) {
    return Apply(store, request, now, std::move(answer_later), response, parked,
                 fired);
  }
  const KvStore::Mark mark = store.Stage();
  absl::Status status = Apply(store, request, now, std::move(answer_later),
                              response, parked, fired);
  if (status.ok()) {
    *changed = store.ChangesSince(mark);
  } else {
    store.RollbackTo(mark);
  }
  return status;
}

}  // namespace ctrun
