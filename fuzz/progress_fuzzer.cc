// What workers write that the agent reads: the progress board (any bytes in
// any slot, the header included) and torchrun's file-timer requests (any
// line). Read, monitored and applied, never a crash, and the monitor's
// figures stay within what the agent saw.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ctrun/progress_board.h"
#include "launcher/policy/file_timers.h"
#include "launcher/policy/progress_monitor.h"
#include "launcher/workers/agent_board.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ctrun;
  constexpr int kSlots = 3;
  const absl::Time start = absl::UnixEpoch() + absl::Hours(1);
  if (size == 0) return 0;
  // The first byte splits the input: a timer line, then board bytes.
  const size_t split = std::min<size_t>(data[0], size - 1);
  const std::string line(reinterpret_cast<const char*>(data) + 1, split);
  FileTimers timers;
  if (auto request = ParseFileTimerRequest(line); request.ok()) {
    (void)timers.Apply(*request, start, absl::Now());
    for (const auto& expired : timers.TakeExpired(start + absl::Hours(24))) {
      if (expired.pid == 0 && expired.scope.empty()) std::abort();
    }
  }

  static auto board = ProgressBoard::Create(kSlots);
  if (!board.ok()) std::abort();
  const size_t bytes = progress::kHeaderSize + kSlots * progress::kSlotSize;
  const int fd = open((*board)->path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) std::abort();
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) std::abort();
  std::memset(map, 0, bytes);
  const size_t rest = size - (split + 1);
  std::memcpy(map, data + (size - rest), std::min(rest, bytes));
  munmap(map, bytes);

  ProgressMonitor monitor(HangTimeout::Parse("2").value());
  monitor.Start({0, 1, 2}, start);
  for (int poll = 1; poll <= 3; ++poll) {
    const absl::Time now = start + poll * ProgressMonitor::kPollEvery;
    for (const SilentWorker& s : monitor.Observe((*board)->Read(), now)) {
      if (s.since < start || s.since > now) std::abort();
    }
    (void)monitor.TakeReport(0, now);
  }
  for (int i = -1; i <= kSlots; ++i) (void)(*board)->StacksOf(i);
  return 0;
}
