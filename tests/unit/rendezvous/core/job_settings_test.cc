#include "rendezvous/core/job_settings.h"

#include <catch2/catch.hpp>

#include "rendezvous/core/failure_class.h"

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

TEST_CASE(
    "Failure classes to restart on: read from a list, written back alike, "
    "the default all but user_error, unknown ones refused naming the names",
    "[rendezvous][unit]") {
  CHECK(FormatRestartOn(*ParseRestartOn("all")) == "all");
  CHECK(FormatRestartOn(*ParseRestartOn("default")) == "default");
  CHECK(FormatRestartOn(0) == "default");
  CHECK(*ParseRestartOn("default") == RestartOnDefault());
  CHECK(FormatRestartOn(*ParseRestartOn("oom, network,oom")) == "oom,network");
  CHECK(*ParseRestartOn("default,user_error") == RestartOnAll());
  CHECK_FALSE(RestartsOn(0, v1::USER_ERROR));
  CHECK(RestartsOn(0, v1::FAILURE_CLASS_UNSPECIFIED));  // read as other
  CHECK(RestartsOn(*ParseRestartOn("other"), v1::FAILURE_CLASS_UNSPECIFIED));
  CHECK_FALSE(RestartsOn(*ParseRestartOn("hang"), v1::OTHER));
  for (const char* bad : {"", "typo", "oom,", "OOM"}) {
    CAPTURE(bad);
    auto parsed = ParseRestartOn(bad);
    REQUIRE(absl::IsInvalidArgument(parsed.status()));
    CHECK(parsed.status().message().find(
              "is not a failure class; use a comma-separated list of all, "
              "default, user_error, oom, hardware, network, hang, signal, "
              "other") != std::string::npos);
  }
  // A job's settings take the default for 0 and refuse classes unknown
  // here; a join that asks for other classes names the difference.
  v1::JobSettings in;
  CHECK(ResolveJobSettings(in)->restart_on() == RestartOnDefault());
  in.set_restart_on(1u << 20);
  CHECK(absl::IsInvalidArgument(ResolveJobSettings(in).status()));
  v1::JobSettings a, b;
  b.set_restart_on(RestartOnAll());
  CHECK(DescribeSettingsDifference(a, b).find("restart_on is 0 for the job") ==
        0);
}

}  // namespace
}  // namespace ctrun
