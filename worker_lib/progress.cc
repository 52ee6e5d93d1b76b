#include "ctrun/progress.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "ctrun/environment.h"
#include "ctrun/progress_board.h"
#include "progress_internal.h"

namespace ctrun {
namespace {

using progress::Slot;

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// This process's slot; null outside ctrun, on a malformed board, and in a
// forked child (its parent's slot is not its own).
std::atomic<Slot*> g_slot{nullptr};
// The board's header (the coordinated stop), mapped with the slot.
std::atomic<progress::Header*> g_header{nullptr};

void ForgetSlotInChild() {
  g_slot.store(nullptr, std::memory_order_relaxed);
  g_header.store(nullptr, std::memory_order_relaxed);
}

Slot* MapSlot() {
  const char* path = std::getenv(env::kProgressFile);
  const char* slot_text = std::getenv(env::kProgressSlot);
  if (path == nullptr || slot_text == nullptr) return nullptr;
  // A child that a Python worker started inherits the slot's variables and
  // the worker's pid (ctrun's module sets it): the slot is the worker's.
  if (const char* owner = std::getenv(env::kProgressOwner);
      owner != nullptr && *owner != '\0' &&
      std::strtol(owner, nullptr, 10) != getpid()) {
    return nullptr;
  }
  char* end = nullptr;
  const long index = std::strtol(slot_text, &end, 10);
  if (*slot_text == '\0' || *end != '\0' || index < 0) return nullptr;
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* map = MAP_FAILED;
  const size_t size = progress::kHeaderSize +
                      (static_cast<size_t>(index) + 1) * progress::kSlotSize;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= size) {
    map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) return nullptr;
  const auto* header = static_cast<const progress::Header*>(map);
  if (std::memcmp(header->magic, progress::kMagic, sizeof header->magic) != 0 ||
      header->slot_size != progress::kSlotSize ||
      header->slot_count <= static_cast<uint32_t>(index)) {
    munmap(map, size);
    return nullptr;
  }
  g_header.store(static_cast<progress::Header*>(map),
                 std::memory_order_release);
  pthread_atfork(nullptr, nullptr, ForgetSlotInChild);
  // Exiting (static destructors, atexit handlers) is not a step.
  std::atexit(Done);
  auto* slot =
      reinterpret_cast<Slot*>(static_cast<char*>(map) + progress::kHeaderSize +
                              static_cast<size_t>(index) * progress::kSlotSize);
  // This process reports now: a done said by one before it is taken back.
  slot->owner.store(getpid(), std::memory_order_relaxed);
  slot->flags.fetch_and(~progress::kDone, std::memory_order_release);
  return slot;
}

Slot* TheSlot() {
  // Mapped once, on first use; a forked child keeps its null.
  static const bool mapped = [] {
    g_slot.store(MapSlot(), std::memory_order_release);
    return true;
  }();
  (void)mapped;
  return g_slot.load(std::memory_order_acquire);
}

// The open sections, outermost first.
struct OpenSection {
  std::string name;
  SectionTiming timing;
  int64_t start_ns;
};
std::mutex g_sections_mu;
std::vector<OpenSection> g_sections;  // guarded by g_sections_mu

// Publishes the innermost open section as one progress event, under the
// slot's seqlock so that the agent never reads a half-written name.
void PublishSection(Slot* slot, int64_t now) {
  const OpenSection* top = g_sections.empty() ? nullptr : &g_sections.back();
  slot->seq.fetch_add(1, std::memory_order_acq_rel);
  char name[progress::kSectionNameSize] = {};
  if (top != nullptr) {
    std::strncpy(name, top->name.c_str(), sizeof name - 1);
  }
  std::memcpy(slot->section, name, sizeof name);
  uint32_t flags = slot->flags.load(std::memory_order_relaxed);
  flags &= ~progress::kUntimed;
  if (top != nullptr && top->timing == kUntimed) flags |= progress::kUntimed;
  slot->flags.store(flags, std::memory_order_relaxed);
  slot->event_ns.store(now, std::memory_order_relaxed);
  slot->events.fetch_add(1, std::memory_order_relaxed);
  slot->seq.fetch_add(1, std::memory_order_release);
}

uint32_t StopState() {
  const progress::Header* header = g_header.load(std::memory_order_acquire);
  return header == nullptr ? progress::kStopOff
                           : header->stop_state.load(std::memory_order_acquire);
}

// A preemption signal held back by the stop check, and when (0: none).
std::atomic<int> g_held_back{0};
std::atomic<int64_t> g_held_back_ns{0};
// Held back this long without the agent taking it up, it acts.
constexpr int64_t kUnclaimedAfterNs = 1'000'000'000;

// The signal acts as it would have without the stop check.
void Act(int signal) {
  ::signal(signal, SIG_DFL);
  raise(signal);
}

void OnPreemptionSignal(int signal) {
  const uint32_t state = StopState();
  if (state == progress::kStopOff || state == progress::kStopFallback) {
    Act(signal);
    return;
  }
  int none = 0;
  if (g_held_back.compare_exchange_strong(none, signal)) {
    g_held_back_ns.store(MonotonicNs());
  }
}

void StartChecking(Slot* slot) {
  slot->flags.fetch_or(progress::kStopAware, std::memory_order_release);
  if (StopState() == progress::kStopOff) return;
  for (int signal : {SIGTERM, SIGUSR1, SIGUSR2}) {
    struct sigaction old {};
    if (sigaction(signal, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO)) {
      continue;  // the program handles it: its own handler decides
    }
    struct sigaction act {};
    act.sa_handler = OnPreemptionSignal;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    sigaction(signal, &act, nullptr);
  }
}

}  // namespace

