// The cost of one progress signal from a C++ worker: ctrun::Heartbeat(),
// a Section's start and end, and the clock read each includes (the floor),
// against a real board file as the agent makes it. One JSON object a line.
//
//   heartbeat_bench [--calls N]
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "ctrun/environment.h"
#include "ctrun/progress.h"
#include "ctrun/progress_board.h"

namespace {

template <typename F>
double NanosPerCall(long calls, F f) {
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) f();
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() /
         static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 10'000'000;
  if (argc == 3 && std::string(argv[1]) == "--calls") calls = atol(argv[2]);
  char path[] = "/tmp/ctrun-heartbeat-bench-XXXXXX";
  const int fd = mkstemp(path);
  const size_t size = ctrun::progress::kHeaderSize + ctrun::progress::kSlotSize;
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return 1;
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  auto* header = static_cast<ctrun::progress::Header*>(map);
  std::memcpy(header->magic, ctrun::progress::kMagic, sizeof header->magic);
  header->slot_count = 1;
  header->slot_size = ctrun::progress::kSlotSize;
  setenv(ctrun::env::kProgressFile, path, 1);
  setenv(ctrun::env::kProgressSlot, "0", 1);
  if (!ctrun::ProgressReported()) return 1;

  const double floor = NanosPerCall(calls, [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    asm volatile("" : : "r"(&ts) : "memory");
  });
  const double beat = NanosPerCall(calls, [] { ctrun::Heartbeat(); });
  const double section =
      NanosPerCall(calls / 10, [] { ctrun::Section s("step"); });
  std::printf(
      "{\"bench\": \"heartbeat\", \"impl\": \"ctrun-c++\", \"calls\": %ld, "
      "\"heartbeat_ns\": %.1f, \"section_ns\": %.1f, \"clock_floor_ns\": "
      "%.1f}\n",
      calls, beat, section, floor);
  munmap(map, size);
  unlink(path);
  return 0;
}
