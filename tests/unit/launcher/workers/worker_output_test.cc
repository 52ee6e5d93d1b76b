// Worker output: whole prefixed lines, log files, filters.
#include "launcher/workers/worker_output.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

namespace ctrun {
namespace {

// Output written by a WorkerOutput into a pipe, read back.
struct Captured {
  int fds[2];
  Captured() { REQUIRE(pipe(fds) == 0); }
  ~Captured() { close(fds[0]); }
  std::string Read() {
    close(fds[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
    return out;
  }
};

const absl::Time kT0 = absl::UnixEpoch();

TEST_CASE("Worker output is emitted in whole prefixed lines",
          "[launcher][unit]") {
  Captured console;
  {
    Console sink(console.fds[1]);
    WorkerOutput out("[h:3]: ", &sink, -1);
    out.Append("hel", kT0);
    out.Append("lo\nwor", kT0);
    out.Append("ld\n\nlast", kT0);
    out.Finish();
  }
  CHECK(console.Read() == "[h:3]: hello\n[h:3]: world\n[h:3]: \n[h:3]: last\n");
}

TEST_CASE("Worker output goes to its log file without the prefix",
          "[launcher][unit]") {
  Captured file;
  {
    WorkerOutput out("[p]: ", nullptr, dup(file.fds[1]));
    out.Append("a\nb\n", kT0);
  }
  CHECK(file.Read() == "a\nb\n");
}

// A file that the test reads back; removed at the end.
struct ScratchFile {
  std::string path;
  int fd = -1;
  ScratchFile() {
    char name[] = "/tmp/ctrun-unit-out-XXXXXX";
    fd = mkstemp(name);
    REQUIRE(fd >= 0);
    path = name;
  }
  ~ScratchFile() {
    close(fd);
    unlink(path.c_str());
  }
  std::string Read() const {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
};

TEST_CASE("A line without its newline is shown once the worker is quiet",
          "[launcher][unit]") {
  ScratchFile console;
  const absl::Duration wait = WorkerOutput::kPartialAfter;
  {
    Console sink(console.fd);
    WorkerOutput a("[a]: ", &sink, -1), b("[b]: ", &sink, -1);
    a.Append("Password: ", kT0);
    CHECK(a.PartialDue() == kT0 + wait);
    a.ShowPartial(kT0 + wait / 2);  // not quiet long enough yet
    a.ShowPartial(kT0 + wait);      // "[a]: Password: " shown, line open
    CHECK(a.PartialDue() == absl::InfiniteFuture());
    a.Append("secret\n", kT0 + wait);  // the same line goes on
    // A progress bar, and another worker's line in between.
    a.Append("\r 10%", kT0 + 2 * wait);
    a.ShowPartial(kT0 + 3 * wait);
    b.Append("b's line\n", kT0 + 3 * wait);
    a.Append("\r 20%\n", kT0 + 4 * wait);
    // A stream that ends in the middle of a line.
    b.Append("bye", kT0 + 4 * wait);
    b.ShowPartial(kT0 + 5 * wait);
    b.Finish();
    REQUIRE(sink.Flush(absl::Seconds(5)));
  }
  CHECK(console.Read() ==
        "[a]: Password: secret\n"
        "[a]: \r 10%\n"
        "[b]: b's line\n"
        "[a]: \r 20%\n"
        "[b]: bye\n");
}

TEST_CASE("Duplicate filters get matching lines, shown or not",
          "[launcher][unit]") {
  ScratchFile filtered;
  DuplicateFilter duplicate{{"loss", "acc"}, filtered.fd};
  {
    WorkerOutput hidden("[h]: ", nullptr, -1, &duplicate);
    hidden.Append("step 1\nloss 0.5\nacc", kT0);
    // Not shown anywhere, so nothing waits to be shown in part.
    CHECK(hidden.PartialDue() == absl::InfiniteFuture());
    hidden.Finish();
  }
  CHECK(filtered.Read() == "[h]: loss 0.5\n[h]: acc\n");
}

TEST_CASE("Long lines stay whole up to the bound, and log files stay verbatim",
          "[launcher][unit]") {
  const std::string whole(WorkerOutput::kMaxLine, 'w');
  const std::string longer(WorkerOutput::kMaxLine + 10, 'x');
  ScratchFile console, file;
  {
    Console sink(console.fd, 8 << 20);
    WorkerOutput out("[p]: ", &sink, dup(file.fd));
    // Delivered in odd pieces, as pipes do.
    const std::string all = whole + "\n" + longer + "\nend";
    for (size_t i = 0; i < all.size(); i += 4093) {
      out.Append(absl::string_view(all).substr(i, 4093), kT0);
    }
    out.Finish();
    REQUIRE(sink.Flush(absl::Seconds(10)));
  }
  CHECK(file.Read() == whole + "\n" + longer + "\nend");
  CHECK(console.Read() ==
        "[p]: " + whole + "\n[p]: " + longer.substr(0, WorkerOutput::kMaxLine) +
            " [ctrun: cut at 1 MiB; the whole line is in the log file]\n"
            "[p]: end\n");
}

TEST_CASE("Line prefix templates expand known names", "[launcher][unit]") {
  CHECK(ExpandTemplate("[${host}:${rank}]: ",
                       {{"host", "n1"}, {"rank", "7"}}) == "[n1:7]: ");
  CHECK(ExpandTemplate("${role_name}${local_rank}|${nope}|${",
                       {{"role_name", "default"}, {"local_rank", "0"}}) ==
        "default0|${nope}|${");
}

}  // namespace
}  // namespace ctrun
