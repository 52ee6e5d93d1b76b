// The progress board: how workers tell their agent that they make progress.
//
// The agent creates one board per node (`CTRUN_PROGRESS_FILE`: a memory
// file sealed at its size, opened through the agent's /proc), maps it
// shared, and gives each worker a slot (`CTRUN_PROGRESS_SLOT`). A worker
// writes plain stores into its slot — no system call, no lock, nothing that
// can block — and the agent reads every slot a few times a second. The C++
// API (ctrun/progress.h) and the Python module that ctrun puts on the
// workers' PYTHONPATH write the same layout; this header is its definition.
//
// Layout (little-endian, native alignment):
//   offset 0   char magic[8] = "CTRUNPB3"
//          8   u32 slot_count
//         12   u32 slot_size = 128
//         16   u32 stop_state     a coordinated stop (ctrun
//                                 --preemption_grace), written by the agent:
//                                 kStopOff, kStopIdle, kStopHold, kStopAt,
//                                 kStopFallback
//         24   i64 stop_step      with kStopAt: the step (heartbeats) at
//                                 which every rank stops
//         32   char stop_reason[32]  why, NUL-terminated
//         64   slot 0, then slot 1, ...
// A slot:
//          0   u64 seq            odd while the worker rewrites the section
//                                 fields (a seqlock); heartbeats skip it
//          8   u64 beats          heartbeats so far
//         16   i64 beat_ns        CLOCK_MONOTONIC of the last heartbeat
//         24   u64 events         progress events: beats, section enters
//                                 and exits
//         32   i64 event_ns       CLOCK_MONOTONIC of the last event
//         40   i64 busy_ns        time spent in completed outermost sections
//         48   u64 sections_done  outermost sections completed
//         56   u32 flags          kUntimed, kStacksOnSignal, kDone,
//                                 kResilient, kStoreUsed, kStopAware,
//                                 kHeld, kStuck
//         60   u32 stack_signal   the signal that dumps Python stacks
//         64   u32 round_left     in-process recovery: 1 + the round whose
//                                 world the worker took (it left the one
//                                 before); 0 before any
//         68   u32 round_ready    1 + the round whose communicator the
//                                 worker has formed again; 0 before any
//         72   i64 left_ns        CLOCK_MONOTONIC when it took round_left
//         80   i64 ready_ns       CLOCK_MONOTONIC when it formed round_ready
//         88   char section[32]   innermost open section, NUL-terminated
//        120   i32 owner          the pid of the process that took the slot
//                                 last; only it sets kDone
//        124   u32 reserved
//
// A process takes its slot as it maps it: it writes its pid into `owner`
// and clears kDone. A worker that is a wrapper (`sh -c "python3 -c ...;
// python3 train.py"`) runs several processes one after another on one
// slot: the first one's exit says done, and the next one's start takes
// that back.
//
// Version 2 ("CTRUNPB2") made room for the round fields in version 1's
// section name (64 bytes); version 3 took the owner from version 2's (40
// bytes). A writer finding another magic does nothing. The
// stop fields took header bytes that were zero before (kStopOff).
#ifndef CTRUN_PROGRESS_BOARD_H_
#define CTRUN_PROGRESS_BOARD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ctrun::progress {

inline constexpr char kMagic[8] = {'C', 'T', 'R', 'U', 'N', 'P', 'B', '3'};
inline constexpr size_t kHeaderSize = 64;
inline constexpr size_t kSlotSize = 128;
inline constexpr size_t kSectionNameSize = 32;  // with its NUL

// Slot flags.
// The innermost open section was entered as untimed (a checkpoint): no hang
// timeout runs while it is open.
inline constexpr uint32_t kUntimed = 1u << 0;
// The worker dumps its Python stacks (faulthandler) on `stack_signal`,
// appending them to its CTRUN_STACKS_FILE.
inline constexpr uint32_t kStacksOnSignal = 1u << 1;
// The worker sends no more progress signals (its loop ended; it is exiting):
// no hang timeout runs for it any more. Set by the slot's owner only.
inline constexpr uint32_t kDone = 1u << 2;
// The worker recovers in process (ctrun.resilient, or worker_lib's
// re-creatable communicator): under --recovery=inprocess the agent keeps it
// across rounds and hands it each new world.
inline constexpr uint32_t kResilient = 1u << 3;
// The worker connected to the job's store (WorkerStore::Connect): it forms
// its communicator through ctrun, not through a store on MASTER_PORT.
inline constexpr uint32_t kStoreUsed = 1u << 4;
// The worker calls the stop check (ctrun.should_stop(), ctrun::ShouldStop()):
// a preemption signal to its agent stops the job at one step.
inline constexpr uint32_t kStopAware = 1u << 5;
// It waits in its stop check for the step to be decided (kStopHold).
inline constexpr uint32_t kHeld = 1u << 6;
// Told to leave its round while it formed its communicator, it is still
// blocked there, in native code that neither a signal nor a closed socket
// ends (a peer it waits for went with the old round): only a new process
// takes the new world.
inline constexpr uint32_t kStuck = 1u << 7;

// Header stop_state: how the stop check answers.
// Coordinated stops are off (--preemption_grace=off): signals act as always.
inline constexpr uint32_t kStopOff = 0;
// On, none asked: false.
inline constexpr uint32_t kStopIdle = 1;
// A stop is asked: wait (kHeld) until the state changes.
inline constexpr uint32_t kStopHold = 2;
// Decided: true once the worker made stop_step heartbeats.
inline constexpr uint32_t kStopAt = 3;
// The stop did not come in time (or is not taken): a preemption signal the
// worker's stop check held back acts now.
inline constexpr uint32_t kStopFallback = 4;
inline constexpr size_t kStopReasonSize = 32;  // with its NUL

struct Header {
  char magic[8];
  uint32_t slot_count;
  uint32_t slot_size;
  std::atomic<uint32_t> stop_state;
  uint32_t reserved;
  std::atomic<int64_t> stop_step;
  char stop_reason[kStopReasonSize];
};
static_assert(offsetof(Header, stop_state) == 16);
static_assert(offsetof(Header, stop_step) == 24);
static_assert(sizeof(Header) == kHeaderSize);

struct Slot {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> beats;
  std::atomic<int64_t> beat_ns;
  std::atomic<uint64_t> events;
  std::atomic<int64_t> event_ns;
  std::atomic<int64_t> busy_ns;
  std::atomic<uint64_t> sections_done;
  std::atomic<uint32_t> flags;
  std::atomic<uint32_t> stack_signal;
  std::atomic<uint32_t> round_left;
  std::atomic<uint32_t> round_ready;
  std::atomic<int64_t> left_ns;
  std::atomic<int64_t> ready_ns;
  char section[kSectionNameSize];
  std::atomic<int32_t> owner;
  uint32_t reserved;
};
static_assert(sizeof(Slot) == kSlotSize);
static_assert(offsetof(Slot, round_left) == 64);
static_assert(offsetof(Slot, left_ns) == 72);
static_assert(offsetof(Slot, section) == 88);
static_assert(offsetof(Slot, owner) == 120);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

}  // namespace ctrun::progress

#endif  // CTRUN_PROGRESS_BOARD_H_
