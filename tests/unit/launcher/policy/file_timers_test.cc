// torchrun's file timers: requests as FileTimerClient writes them, and
// which process is killed with which signal.
#include "launcher/policy/file_timers.h"

#include <signal.h>

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

const absl::Time kNow = absl::UnixEpoch() + absl::Hours(5);  // monotonic
const absl::Time kWall = absl::FromUnixSeconds(1'800'000'000);

FileTimerRequest Acquire(pid_t pid, const std::string& scope, double in_s,
                         int signal = SIGKILL) {
  return FileTimerRequest{
      pid, scope, absl::ToDoubleSeconds(kWall - absl::UnixEpoch()) + in_s,
      signal};
}

TEST_CASE("A FileTimerClient line parses", "[timers][unit]") {
  auto r = ParseFileTimerRequest(
      R"({"version": 1, "pid": 4242, "scope_id": "step", )"
      R"("expiration_time": 1800000010.5, "signal": 9})");
  REQUIRE(r.ok());
  CHECK(r->pid == 4242);
  CHECK(r->scope == "step");
  CHECK(r->expiration_time == 1800000010.5);
  CHECK(r->signal == 9);
  auto release = ParseFileTimerRequest(
      R"({"version": 1, "pid": 4242, "scope_id": "step", )"
      R"("expiration_time": -1, "signal": 0})");
  REQUIRE(release.ok());
  CHECK(release->expiration_time < 0);
}

TEST_CASE("Malformed file-timer lines are refused, naming the field",
          "[timers][unit]") {
  CHECK(ParseFileTimerRequest("not json").status().message() ==
        "not a JSON object");
  CHECK(ParseFileTimerRequest(R"({"version": 2, "pid": 1, "scope_id": "s", )"
                              R"("expiration_time": 1, "signal": 9})")
            .status()
            .message() == "version 2 (only 1 is known)");
  CHECK(ParseFileTimerRequest(R"({"version": 1, "scope_id": "s", )"
                              R"("expiration_time": 1, "signal": 9})")
            .status()
            .message() == "\"pid\" is missing or not a number");
  CHECK_FALSE(ParseFileTimerRequest(R"({"version": 1, "pid": 0, )"
                                    R"("scope_id": "s", "expiration_time": 1, )"
                                    R"("signal": 9})")
                  .ok());
}

TEST_CASE("An expired timer names its process, scope and signal",
          "[timers][unit]") {
  FileTimers t;
  REQUIRE(t.Apply(Acquire(100, "data", 5, SIGTERM), kNow, kWall).ok());
  REQUIRE(t.Apply(Acquire(200, "step", 2), kNow, kWall).ok());
  CHECK(t.NextExpiry() == kNow + absl::Seconds(2));
  CHECK(t.TakeExpired(kNow + absl::Seconds(1)).empty());
  auto expired = t.TakeExpired(kNow + absl::Seconds(2));
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 200);
  CHECK(expired[0].scope == "step");
  CHECK(expired[0].signal == SIGKILL);
  CHECK(t.size() == 1);
}

TEST_CASE("A released timer never expires", "[timers][unit]") {
  FileTimers t;
  REQUIRE(t.Apply(Acquire(100, "step", 1), kNow, kWall).ok());
  FileTimerRequest release{100, "step", -1, 0};
  REQUIRE(t.Apply(release, kNow, kWall).ok());
  CHECK(t.TakeExpired(kNow + absl::Hours(1)).empty());
}

TEST_CASE(
    "One process's earliest expired timer with a signal wins, and "
    "its other timers go",
    "[timers][unit]") {
  FileTimers t;
  REQUIRE(t.Apply(Acquire(100, "a", 1, 0), kNow, kWall).ok());  // no signal
  REQUIRE(t.Apply(Acquire(100, "b", 2, SIGTERM), kNow, kWall).ok());
  REQUIRE(t.Apply(Acquire(100, "c", 3, SIGKILL), kNow, kWall).ok());
  REQUIRE(t.Apply(Acquire(100, "d", 60, SIGKILL), kNow, kWall).ok());
  auto expired = t.TakeExpired(kNow + absl::Seconds(10));
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].scope == "b");
  CHECK(expired[0].signal == SIGTERM);
  CHECK(t.size() == 0);
}

TEST_CASE("An expired timer without a signal kills nothing", "[timers][unit]") {
  FileTimers t;
  REQUIRE(t.Apply(Acquire(100, "a", 1, 0), kNow, kWall).ok());
  CHECK(t.TakeExpired(kNow + absl::Seconds(2)).empty());
  CHECK(t.size() == 0);
}

TEST_CASE("File timers are bounded in number", "[timers][unit]") {
  FileTimers t;
  for (size_t i = 0; i < FileTimers::kMaxTimers; ++i) {
    REQUIRE(t.Apply(Acquire(100, std::to_string(i), 60), kNow, kWall).ok());
  }
  CHECK(absl::IsResourceExhausted(
      t.Apply(Acquire(100, "one more", 60), kNow, kWall)));
  // Renewing a held one is fine.
  CHECK(t.Apply(Acquire(100, "0", 90), kNow, kWall).ok());
}

}  // namespace
}  // namespace ctrun
