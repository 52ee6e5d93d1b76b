// Torch's error files and the failure summary.
#include "launcher/policy/failure_report.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

std::string TempFile(const std::string& content) {
  char path[] = "/tmp/ctrun-unit-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(write(fd, content.data(), content.size()) ==
          static_cast<ssize_t>(content.size()));
  close(fd);
  return path;
}

TEST_CASE("Error files in torch's record format are read", "[launcher][unit]") {
  const std::string path = TempFile(
      R"({"message": {"message": "ValueError: bad", "extraInfo": )"
      R"({"py_callstack": "Traceback (most recent call last):\n  x\n", )"
      R"("timestamp": "1700000000"}}})");
  auto c = ReadErrorFile(path);
  REQUIRE(c.ok());
  CHECK(c->message == "ValueError: bad");
  CHECK(c->traceback == "Traceback (most recent call last):\n  x");
  unlink(path.c_str());
  CHECK(absl::IsNotFound(ReadErrorFile("/nonexistent/error.json").status()));
  const std::string junk = TempFile("not json");
  CHECK(absl::IsInvalidArgument(ReadErrorFile(junk).status()));
  unlink(junk.c_str());
  // A FIFO that a worker put in its error file's place, nobody writing
  // it: refused at once, not waited on.
  const std::string fifo = TempFile("");
  unlink(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(absl::IsInvalidArgument(ReadErrorFile(fifo).status()));
  unlink(fifo.c_str());
}

TEST_CASE("The failure summary shows the root cause first with its signal",
          "[launcher][unit]") {
  WorkerFailureRecord root{absl::Now(), "node-a",       3,  1,    0, SIGSEGV,
                           4242,        "/nonexistent", "", false};
  WorkerFailureRecord later{absl::Now(), "node-a",       0,  0,    1, 0,
                            4240,        "/nonexistent", "", false};
  CHECK(root.ExitCode() == 128 + SIGSEGV);
  CHECK(later.ExitCode() == 1);
  const std::string s = FormatFailureSummary("train.py", {root, later});
  CHECK(s.find("train.py FAILED") != std::string::npos);
  const size_t root_at = s.find("Root Cause");
  REQUIRE(root_at != std::string::npos);
  CHECK(s.find("rank       : 3 (local_rank: 1)", root_at) != std::string::npos);
  CHECK(s.find("SIGSEGV", root_at) != std::string::npos);
  CHECK(s.find("pid: 4242") != std::string::npos);
  CHECK(s.find("rank       : 0 (local_rank: 0)") < root_at);
}

}  // namespace
}  // namespace ctrun
