// Progress signals from a worker to its ctrun agent, for hang and straggler
// detection (ctrun --hang_timeout).
//
//   for (int step = 0; step < steps; ++step) {
//     ctrun::Heartbeat();                     // once per step
//     {
//       ctrun::Section compute("compute");    // a rank's own work
//       ...
//     }
//     AllReduce(...);
//   }
//   { ctrun::Section save("checkpoint", ctrun::kUntimed); Save(); }
//   ctrun::Done();  // what follows is not timed
//
// Each call is a few plain stores into memory shared with the agent
// (ctrun/progress_board.h): no system call, no lock, nothing that can block,
// cheap enough for every step. Outside ctrun (no CTRUN_PROGRESS_FILE), and in
// a process forked from the worker, every call does nothing.
//
// The agent counts a heartbeat, a section's start and its end as progress.
// With --hang_timeout, a worker that makes no progress for longer than the
// timeout of what it is in (the innermost open section, or none) is hung;
// no timeout runs inside an untimed section. Straggler detection compares
// the ranks' step times: the mean time between heartbeats, or, when a rank
// uses sections, the mean time spent in its outermost sections — which is
// what to wrap around a rank's own work in a synchronous job, where every
// rank's step takes as long as the slowest one's.
//
// Sections belong to the process, not to a thread: open and close them on
// one thread (the training loop's), innermost first. Heartbeat() may be
// called from any thread.
#ifndef CTRUN_PROGRESS_H_
#define CTRUN_PROGRESS_H_

#include <string>

namespace ctrun {

// One step done.
void Heartbeat();

enum SectionTiming { kTimed, kUntimed };

// A named stretch of work, from construction to destruction. Names are cut
// to 63 bytes.
class Section {
 public:
  explicit Section(const char* name, SectionTiming timing = kTimed);
  ~Section();
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;
};

// This worker sends no more progress signals: what follows (a final
// checkpoint, tearing down, exiting) is not timed. Called by itself at
// exit(); call it once the training loop is over. Final for the process.
void Done();

// Whether this process reports to a ctrun agent.
bool ProgressReported();

// Whether this rank is to stop now: call it once per step, after
// Heartbeat(). When ctrun receives SIGTERM, SIGUSR1 or SIGUSR2 (a
// scheduler's preemption), the whole job agrees on one step, and this
// returns true on every rank once it has made that many heartbeats: save a
// checkpoint there and exit 0. While the step is being agreed on (a few
// milliseconds), the call waits. From its first call, a preemption signal
// delivered to this process while its handler is the default is held back
// for the agreed stop, and acts as usual if none comes (ctrun
// --preemption_grace). Call it from one thread. False outside ctrun.
bool ShouldStop();
// Why the job is stopping ("SIGTERM to ctrun on HOST"); empty when no stop
// was asked.
std::string Preempted();

}  // namespace ctrun

#endif  // CTRUN_PROGRESS_H_
