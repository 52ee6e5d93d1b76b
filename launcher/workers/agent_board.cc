#include "launcher/workers/agent_board.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ctrun/progress_board.h"

namespace ctrun {
namespace {

using progress::Slot;

absl::Time FromMonotonicNs(int64_t ns) {
  return ns == 0 ? absl::InfinitePast()
                 : absl::UnixEpoch() + absl::Nanoseconds(ns);
}

Slot* SlotAt(void* map, int i) {
  return reinterpret_cast<Slot*>(static_cast<char*>(map) +
                                 progress::kHeaderSize +
                                 static_cast<size_t>(i) * progress::kSlotSize);
}

}  // namespace

std::string SanitizeUtf8(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    // The length of the sequence `c` leads, and the range of its second
    // byte (which rules out overlong forms, surrogates and > U+10FFFF).
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      n = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = n > 0 && i + n <= bytes.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      ok = k == 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xBF;
    }
    if (ok) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.push_back('?');
      ++i;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ProgressBoard>> ProgressBoard::Create(
    int slots) {
  const size_t size =
      progress::kHeaderSize + static_cast<size_t>(slots) * progress::kSlotSize;
  const int fd =
      memfd_create("ctrun-progress-board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  const auto fail = [fd](const char* what) {
    const std::string why = strerror(errno);
    if (fd >= 0) close(fd);
    return absl::InternalError(
        absl::StrCat("cannot make the progress board (", what, "): ", why));
  };
  if (fd < 0) return fail("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate");
  // Workers open it read-write through /proc (O_TRUNC included); the seals
  // make every change of size fail for them, and for the agent too.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("sealing");
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail("mmap");
  auto* header = static_cast<progress::Header*>(map);
  std::memcpy(header->magic, progress::kMagic, sizeof header->magic);
  header->slot_count = static_cast<uint32_t>(slots);
  header->slot_size = progress::kSlotSize;
  return std::unique_ptr<ProgressBoard>(
      new ProgressBoard(fd, slots, map, size));
}

ProgressBoard::ProgressBoard(int fd, int slots, void* map, size_t size)
    : fd_(fd),
      path_(absl::StrCat("/proc/", getpid(), "/fd/", fd)),
      slots_(slots),
      map_(map),
      size_(size) {}

ProgressBoard::~ProgressBoard() {
  munmap(map_, size_);
  close(fd_);
}

void ProgressBoard::Clear() {
  std::memset(static_cast<char*>(map_) + progress::kHeaderSize, 0,
              size_ - progress::kHeaderSize);
  SetStop(stops_on_ ? progress::kStopIdle : progress::kStopOff, 0, "");
}

void ProgressBoard::SetStop(uint32_t state, int64_t step,
                            absl::string_view reason) {
  auto* header = static_cast<progress::Header*>(map_);
  char text[progress::kStopReasonSize] = {};
  std::memcpy(text, reason.data(), std::min(reason.size(), sizeof text - 1));
  std::memcpy(header->stop_reason, text, sizeof text);
  header->stop_step.store(step, std::memory_order_relaxed);
  // The step and the reason before the state that makes them count.
  header->stop_state.store(state, std::memory_order_release);
}

void ProgressBoard::Clear(int slot) {
  if (slot < 0 || slot >= slots_) return;
  std::memset(static_cast<void*>(SlotAt(map_, slot)), 0, progress::kSlotSize);
}

std::vector<ProgressSample> ProgressBoard::Read() const {
  std::vector<ProgressSample> samples(static_cast<size_t>(slots_));
  for (int i = 0; i < slots_; ++i) {
    const Slot* slot = SlotAt(map_, i);
    ProgressSample& s = samples[static_cast<size_t>(i)];
    // The section fields under the seqlock: a worker rewriting them right
    // now is read again (or, still busy, on the next poll).
    for (int attempt = 0; attempt < 4; ++attempt) {
      const uint64_t seq = slot->seq.load(std::memory_order_acquire);
      if (seq % 2 == 1) continue;
      s.events = slot->events.load(std::memory_order_acquire);
      s.event_time = FromMonotonicNs(slot->event_ns.load());
      char name[progress::kSectionNameSize];
      std::memcpy(name, slot->section, sizeof name);
      name[sizeof name - 1] = '\0';
      s.section = SanitizeUtf8(name);
      s.untimed = slot->flags.load() & progress::kUntimed;
      if (slot->seq.load(std::memory_order_acquire) == seq) break;
    }
    const uint32_t flags = slot->flags.load();
    s.done = flags & progress::kDone;
    s.resilient = flags & progress::kResilient;
    s.store_used = flags & progress::kStoreUsed;
    s.stop_aware = flags & progress::kStopAware;
    s.held = flags & progress::kHeld;
    s.stuck = flags & progress::kStuck;
    s.round_left = static_cast<int64_t>(slot->round_left.load()) - 1;
    s.round_ready = static_cast<int64_t>(slot->round_ready.load()) - 1;
    s.left_time = FromMonotonicNs(slot->left_ns.load());
    s.ready_time = FromMonotonicNs(slot->ready_ns.load());
    s.beats = slot->beats.load(std::memory_order_acquire);
    s.beat_time = FromMonotonicNs(slot->beat_ns.load());
    s.busy = absl::Nanoseconds(slot->busy_ns.load());
    s.sections_done = slot->sections_done.load();
  }
  return samples;
}

StackDump ProgressBoard::StacksOf(int i) const {
  if (i < 0 || i >= slots_) return {};
  const Slot* slot = SlotAt(map_, i);
  const uint32_t flags = slot->flags.load();
  const int signal = static_cast<int>(slot->stack_signal.load());
  if (!(flags & progress::kStacksOnSignal) || signal < SIGRTMIN ||
      signal > SIGRTMAX) {
    return {};
  }
  return StackDump{true, signal};
}

}  // namespace ctrun
