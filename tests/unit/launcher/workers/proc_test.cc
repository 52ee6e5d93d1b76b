// A process's state, as /proc shows it.
#include "launcher/workers/proc.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"

namespace ctrun {
namespace {

TEST_CASE("A process's state reads as /proc shows it, and a gone one as gone",
          "[launcher][unit]") {
  CHECK(absl::StartsWith(DescribeProcessState(getpid()), "R (running)"));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  CHECK(DescribeProcessState(child) == "gone");
}

}  // namespace
}  // namespace ctrun
