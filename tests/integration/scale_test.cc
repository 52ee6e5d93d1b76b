// Many agents at once against the real ctrund: its own ctest binary,
// run alone (RUN_SERIAL), since a thousand sessions keep both cores of a
// CI machine busy for seconds and would starve tests beside it.
#include <sys/resource.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/support/daemon.h"
#include "tests/support/session_probe.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

TEST_CASE("1000 clients connecting at once rendezvous into a permutation",
          "[ctrund][integration]") {
  // Each client has its own TCP connection: two descriptors or so apiece.
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  limit.rlim_cur = limit.rlim_max;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &limit) == 0);
  INFO("the hard limit on open files is too low for 1000 connections");
  REQUIRE(limit.rlim_cur >= 2500);
  Daemon daemon;
  constexpr int kNodes = 1000;
  std::mt19937 rng(42);
  std::vector<int> sizes(kNodes);
  for (int& s : sizes) s = 1 + static_cast<int>(rng() % 4);

  std::vector<std::unique_ptr<SessionProbe>> probes;
  for (int i = 0; i < kNodes; ++i) {
    JoinSpec spec;
    spec.host = absl::StrCat("node", i);
    spec.min_nodes = spec.max_nodes = kNodes;
    spec.local_world_size = sizes[i];
    probes.push_back(std::make_unique<SessionProbe>(
        daemon.Connect("", /*own_tcp_connection=*/true), MakeJoin(spec)));
  }
  const int world = std::accumulate(sizes.begin(), sizes.end(), 0);
  std::vector<int> group_ranks;
  std::vector<int> owner(world, -1);
  std::set<std::pair<std::string, int>> masters;
  for (int i = 0; i < kNodes; ++i) {
    auto a = probes[i]->NextAssignment(kWait);
    REQUIRE(a);
    CHECK(a->world_size() == world);
    CHECK(a->group_world_size() == kNodes);
    group_ranks.push_back(a->group_rank());
    masters.emplace(a->master_addr(), a->master_port());
    for (int r = a->first_global_rank(); r < a->first_global_rank() + sizes[i];
         ++r) {
      REQUIRE(r >= 0);
      REQUIRE(r < world);
      CHECK(owner[r] == -1);  // no rank handed out twice
      owner[r] = i;
    }
  }
  std::sort(group_ranks.begin(), group_ranks.end());
  std::vector<int> expected(kNodes);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(group_ranks == expected);
  CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
  CHECK(masters.size() == 1);
}

}  // namespace
}  // namespace ctrun::testing