bool ShouldStop() {
  Slot* slot = TheSlot();
  if (slot == nullptr) return false;
  static bool checking = false;  // one thread calls it, by contract
  if (!checking) {
    checking = true;
    StartChecking(slot);
  }
  uint32_t state = StopState();
  if (state == progress::kStopHold) {
    slot->flags.fetch_or(progress::kHeld, std::memory_order_release);
    const timespec millisecond{0, 1'000'000};
    while (state == progress::kStopHold) {
      nanosleep(&millisecond, nullptr);
      state = StopState();
    }
    slot->flags.fetch_and(~progress::kHeld, std::memory_order_release);
  }
  if (state == progress::kStopAt) {
    const int64_t step = g_header.load()->stop_step.load();
    return static_cast<int64_t>(slot->beats.load()) >= step;
  }
  if (const int held = g_held_back.load();
      held != 0 &&
      (state == progress::kStopOff || state == progress::kStopFallback ||
       MonotonicNs() - g_held_back_ns.load() > kUnclaimedAfterNs)) {
    Act(held);
  }
  return false;
}

std::string Preempted() {
  TheSlot();  // maps the board on first use
  const uint32_t state = StopState();
  if (state != progress::kStopHold && state != progress::kStopAt) return "";
  const progress::Header* header = g_header.load(std::memory_order_acquire);
  char reason[progress::kStopReasonSize];
  std::memcpy(reason, header->stop_reason, sizeof reason);
  reason[sizeof reason - 1] = '\0';
  return reason;
}

void Heartbeat() {
  Slot* slot = TheSlot();
  if (slot == nullptr) return;
  const int64_t now = MonotonicNs();
  slot->beat_ns.store(now, std::memory_order_relaxed);
  slot->event_ns.store(now, std::memory_order_relaxed);
  slot->beats.fetch_add(1, std::memory_order_relaxed);
  slot->events.fetch_add(1, std::memory_order_release);
}

bool ProgressReported() { return TheSlot() != nullptr; }

void Done() {
  Slot* slot = TheSlot();
  // A process that took the slot after this one reports for it now.
  if (slot != nullptr &&
      slot->owner.load(std::memory_order_relaxed) == getpid()) {
    slot->flags.fetch_or(progress::kDone, std::memory_order_release);
  }
}

Section::Section(const char* name, SectionTiming timing) {
  Slot* slot = TheSlot();
  if (slot == nullptr) return;
  std::lock_guard<std::mutex> lock(g_sections_mu);
  const int64_t now = MonotonicNs();
  g_sections.push_back({name, timing, now});
  PublishSection(slot, now);
}

Section::~Section() {
  Slot* slot = TheSlot();
  if (slot == nullptr) return;
  std::lock_guard<std::mutex> lock(g_sections_mu);
  if (g_sections.empty()) return;  // opened before a fork
  const int64_t now = MonotonicNs();
  const int64_t start = g_sections.back().start_ns;
  g_sections.pop_back();
  if (g_sections.empty()) {
    slot->busy_ns.fetch_add(now - start, std::memory_order_relaxed);
    slot->sections_done.fetch_add(1, std::memory_order_relaxed);
  }
  PublishSection(slot, now);
}

}  // namespace ctrun

namespace ctrun::progress_internal {

void MarkResilient() {
  if (Slot* slot = TheSlot()) {
    slot->flags.fetch_or(progress::kResilient, std::memory_order_release);
  }
}

void MarkStoreUsed() {
  if (Slot* slot = TheSlot()) {
    slot->flags.fetch_or(progress::kStoreUsed, std::memory_order_release);
  }
}

void MarkRound(RoundMark which, int64_t round) {
  Slot* slot = TheSlot();
  if (slot == nullptr) return;
  const auto value = static_cast<uint32_t>(round + 1);
  if (which == RoundMark::kLeft) {
    slot->left_ns.store(MonotonicNs(), std::memory_order_relaxed);
    slot->round_left.store(value, std::memory_order_release);
  } else {
    slot->ready_ns.store(MonotonicNs(), std::memory_order_relaxed);
    slot->round_ready.store(value, std::memory_order_release);
  }
}

}  // namespace ctrun::progress_internal
