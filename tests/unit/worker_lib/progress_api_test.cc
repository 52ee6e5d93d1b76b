// ctrun::Heartbeat and ctrun::Section write the worker's slot of a real
// board file, and nothing outside ctrun or in a forked child.
//
// The library maps the board once per process, on first use: the case
// without a board runs its calls in a child process.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "ctrun/environment.h"
#include "ctrun/progress.h"
#include "ctrun/progress_board.h"

namespace ctrun {
namespace {

using progress::Slot;

TEST_CASE("Outside ctrun, progress calls do nothing", "[progress][unit]") {
  const pid_t child = fork();
  if (child == 0) {
    unsetenv(env::kProgressFile);
    const bool before = ProgressReported();
    Heartbeat();
    { Section s("step"); }
    _exit(before || ProgressReported() ? 1 : 0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// A two-slot board in TMPDIR, mapped for reading.
struct TestBoard {
  TestBoard() {
    const char* tmp = getenv("TMPDIR");
    path =
        std::string(tmp ? tmp : "/tmp") + "/board-" + std::to_string(getpid());
    const size_t size = progress::kHeaderSize + 2 * progress::kSlotSize;
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
    map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(map != MAP_FAILED);
    auto* h = static_cast<progress::Header*>(map);
    std::memcpy(h->magic, progress::kMagic, sizeof h->magic);
    h->slot_count = 2;
    h->slot_size = progress::kSlotSize;
  }
  ~TestBoard() { unlink(path.c_str()); }
  Slot& slot(int i) {
    return *reinterpret_cast<Slot*>(static_cast<char*>(map) +
                                    progress::kHeaderSize +
                                    i * progress::kSlotSize);
  }
  std::string path;
  void* map = nullptr;
};

TEST_CASE("Heartbeats and sections land in the worker's own slot",
          "[progress][unit]") {
  TestBoard board;
  setenv(env::kProgressFile, board.path.c_str(), 1);
  setenv(env::kProgressSlot, "1", 1);
  REQUIRE(ProgressReported());
  Slot& slot = board.slot(1);
  Heartbeat();
  Heartbeat();
  CHECK(slot.beats == 2);
  CHECK(slot.beat_ns > 0);
  CHECK(slot.event_ns == slot.beat_ns);
  {
    Section compute("compute");
    CHECK(std::string(slot.section) == "compute");
    CHECK((slot.flags & progress::kUntimed) == 0);
  }
  CHECK(std::string(slot.section).empty());
  {
    Section save("checkpoint", kUntimed);
    CHECK(slot.flags & progress::kUntimed);
    {
      Section write("write");
      CHECK(std::string(slot.section) == "write");
      CHECK((slot.flags & progress::kUntimed) == 0);
    }
    CHECK(std::string(slot.section) == "checkpoint");
    CHECK(slot.flags & progress::kUntimed);
  }
  CHECK(slot.events == 2 + 2 + 4);
  CHECK(slot.sections_done == 2);  // outermost ones only
  CHECK(slot.busy_ns > 0);
  CHECK(slot.seq % 2 == 0);
  CHECK(board.slot(0).events == 0);  // another worker's
  CHECK((slot.flags & progress::kDone) == 0);
  Done();
  CHECK(slot.flags & progress::kDone);
  // A forked child (a data loader) is not the worker.
  const pid_t child = fork();
  if (child == 0) {
    Heartbeat();
    _exit(ProgressReported() ? 1 : 0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(slot.beats == 2);
}

}  // namespace
}  // namespace ctrun
