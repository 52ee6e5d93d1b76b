#include "launcher/policy/job_recap.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1000);

TEST_CASE("A job without failures says its rounds and wall time, nothing lost",
          "[recap][unit]") {
  JobRecap r;
  r.Start(t0);
  r.RoundStarted(0, 0, 3, 4, t0 + absl::Milliseconds(50));
  r.Stepped(4, t0 + absl::Seconds(1));
  CHECK(r.Line(0, t0 + absl::Seconds(62)) ==
        "job ended with exit 0 after 1m2s: 1 round, restarts used 0/3, 0 "
        "processes started anew, 0.00s lost to failures");
  // Under a minute, as the usage line says a rank's wall: to a tenth,
  // rounded, not cut (it said 1.6s beside the usage line's 1.7s).
  CHECK(r.Line(0, t0 + absl::Milliseconds(1660)).find("after 1.7s: ") !=
        std::string::npos);
  CHECK(FormatWall(absl::Milliseconds(1660)) == "1.7s");
  CHECK(FormatWall(absl::Seconds(125.7)) == "2m5s");
}

TEST_CASE(
    "Time lost runs from the round's end here to the first step after the "
    "next round's start",
    "[recap][unit]") {
  JobRecap r;
  r.Start(t0);
  r.RoundStarted(0, 0, 3, 4, t0);
  r.Stepped(100, t0 + absl::Seconds(10));
  r.RoundEnded(t0 + absl::Seconds(20));
  r.RoundEnded(t0 + absl::Seconds(21));      // the first end counts
  r.Stepped(103, t0 + absl::Seconds(20.1));  // the old round, still ending
  r.RoundStarted(1, 1, 3, 1, t0 + absl::Seconds(20.2));
  r.Stepped(90, t0 + absl::Seconds(20.3));  // a new process: slot restarts
  r.Stepped(95, t0 + absl::Seconds(20.5));  // the first step after it
  r.Stepped(99, t0 + absl::Seconds(30));
  CHECK(r.Line(0, t0 + absl::Seconds(40)) ==
        "job ended with exit 0 after 40.0s: 2 rounds, restarts used 1/3, 1 "
        "process started anew, 0.50s lost to failures");
}

TEST_CASE(
    "Without a step after the last round change, the loss counts to that "
    "round's start and says so",
    "[recap][unit]") {
  JobRecap r;
  r.Start(t0);
  r.RoundStarted(0, 0, 1, 2, t0);
  r.RoundEnded(t0 + absl::Seconds(5));
  r.RoundStarted(1, 1, 1, 2, t0 + absl::Seconds(9));
  CHECK(r.Line(137, t0 + absl::Seconds(12)) ==
        "job ended with exit 137 after 12.0s: 2 rounds, restarts used 1/1, 2 "
        "processes started anew, 4.00s lost to failures (to the next "
        "round's start: no step was signalled after it)");
}

}  // namespace
}  // namespace ctrun
