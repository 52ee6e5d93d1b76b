// StragglerWatch: which rank is named, when, and how often.
#include "rendezvous/core/straggler_watch.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

v1::RankPace Pace(int rank, int64_t mean_us, int64_t steps = 5,
                  bool sections = false) {
  v1::RankPace p;
  p.set_rank(rank);
  p.set_mean_step_us(mean_us);
  p.set_steps(steps);
  p.set_sections(sections);
  return p;
}

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

// Four ranks report every 2 s; rank 3's steps take `slow` times as long.
std::optional<v1::Straggler> Round(StragglerWatch& w, absl::Time at,
                                   double slow) {
  std::optional<v1::Straggler> named;
  for (int r = 0; r < 4; ++r) {
    const int64_t mean = r == 3 ? static_cast<int64_t>(100000 * slow) : 100000;
    auto s = w.Observe(Pace(r, mean), r < 2 ? "a:1" : "b:2", at);
    if (s) named = s;
  }
  return named;
}

TEST_CASE("A rank 30% slower than the others is named once",
          "[straggler][unit]") {
  StragglerWatch w;
  std::optional<v1::Straggler> named;
  int at_report = -1;
  for (int i = 0; i < 10; ++i) {
    auto s = Round(w, kT0 + absl::Seconds(2 * i), 1.3);
    if (s) {
      CHECK_FALSE(named.has_value());  // once
      named = s;
      at_report = i;
    }
  }
  REQUIRE(named.has_value());
  CHECK(at_report == StragglerWatch::kStrikes - 1);
  CHECK(named->rank() == 3);
  CHECK(named->node() == "b:2");
  CHECK(named->ratio() == Approx(1.3));
  CHECK(named->steps() >= StragglerWatch::kMinSteps);
  CHECK(named->median_step_us() == 100000);
  CHECK(w.named().size() == 1);
}

TEST_CASE("Ranks within the factor of each other are not named",
          "[straggler][unit]") {
  StragglerWatch w;
  for (int i = 0; i < 20; ++i) {
    CHECK_FALSE(Round(w, kT0 + absl::Seconds(2 * i), 1.1).has_value());
  }
}

TEST_CASE("A rank slow once in a while is not named", "[straggler][unit]") {
  StragglerWatch w;
  for (int i = 0; i < 20; ++i) {
    CHECK_FALSE(Round(w, kT0 + absl::Seconds(2 * i), i % 2 == 0 ? 1.5 : 1.0)
                    .has_value());
  }
}

TEST_CASE("A lone rank, or stale paces, have nothing to compare with",
          "[straggler][unit]") {
  StragglerWatch w;
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(
        w.Observe(Pace(0, 100000), "a:1", kT0 + absl::Seconds(i)).has_value());
  }
  // The others reported long ago.
  StragglerWatch stale;
  stale.Observe(Pace(1, 100000), "a:1", kT0);
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(
        stale
            .Observe(Pace(0, 500000), "a:1",
                     kT0 + StragglerWatch::kFresh + absl::Seconds(i + 1))
            .has_value());
  }
}

TEST_CASE("Unbelievable paces are ignored", "[straggler][unit]") {
  StragglerWatch w;
  for (int i = 0; i < 10; ++i) {
    const absl::Time at = kT0 + absl::Seconds(2 * i);
    w.Observe(Pace(0, 100000), "a:1", at);
    CHECK_FALSE(w.Observe(Pace(1, 900000, INT64_MAX), "a:1", at).has_value());
    CHECK_FALSE(w.Observe(Pace(1, INT64_MAX), "a:1", at).has_value());
    CHECK_FALSE(w.Observe(Pace(1, -5), "a:1", at).has_value());
  }
}

TEST_CASE("A new round may name the straggler again", "[straggler][unit]") {
  StragglerWatch w;
  int named = 0;
  for (int i = 0; i < 6; ++i)
    named += Round(w, kT0 + absl::Seconds(2 * i), 1.4).has_value();
  w.NewRound();
  for (int i = 6; i < 12; ++i)
    named += Round(w, kT0 + absl::Seconds(2 * i), 1.4).has_value();
  CHECK(named == 2);
  CHECK(w.named().size() == 2);
}

}  // namespace
}  // namespace ctrun
