// ProgressMonitor: one node's hang and pace watch over its workers'
// progress signals (ctrun/progress.h), as a pure state machine.
//
// The agent's loop reads the progress board every kPollEvery and hands the
// samples in with `now`; the monitor answers which workers are hung. It also
// learns the longest silence seen in each section (--hang_timeout=auto) and
// measures each rank's pace, both for the rendezvous (TakeReport), which
// keeps the job-wide figures and names stragglers. No I/O, no clock, no
// thread: owned by AgentPolicy, not thread-safe.
//
// Timeouts (HangTimeout):
// - kOff: nothing is ever hung.
// - kFixed: a worker is hung when no progress signal came for longer than
//   the timeout; in an untimed section no timeout runs.
// - kAuto: the timeout in a section ("" outside any) is kAutoFactor times
//   the longest silence seen in it anywhere in the job (this node's and the
//   job's figures, whichever is larger), at least kAutoFloor. A worker's
//   first kWarmupIntervals silences in each section after its start are
//   warm-up (a first step compiles, fills caches): they are not learned
//   from, and they get the warm-up allowance if it is longer. A section with
//   no figure yet gets the allowance too.
// A worker that said it is done (ctrun.done(), or exiting) is not timed.
// In both modes a worker's first signal is awaited from its start for the
// timeout or the warm-up allowance, whichever is longer: starting up
// (imports, loading data) is not a step. While no worker of the job has ever
// sent a signal (a script that never calls ctrun.heartbeat()), a worker
// that has not is never hung: the monitor says so once (TakeUnsignalled)
// instead. Once any worker of the job signals, the silent ones are judged.
//
// A worker's clock readings are its own word: each is kept within what the
// agent saw (not before the previous event or the start, not after the poll
// that saw it), so garbage times neither hide a hang nor inflate one.
#ifndef CTRUN_LAUNCHER_POLICY_PROGRESS_MONITOR_H_
#define CTRUN_LAUNCHER_POLICY_PROGRESS_MONITOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/v1/rendezvous.pb.h"
#include "launcher/options/launch_options.h"

namespace ctrun {

// One worker's slot as the loop read it (ctrun/progress_board.h).
struct ProgressSample {
  uint64_t beats = 0;
  absl::Time beat_time = absl::InfinitePast();  // of the last heartbeat
  uint64_t events = 0;
  absl::Time event_time = absl::InfinitePast();  // of the last event
  absl::Duration busy = absl::ZeroDuration();    // in outermost sections
  uint64_t sections_done = 0;
  std::string section;  // innermost open one; "" none
  bool untimed = false;
  bool done = false;  // it sends no more signals: not timed
  // In-process recovery (progress_board.h): it recovers in process, and the
  // last round whose world it took and whose communicator it formed (-1:
  // none).
  bool resilient = false;
  // It connected to the job's store (worker_lib's communicators).
  bool store_used = false;
  // It calls the stop check (ctrun.should_stop()), and waits in it now.
  bool stop_aware = false;
  bool held = false;
  // Released while it formed its communicator, it cannot leave
  // (progress::kStuck).
  bool stuck = false;
  int64_t round_left = -1;
  int64_t round_ready = -1;
  absl::Time left_time = absl::InfinitePast();   // when it took round_left
  absl::Time ready_time = absl::InfinitePast();  // when it formed round_ready
};

// A worker past its timeout.
struct SilentWorker {
  int local_rank = 0;
  absl::Time since;   // its last progress signal, or its start
  bool ever = false;  // it sent one since it started
  std::string section;
  uint64_t beats = 0;
  absl::Duration timeout;
};

class ProgressMonitor {
 public:
  static constexpr int kAutoFactor = 5;
  static constexpr absl::Duration kAutoFloor = absl::Seconds(1);
  static constexpr int kWarmupIntervals = 2;
  static constexpr absl::Duration kPollEvery = absl::Milliseconds(100);
  static constexpr absl::Duration kReportEvery = absl::Seconds(2);
  // Sections learned per job at most; further ones get the allowance.
  static constexpr size_t kMaxSections = 64;

  explicit ProgressMonitor(HangTimeout timeout) : timeout_(timeout) {}

  const HangTimeout& timeout() const { return timeout_; }

  // A new attempt's workers started at `now`, local rank i being global
  // rank ranks[i], with empty slots.
  void Start(std::vector<int> ranks, absl::Time now);
  // The worker at `local_rank` exited: it is no longer watched.
  void Exited(int local_rank);
  // No workers to watch until the next Start.
  void Stop() { workers_.clear(); }

  // The job's figures (Assignment.longest, Learned), merged by maximum.
  void MergeLearned(
      const google::protobuf::RepeatedPtrField<v1::LearnedInterval>& longest);

  // One poll, samples[i] for local rank i. Returns the workers hung at
  // `now`, the one whose last signal is oldest first; empty when none.
  std::vector<SilentWorker> Observe(const std::vector<ProgressSample>& samples,
                                    absl::Time now);

  // The ranks that were let off at the end of their warm-up because no
  // worker of the job had ever signalled, once in the monitor's life; empty
  // at every other call.
  std::vector<int> TakeUnsignalled();

  // Figures that grew and the ranks' paces since the last report, for
  // `round`; nullopt when there is nothing new.
  std::optional<v1::ProgressReport> TakeReport(int64_t round, absl::Time now);

  // The board is read at `now` (ReadProgress): the next read is due
  // kPollEvery later, whether or not this one is answered.
  void Polled(absl::Time now) { next_poll_ = now + kPollEvery; }
  // A report is due but cannot be sent: what it would say is kept for the
  // next one.
  void DelayReport(absl::Time now) { next_report_ = now + kReportEvery; }
  // When the board is next due to be read, and the next report; both
  // InfiniteFuture when nothing is watched.
  absl::Time NextPoll() const;
  absl::Time NextReport() const;

  // The longest silence known in `section` (this node's or the job's).
  std::optional<absl::Duration> Longest(const std::string& section) const;
  // The timeout in `section` once warm-up is over: InfiniteDuration when
  // none runs (kOff, or kAuto with no figure and an infinite allowance).
  absl::Duration TimeoutIn(const std::string& section) const;

 private:
  struct Worker {
    int rank = 0;
    bool alive = true;
    ProgressSample last;
    // Silences seen so far per section, for warm-up.
    std::map<std::string, int> intervals;
    // The pace baseline: what the last report saw (none until warm-up).
    bool beat_base = false;
    uint64_t base_beats = 0;
    absl::Time base_beat_time;
    bool section_base = false;
    uint64_t base_done = 0;
    absl::Duration base_busy;
  };

  absl::Duration TimeoutFor(const Worker& w, const std::string& section) const;
  void Learn(Worker& w, const std::string& section, bool untimed,
             absl::Duration silence);

  // Some worker of the job signalled: this node's, in any attempt, or
  // another node's (the job's figures).
  bool JobSignalled() const;

  const HangTimeout timeout_;
  absl::Time started_ = absl::InfinitePast();
  bool signalled_ = false;  // a worker of this node did, in any attempt
  // Let off while the job was silent: pending notice, and whether it was
  // given.
  std::vector<int> unsignalled_;
  bool unsignalled_told_ = false;
  std::vector<Worker> workers_;
  absl::Time next_poll_ = absl::InfiniteFuture();
  absl::Time next_report_ = absl::InfiniteFuture();
  // Longest silences: this node's, the job's, and what was last reported.
  std::map<std::string, absl::Duration> local_, job_, reported_;
};

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_PROGRESS_MONITOR_H_
