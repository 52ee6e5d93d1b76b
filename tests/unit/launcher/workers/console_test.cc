#include "launcher/workers/console.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace ctrun {
namespace {

// A pipe whose read end the test drains only when it chooses to.
struct Pipe {
  int read_fd = -1, write_fd = -1;
  Pipe() {
    int fds[2];
    REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
    read_fd = fds[0];
    write_fd = fds[1];
  }
  ~Pipe() {
    if (read_fd >= 0) close(read_fd);
    if (write_fd >= 0) close(write_fd);
  }
  // Everything written until the write end closes.
  std::string ReadAll() {
    std::string out;
    char buf[65536];
    ssize_t n;
    while ((n = read(read_fd, buf, sizeof buf)) > 0) out.append(buf, n);
    return out;
  }
};

std::string WorkerLine(int i) { return absl::StrCat("line ", i, "\n"); }

TEST_CASE(
    "A console nobody reads never blocks the writer, and drops are counted",
    "[console][unit]") {
  Pipe pipe;
  constexpr int kLines = 200'000;  // ~2.3 MB: far more than pipe and queue
  auto console = std::make_unique<Console>(pipe.write_fd, 64 << 10);
  const absl::Time start = absl::Now();
  for (int i = 0; i < kLines; ++i) console->WriteWorkerLine(WorkerLine(i));
  console->WriteAgentLine("ctrun: the agent's own line\n");
  // Each call only appends to a buffer; a blocking write would never return.
  CHECK(absl::Now() - start < absl::Seconds(5));
  const uint64_t dropped = console->dropped_lines();
  CHECK(dropped > kLines / 2);
  CHECK_FALSE(console->Flush(absl::Milliseconds(50)));

  // Now the console drains: what was kept arrives whole and in order, the
  // agent's line is not lost, and every drop is told.
  std::string out;
  std::thread reader([&] { out = pipe.ReadAll(); });
  CHECK(console->Flush(absl::Seconds(10)));
  console.reset();
  close(pipe.write_fd);
  pipe.write_fd = -1;
  reader.join();

  int last = -1, kept = 0;
  uint64_t told = 0;
  bool agent_line = false;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    int i;
    if (absl::ConsumePrefix(&line, "line ") && absl::SimpleAtoi(line, &i)) {
      CHECK(i > last);
      last = i;
      ++kept;
    } else if (line == "ctrun: the agent's own line") {
      agent_line = true;
    } else {
      // A notice each time the console caught up after drops.
      uint64_t n = 0;
      REQUIRE(absl::ConsumePrefix(&line, "ctrun: "));
      REQUIRE(absl::ConsumeSuffix(
          &line,
          " lines of worker output were dropped: the console did not keep up "
          "(--tee or --redirects keep every line in --log_dir)"));
      REQUIRE(absl::SimpleAtoi(line, &n));
      told += n;
    }
  }
  CHECK(agent_line);
  CHECK(told == dropped);
  CHECK(kept + dropped == kLines);
  CHECK(out.back() == '\n');
}

TEST_CASE("A console that is never read does not hold up the exit",
          "[console][unit]") {
  Pipe pipe;
  const absl::Time start = absl::Now();
  {
    Console console(pipe.write_fd, 1 << 20);
    for (int i = 0; i < 100'000; ++i) console.WriteWorkerLine(WorkerLine(i));
  }
  // The destructor gives up once nothing has been taken for kStallTimeout.
  CHECK(absl::Now() - start < Console::kStallTimeout + absl::Seconds(2));
}

TEST_CASE("A console that went away swallows what is written",
          "[console][unit]") {
  // The launcher ignores SIGPIPE: the write fails with EPIPE instead.
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  {
    Pipe pipe;
    close(pipe.read_fd);
    pipe.read_fd = -1;
    Console console(pipe.write_fd);
    console.WriteAgentLine("ctrun: nobody reads this\n");
    CHECK(console.Flush(absl::Seconds(5)));
    console.WriteWorkerLine("more\n");
    CHECK(console.Flush(absl::Seconds(1)));
  }
  sigaction(SIGPIPE, &previous, nullptr);
}

}  // namespace
}  // namespace ctrun
