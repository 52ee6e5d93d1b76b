#include "launcher/workers/run_briefly.h"

#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "launcher/workers/health_check.h"

namespace ctrun {
namespace {

TEST_CASE("A brief command's output comes back, and its failure names it",
          "[run_briefly][unit]") {
  auto ok = RunBriefly({"/bin/sh", "-c", "echo out; echo err >&2"},
                       absl::Seconds(10));
  REQUIRE(ok.ok());
  CHECK(*ok == "out\nerr\n");

  auto failed =
      RunBriefly({"/bin/sh", "-c", "echo why; exit 3"}, absl::Seconds(10));
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().message() ==
        "/bin/sh -c echo why; exit 3 failed (exit 3): why");

  auto missing = RunBriefly({"ctrun-no-such-command"}, absl::Seconds(10));
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::StrContains(missing.status().message(),
                          "cannot run ctrun-no-such-command: "));
}

TEST_CASE("A brief command that runs too long is killed, with its children",
          "[run_briefly][unit]") {
  const absl::Time start = absl::Now();
  // The child keeps the output open: ending the shell alone is not enough.
  auto slow = RunBriefly({"/bin/sh", "-c", "sleep 30 & sleep 30"},
                         absl::Milliseconds(300));
  CHECK(absl::Now() - start < absl::Seconds(5));
  REQUIRE_FALSE(slow.ok());
  CHECK(absl::StrContains(slow.status().message(), "did not end within 300ms"));
}

// Fails before: the output was read to its end, which the background
// process held for 60 s; the check then failed as too slow, and its host
// was quarantined although the check had exited 0.
TEST_CASE(
    "A command that leaves a process in the background ends at its exit, "
    "and the process with it",
    "[run_briefly][unit]") {
  auto ok = RunBriefly({"/bin/sh", "-c", "sleep 60 & echo bg $!; echo done"},
                       absl::Seconds(20));
  REQUIRE(ok.ok());
  CHECK(absl::StartsWith(*ok, "bg "));
  CHECK(absl::EndsWith(*ok, "\ndone\n"));
  const pid_t left = std::stoi(ok->substr(3));
  // Its process group was killed; the sleep is reaped by whoever adopted
  // it (a zombie at most).
  const absl::Time end = absl::Now() + absl::Seconds(10);
  auto alive = [left] {
    std::ifstream stat("/proc/" + std::to_string(left) + "/stat");
    std::string pid, comm, state;
    return stat >> pid >> comm >> state && state != "Z";
  };
  while (alive() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  CHECK_FALSE(alive());
  if (alive()) kill(left, SIGKILL);

  CHECK(RunHealthCommand("sleep 60 >/dev/null 2>&1 & sleep 60 & echo ok",
                         absl::Seconds(20))
            .empty());
  CHECK(RunHealthCommand("sleep 60 & exit 4", absl::Seconds(20)) ==
        "`sleep 60 & exit 4` exited 4");
}

TEST_CASE("A health command passes on exit 0 and fails naming its last line",
          "[health][unit]") {
  CHECK(RunHealthCommand("echo fine; true", absl::Seconds(10)).empty());
  CHECK(RunHealthCommand("echo checking; echo 'disk full' >&2; exit 3",
                         absl::Seconds(10)) ==
        "`echo checking; echo 'disk full' >&2; exit 3` exited 3: disk full");
  CHECK(RunHealthCommand("exit 1", absl::Seconds(10)) == "`exit 1` exited 1");
  CHECK(RunHealthCommand("sleep 30", absl::Milliseconds(200)) ==
        "`sleep 30` did not end within 200ms");
  // What it reads from stdin is nothing: it never waits for a terminal.
  CHECK(RunHealthCommand("read line", absl::Seconds(10)) ==
        "`read line` exited 1");
}

TEST_CASE(
    "A health command's line is cut to 1 KiB of valid UTF-8 without "
    "control characters, and a long output keeps its status",
    "[health][unit]") {
  // Invalid UTF-8 and an escape sequence, then a line far over the cap:
  // the join carries the line as a protobuf string, which must be UTF-8.
  const std::string bad = RunHealthCommand(
      "printf 'a\\377b\\033[2Jc\\n'; exit 1", absl::Seconds(10));
  CHECK(absl::EndsWith(bad, " exited 1: a?b [2Jc"));
  const std::string long_line = RunHealthCommand(
      "head -c 100000 /dev/zero | tr '\\0' x; exit 2", absl::Seconds(10));
  CHECK(absl::StrContains(long_line, " exited 2: xxx"));
  CHECK(long_line.size() < 1024 + 100);
  // A check that passes after saying more than the kept output still
  // passes: its status is at the end.
  CHECK(RunHealthCommand("head -c 100000 /dev/zero | tr '\\0' y; true",
                         absl::Seconds(10))
            .empty());
}

TEST_CASE("A health check under way ends with its owner, its command killed",
          "[health][unit]") {
  std::atomic<bool> called{false};
  const absl::Time start = absl::Now();
  {
    HealthCheck check("sleep 30", nullptr,
                      [&called](std::string) { called = true; });
    absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK_FALSE(called);
  std::string verdict = "unset";
  std::atomic<bool> done{false};
  {
    HealthCheck check(
        "true", [] { return std::string("GPU 0 is sick"); },
        [&](std::string problem) {
          verdict = std::move(problem);
          done = true;
        });
    while (!done) absl::SleepFor(absl::Milliseconds(5));
  }
  CHECK(verdict == "GPU 0 is sick");
}

}  // namespace
}  // namespace ctrun
