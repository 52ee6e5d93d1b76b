#include "rendezvous/core/job_settings.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

TEST_CASE("Job settings default like torchrun", "[rendezvous][unit]") {
  auto s = ResolveJobSettings({});
  REQUIRE(s.ok());
  CHECK(s->min_nodes() == 1);
  CHECK(s->max_nodes() == 1);
  CHECK(s->max_restarts() == 0);
  CHECK(s->join_timeout_ms() == 600'000);
  CHECK(s->last_call_timeout_ms() == 30'000);
  CHECK(s->heartbeat_timeout_ms() <= 10'000);
}

TEST_CASE("Job settings refuse min above max naming both",
          "[rendezvous][unit]") {
  v1::JobSettings in;
  in.set_min_nodes(3);
  in.set_max_nodes(2);
  auto s = ResolveJobSettings(in);
  REQUIRE(absl::IsInvalidArgument(s.status()));
  CHECK(s.status().message().find("min_nodes 3 exceeds max_nodes 2") !=
        std::string::npos);
}

TEST_CASE("Job settings refuse negative values", "[rendezvous][unit]") {
  v1::JobSettings in;
  in.set_heartbeat_timeout_ms(-1);
  CHECK(absl::IsInvalidArgument(ResolveJobSettings(in).status()));
  in.Clear();
  in.set_max_restarts(-2);
  CHECK(absl::IsInvalidArgument(ResolveJobSettings(in).status()));
  in.Clear();
  in.set_master_port(70000);
  CHECK(absl::IsInvalidArgument(ResolveJobSettings(in).status()));
}

TEST_CASE("Settings difference names the first differing field",
          "[rendezvous][unit]") {
  v1::JobSettings a, b;
  CHECK(DescribeSettingsDifference(a, b).empty());
  b.set_join_timeout_ms(5);
  CHECK(DescribeSettingsDifference(a, b) ==
        "join_timeout_ms is 0 for the job, 5 in this join");
}

}  // namespace
}  // namespace ctrun
