#include "rendezvous/core/kv_store.h"

#include <catch2/catch.hpp>
#include <optional>

#include "absl/strings/str_cat.h"

namespace ctrun {
namespace {

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

// Records what a parked callback received.
struct Outcome {
  std::optional<absl::StatusOr<KvStore::Values>> result;
  KvStore::Callback Callback() {
    return [this](absl::StatusOr<KvStore::Values> r) { result = std::move(r); };
  }
};

void RunAll(std::vector<KvStore::Fired>& fired) {
  for (auto& f : fired) f.callback(std::move(f.result));
  fired.clear();
}

TEST_CASE("Store returns what was set", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("a", "1", &fired).ok());
  REQUIRE(store.Set("a", "2", &fired).ok());
  auto values = store.MultiGet({"a"});
  REQUIRE(values.ok());
  CHECK(*values == KvStore::Values{"2"});
  CHECK(store.NumKeys() == 1);
}

TEST_CASE("Store get of a missing key is NOT_FOUND naming the key",
          "[store][unit]") {
  KvStore store;
  auto values = store.MultiGet({"nope"});
  REQUIRE(absl::IsNotFound(values.status()));
  CHECK(values.status().message().find("'nope'") != std::string::npos);
}

TEST_CASE("Store waiter is woken by set with the value", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  auto id =
      store.Park({"k"}, kT0 + absl::Seconds(5), outcome.Callback(), &fired);
  REQUIRE(id.ok());
  CHECK(fired.empty());
  CHECK(store.num_waiters() == 1);
  REQUIRE(store.Set("k", "v", &fired).ok());
  REQUIRE(fired.size() == 1);
  RunAll(fired);
  REQUIRE(outcome.result.has_value());
  REQUIRE(outcome.result->ok());
  CHECK(**outcome.result == KvStore::Values{"v"});
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("Store waiter fires at once when its keys are already set",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("k", "v", &fired).ok());
  Outcome outcome;
  REQUIRE(store.Park({"k"}, kT0, outcome.Callback(), &fired).ok());
  RunAll(fired);
  REQUIRE(outcome.result.has_value());
  CHECK(**outcome.result == KvStore::Values{"v"});
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("Store waiter for several keys fires when the last one is set",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  REQUIRE(store
              .Park({"b", "a", "b"}, kT0 + absl::Seconds(5), outcome.Callback(),
                    &fired)
              .ok());
  REQUIRE(store.Set("a", "1", &fired).ok());
  CHECK(fired.empty());
  REQUIRE(store.Set("b", "2", &fired).ok());
  RunAll(fired);
  REQUIRE(outcome.result.has_value());
  CHECK(**outcome.result == KvStore::Values{"2", "1", "2"});
}

TEST_CASE("Store waiter keeps waiting when a key it saw set is deleted",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  REQUIRE(
      store.Park({"a", "b"}, kT0 + absl::Seconds(5), outcome.Callback(), &fired)
          .ok());
  REQUIRE(store.Set("a", "1", &fired).ok());
  REQUIRE(*store.Delete("a"));
  REQUIRE(store.Set("b", "2", &fired).ok());
  CHECK(fired.empty());
  REQUIRE(store.Set("a", "3", &fired).ok());
  RunAll(fired);
  CHECK(**outcome.result == KvStore::Values{"3", "2"});
}

TEST_CASE("Store waiter times out at its deadline and not before",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  const absl::Time deadline = kT0 + absl::Seconds(2);
  REQUIRE(store.Park({"k"}, deadline, outcome.Callback(), &fired).ok());
  CHECK(store.NextDeadline() == deadline);
  store.ExpireWaiters(deadline - absl::Milliseconds(1), &fired);
  CHECK(fired.empty());
  store.ExpireWaiters(deadline, &fired);
  RunAll(fired);
  REQUIRE(outcome.result.has_value());
  CHECK(absl::IsDeadlineExceeded(outcome.result->status()));
  CHECK(outcome.result->status().message().find("'k'") != std::string::npos);
  CHECK(store.NextDeadline() == absl::InfiniteFuture());
}

TEST_CASE("Store cancelled waiter is never fired", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  auto id =
      store.Park({"k"}, kT0 + absl::Seconds(1), outcome.Callback(), &fired);
  REQUIRE(id.ok());
  CHECK(store.Cancel(*id));
  CHECK_FALSE(store.Cancel(*id));
  REQUIRE(store.Set("k", "v", &fired).ok());
  store.ExpireWaiters(kT0 + absl::Hours(1), &fired);
  CHECK(fired.empty());
}

TEST_CASE("Store reset fires waiters with its status and drops keys",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("a", "1", &fired).ok());
  Outcome outcome;
  REQUIRE(store.Park({"b"}, kT0 + absl::Seconds(1), outcome.Callback(), &fired)
              .ok());
  store.Reset(absl::AbortedError("round ended"), &fired);
  RunAll(fired);
  CHECK(absl::IsAborted(outcome.result->status()));
  CHECK(store.NumKeys() == 0);
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("Store add counts from zero and refuses non-integers",
          "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  CHECK(*store.Add("n", 5, &fired) == 5);
  CHECK(*store.Add("n", -2, &fired) == 3);
  CHECK((*store.MultiGet({"n"}))[0] == "3");
  REQUIRE(store.Set("s", "abc", &fired).ok());
  CHECK(absl::IsInvalidArgument(store.Add("s", 1, &fired).status()));
  REQUIRE(store.Set("big", "9223372036854775807", &fired).ok());
  CHECK(absl::IsOutOfRange(store.Add("big", 1, &fired).status()));
}

TEST_CASE("Store add wakes a waiter for its key", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  Outcome outcome;
  REQUIRE(store.Park({"n"}, kT0 + absl::Seconds(1), outcome.Callback(), &fired)
              .ok());
  REQUIRE(store.Add("n", 1, &fired).ok());
  RunAll(fired);
  CHECK(**outcome.result == KvStore::Values{"1"});
}

TEST_CASE("Store compare_set swaps only on a match", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  auto r = store.CompareSet("k", "x", "y", &fired);
  REQUIRE(r.ok());
  CHECK_FALSE(r->swapped);
  CHECK(r->value.empty());
  CHECK(store.NumKeys() == 0);

  r = store.CompareSet("k", "", "first", &fired);
  CHECK(r->swapped);
  CHECK(r->value == "first");

  r = store.CompareSet("k", "wrong", "second", &fired);
  CHECK_FALSE(r->swapped);
  CHECK(r->value == "first");

  r = store.CompareSet("k", "first", "second", &fired);
  CHECK(r->swapped);
  CHECK((*store.MultiGet({"k"}))[0] == "second");
}

TEST_CASE("Store delete check and num_keys", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("a", "1", &fired).ok());
  REQUIRE(store.Set("b", "2", &fired).ok());
  CHECK(*store.Check({"a", "b"}));
  CHECK_FALSE(*store.Check({"a", "c"}));
  CHECK(store.NumKeys() == 2);
  CHECK(*store.Delete("a"));
  CHECK_FALSE(*store.Delete("a"));
  CHECK_FALSE(*store.Check({"a"}));
  CHECK(store.NumKeys() == 1);
}

TEST_CASE("Store multi_set is all or nothing", "[store][unit]") {
  KvStoreLimits limits;
  limits.max_value_bytes = 4;
  KvStore store(limits);
  std::vector<KvStore::Fired> fired;
  auto s = store.MultiSet({{"a", "1"}, {"b", "too long"}}, &fired);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(store.NumKeys() == 0);
  REQUIRE(store.MultiSet({{"a", "1"}, {"b", "2"}, {"a", "3"}}, &fired).ok());
  CHECK(*store.MultiGet({"a", "b"}) == KvStore::Values{"3", "2"});
}

TEST_CASE("Store refuses an oversized value naming its size and the limit",
          "[store][unit]") {
  KvStore store;  // default limit: 1 MiB
  std::vector<KvStore::Fired> fired;
  auto s = store.Set("k", std::string((1 << 20) + 1, 'x'), &fired);
  REQUIRE(absl::IsInvalidArgument(s));
  CHECK(s.message() ==
        "value for store key 'k' has 1048577 bytes; the limit is 1048576 "
        "(ctrund --max-value-bytes)");
  CHECK(store.Set("k", std::string(1 << 20, 'x'), &fired).ok());
}

TEST_CASE("Store refuses empty and oversized keys", "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  CHECK(absl::IsInvalidArgument(store.Set("", "v", &fired)));
  const absl::Status long_key = store.Set(std::string(4097, 'k'), "v", &fired);
  CHECK(absl::IsInvalidArgument(long_key));
  // The size is said once.
  CHECK(long_key.message() == absl::StrCat("store key '", std::string(64, 'k'),
                                           "...' has 4097 bytes; the limit is "
                                           "4096"));
  CHECK(absl::IsInvalidArgument(store.MultiGet({""}).status()));
}

TEST_CASE(
    "Staged changes wake no waiter until committed, and roll back "
    "whole",
    "[store][unit]") {
  KvStore store;
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("kept", "old", &fired).ok());
  Outcome waiting;
  REQUIRE(
      store.Park({"new"}, kT0 + absl::Seconds(5), waiting.Callback(), &fired)
          .ok());
  const size_t bytes = store.total_bytes();

