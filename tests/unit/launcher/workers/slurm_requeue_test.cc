#include "launcher/workers/slurm_requeue.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace ctrun {
namespace {

TEST_CASE("A brief command's output comes back, and its failure names it",
          "[slurm][unit]") {
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
          "[slurm][unit]") {
  const absl::Time start = absl::Now();
  // The child keeps the output open: ending the shell alone is not enough.
  auto slow = RunBriefly({"/bin/sh", "-c", "sleep 30 & sleep 30"},
                         absl::Milliseconds(300));
  CHECK(absl::Now() - start < absl::Seconds(5));
  REQUIRE_FALSE(slow.ok());
  CHECK(absl::StrContains(slow.status().message(), "did not end within 300ms"));
}

}  // namespace
}  // namespace ctrun
