// A process's state, as /proc shows it.
#include "launcher/workers/proc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>

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

TEST_CASE("A listening TCP port is seen, a closed one is not",
          "[launcher][unit]") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);
  CHECK_FALSE(ListensOn(port));  // bound, not listening
  REQUIRE(listen(fd, 1) == 0);
  CHECK(ListensOn(port));
  close(fd);
  CHECK_FALSE(ListensOn(port));
}

TEST_CASE("A file is read from an offset, and a FIFO in its place at once",
          "[proc][unit]") {
  const char* tmp = getenv("TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/ctrun-proc-" +
                          std::to_string(getpid());
  REQUIRE(mkdir(dir.c_str(), 0700) == 0);
  const std::string file = dir + "/stacks", fifo = dir + "/fifo";
  {
    FILE* f = fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    fputs("old dump\nnew dump\n", f);
    fclose(f);
  }
  CHECK(ReadProcFile(file, 1 << 20, 9) == "new dump\n");
  CHECK(ReadProcFile(file, 1 << 20, 100).empty());
  CHECK(ReadProcFile(file) == "old dump\nnew dump\n");
  // A FIFO nobody writes: never waited on.
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(ReadProcFile(fifo, 1 << 20, 9).empty());
  unlink(file.c_str());
  unlink(fifo.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace ctrun