  const KvStore::Mark start = store.Stage();
  REQUIRE(store.Set("new", "1", &fired).ok());
  REQUIRE(store.Set("kept", "changed", &fired).ok());
  REQUIRE(store.Delete("kept").ok());
  CHECK(fired.empty());  // nobody sees it yet
  const std::vector<KvStore::Change> changes = store.ChangesSince(start);
  REQUIRE(changes.size() == 2);
  CHECK(changes[0].key == "new");
  CHECK(changes[0].value == std::optional<std::string>("1"));
  CHECK(changes[1].key == "kept");
  CHECK(changes[1].value == std::nullopt);

  store.RollbackTo(start);
  store.Commit(&fired);
  CHECK(fired.empty());
  CHECK(store.MultiGet({"kept"})->front() == "old");
  CHECK(absl::IsNotFound(store.MultiGet({"new"}).status()));
  CHECK(store.total_bytes() == bytes);

  store.Stage();
  REQUIRE(store.Set("new", "2", &fired).ok());
  CHECK(fired.empty());
  store.Commit(&fired);
  RunAll(fired);
  REQUIRE(waiting.result);
  CHECK(**waiting.result == KvStore::Values{"2"});
}

TEST_CASE(
    "Stores sharing a budget refuse past it, naming each flag, and "
    "give back what they drop",
    "[store][unit]") {
  StoreBudget budget;
  budget.limit = 100;
  KvStoreLimits limits;
  limits.max_job_bytes = 60;
  std::vector<KvStore::Fired> fired;
  {
    KvStore a(limits, &budget);
    KvStore b(limits, &budget);
    REQUIRE(a.Set("a", std::string(49, 'x'), &fired).ok());  // 50 bytes
    const absl::Status job = a.Set("a2", std::string(20, 'x'), &fired);
    CHECK(absl::IsResourceExhausted(job));
    CHECK(job.message() ==
          "the job's store holds 50 bytes and this adds 22; the limit is 60 "
          "(ctrund --max-job-store-bytes)");
    REQUIRE(b.Set("b", std::string(39, 'x'), &fired).ok());  // 40 bytes
    const absl::Status all = b.Set("b2", std::string(18, 'x'), &fired);
    CHECK(absl::IsResourceExhausted(all));
    CHECK(all.message() ==
          "the stores of all jobs hold 90 bytes and this adds 20; the limit "
          "is 100 (ctrund --max-store-bytes)");
    REQUIRE(a.Delete("a").ok());
    CHECK(budget.used == 40);
    CHECK(b.Set("b2", std::string(18, 'x'), &fired).ok());
    b.Reset(absl::AbortedError("round over"), &fired);
    CHECK(budget.used == 0);
    REQUIRE(a.Set("a", "1", &fired).ok());
  }
  CHECK(budget.used == 0);  // a store that goes gives its bytes back
}

TEST_CASE("Store refuses keys beyond its key limit", "[store][unit]") {
  KvStoreLimits limits;
  limits.max_keys = 2;
  KvStore store(limits);
  std::vector<KvStore::Fired> fired;
  REQUIRE(store.Set("a", "1", &fired).ok());
  REQUIRE(store.Set("b", "1", &fired).ok());
  CHECK(absl::IsResourceExhausted(store.Set("c", "1", &fired)));
  CHECK(store.Set("a", "overwrite is fine", &fired).ok());
  CHECK(absl::IsResourceExhausted(
      store.MultiSet({{"c", "1"}, {"d", "1"}}, &fired)));
}

TEST_CASE("Store refuses waiters beyond its waiter limit", "[store][unit]") {
  KvStoreLimits limits;
  limits.max_waiters = 1;
  KvStore store(limits);
  std::vector<KvStore::Fired> fired;
  Outcome a, b;
  REQUIRE(store.Park({"k"}, kT0, a.Callback(), &fired).ok());
  CHECK(absl::IsResourceExhausted(
      store.Park({"k"}, kT0, b.Callback(), &fired).status()));
}

}  // namespace
}  // namespace ctrun
