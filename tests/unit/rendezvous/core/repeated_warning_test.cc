// RepeatedWarning: a failure that repeats is said once, then once per
// period with a count, on a fake clock.
#include "rendezvous/core/repeated_warning.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);

TEST_CASE("A failure every tick for an hour is said 61 times, not 72000",
          "[warning][unit]") {
  RepeatedWarning w(absl::Minutes(1));
  int said = 0;
  std::optional<std::string> last;
  for (absl::Time t = kStart; t < kStart + absl::Hours(1);
       t += absl::Milliseconds(50)) {
    if (auto line = w.Failed("cannot renew the etcd lease: down", t)) {
      ++said;
      last = line;
    }
  }
  CHECK(said == 60);
  REQUIRE(last);
  CHECK(*last ==
        "cannot renew the etcd lease: down (1200 more failures in 1m)");
  CHECK(w.failures() == 72000);
  CHECK(w.Succeeded("renewed the etcd lease") ==
        "renewed the etcd lease again, after 72000 failures");
  CHECK(w.failures() == 0);
  CHECK_FALSE(w.Succeeded("renewed the etcd lease"));
}

TEST_CASE("The first failure after a success is said at once",
          "[warning][unit]") {
  RepeatedWarning w(absl::Minutes(1));
  CHECK(w.Failed("x", kStart) == "x");
  CHECK_FALSE(w.Failed("x", kStart + absl::Seconds(1)));
  CHECK(w.Succeeded("ok") == "ok again, after 2 failures");
  CHECK(w.Failed("x", kStart + absl::Seconds(2)) == "x");
}

}  // namespace
}  // namespace ctrun
