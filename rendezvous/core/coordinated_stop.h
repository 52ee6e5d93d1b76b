// CoordinatedStop: a job's agreement on the one step at which every rank
// stops (a preemption signal to an agent), as a pure state machine owned by
// the rendezvous core; one per job.
//
// A node asks (StopVote.asked): the first ask of a round tells every member
// to hold, each worker waiting in its stop check (ctrun.should_stop()).
// Each node then says that its workers hold, and at which step (the most
// heartbeats among them). Once every member held, the step is the largest
// heard: every rank has reached it or will, and none has passed it. When
// the asking node's hold window passes first (a worker that never calls the
// stop check), the step is the largest heard so far, or 0 when none was:
// every rank stops at its next check. Decided once per round; a new round
// forgets it (its workers start again, or are told of the round's end).
#ifndef CTRUN_RENDEZVOUS_CORE_COORDINATED_STOP_H_
#define CTRUN_RENDEZVOUS_CORE_COORDINATED_STOP_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "ctrun/v1/rendezvous.pb.h"

namespace ctrun {

class CoordinatedStop {
 public:
  // The longest hold window and reason a node may ask for.
  static constexpr absl::Duration kMaxHold = absl::Minutes(10);
  static constexpr size_t kMaxReasonBytes = 256;

  // Forgets the round's stop.
  void NewRound() { *this = CoordinatedStop(); }
  // `node` asks for a stop in `round` (the job's current one): the message
  // for every member when this is the round's first ask.
  std::optional<v1::StopAt> Ask(int64_t round, const std::string& reason,
                                int32_t signal, absl::Duration hold,
                                absl::Time now);
  // Node `node` holds at `step`; `members` must hold before the step is
  // decided. The decision when this completes it.
  std::optional<v1::StopAt> Held(uint64_t node, int64_t step, size_t members);
  // The decision when the hold window passed without it.
  std::optional<v1::StopAt> Tick(absl::Time now);
  // When Tick has something to do; InfiniteFuture when nothing.
  absl::Time deadline() const {
    return decided_ ? absl::InfiniteFuture() : deadline_;
  }
  // Whether a stop was asked in this round, and what it is.
  bool asked() const { return asked_; }
  const v1::StopAt& stop() const { return stop_; }

 private:
  v1::StopAt Decide();

  bool asked_ = false;
  bool decided_ = false;
  absl::Time deadline_ = absl::InfiniteFuture();
  int64_t step_ = -1;  // the largest heard
  std::set<uint64_t> held_;
  v1::StopAt stop_;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_COORDINATED_STOP_H_
