// AgentPolicy's part in coordinated stops (--preemption_grace): a
// preemption signal asks the rendezvous for one step at which every rank
// of the job stops; the rendezvous (coordinated_stop.h) has each node hold
// its workers in their stop check until it knows the step.
#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "launcher/policy/agent_policy.h"

namespace ctrun {

using agent_effect::PostStop;
using agent_effect::ReadProgress;
using agent_effect::Say;
using agent_effect::Send;
using agent_effect::StopState;

bool AgentPolicy::AskToStop(int signal, absl::Time now, AgentEffects* effects) {
  const auto& grace = config_.options.preemption_grace;
  if (!grace || preemption_ || !stop_aware_ || ending_ != Ending::kNone ||
      phase_ != Phase::kRunning || link_ != Link::kOpen ||
      live_workers() == 0) {
    return false;
  }
  preemption_ =
      Preemption{.signal = signal,
                 .reason = absl::StrCat(SignalName(signal), " to ctrun on ",
                                        config_.hostname),
                 .deadline = now + *grace};
  SendStopAsk(effects);
  effects->push_back(
      Say{absl::StrCat("received ", SignalName(signal),
                       ": the job stops at one step that every rank reaches "
                       "(ctrun.should_stop()), within --preemption_grace=",
                       absl::FormatDuration(*grace), "; ", SignalName(signal),
                       " again stops the workers now")});
  return true;
}

void AgentPolicy::SendStopAsk(AgentEffects* effects) {
  preemption_->round = round();
  v1::AgentMessage m;
  v1::StopVote& vote = *m.mutable_stop_vote();
  vote.set_round(round());
  vote.set_asked(preemption_->reason);
  vote.set_signal(preemption_->signal);
  // Half the grace to agree on the step, the rest to reach it and save.
  vote.set_hold_ms(
      absl::ToInt64Milliseconds(*config_.options.preemption_grace / 2));
  effects->push_back(Send{std::move(m)});
}

void AgentPolicy::OnStopAt(const v1::StopAt& stop, absl::Time now,
                           AgentEffects* effects) {
  if (stop.round() != round() || (preemption_ && preemption_->fallen_back)) {
    return;
  }
  if (!stop.decided()) {
    if (live_workers() == 0) {
      SendHeld(-1, effects);  // nothing here to hold
      return;
    }
    if (phase_ != Phase::kRunning) return;
    holding_ = true;
    hold_poll_at_ = now;
    stop_posted_ = true;
    effects->push_back(PostStop{StopState::kHold, 0, stop.reason()});
    return;
  }
  holding_ = false;
  hold_poll_at_ = absl::InfiniteFuture();
  stop_signal_ = stop.signal();
  if (live_workers() == 0) return;
  stop_posted_ = true;
  effects->push_back(PostStop{StopState::kAt, stop.step(), stop.reason()});
  effects->push_back(Say{
      absl::StrCat("the job stops at step ", stop.step(), " (", stop.reason(),
                   "): every rank's ctrun.should_stop() is true from there")});
}

void AgentPolicy::SendHeld(int64_t step, AgentEffects* effects) {
  holding_ = false;
  hold_poll_at_ = absl::InfiniteFuture();
  if (link_ != Link::kOpen) return;  // the rendezvous decides without it
  v1::AgentMessage m;
  v1::StopVote& vote = *m.mutable_stop_vote();
  vote.set_round(round());
  vote.set_held(true);
  vote.set_step(step);
  effects->push_back(Send{std::move(m)});
}

void AgentPolicy::TrackStop(const std::vector<ProgressSample>& samples,
                            AgentEffects* effects) {
  const size_t n = std::min(samples.size(), workers_.size());
  stop_aware_ = false;
  bool all_held = true;
  int64_t step = -1;
  for (size_t i = 0; i < n; ++i) {
    if (!workers_[i].alive || samples[i].done) continue;
    stop_aware_ |= samples[i].stop_aware;
    all_held &= samples[i].held;
    step = std::max(step, static_cast<int64_t>(samples[i].beats));
  }
  // A stop asked in a round that has ended: the new round's workers are
  // asked once they call the check.
  if (preemption_ && !preemption_->fallen_back && stop_aware_ &&
      preemption_->round != round() && link_ == Link::kOpen &&
      ending_ == Ending::kNone) {
    SendStopAsk(effects);
  }
  if (holding_ && all_held) SendHeld(step, effects);
}

void AgentPolicy::RequeueAfterStop(AgentEffects* effects) const {
  if (stop_signal_ == SIGUSR1 && !config_.options.slurm_job_id.empty() &&
      assignment_ && assignment_->group_rank() == 0) {
    effects->push_back(
        agent_effect::RequeueSlurmJob{config_.options.slurm_job_id});
  }
}

void AgentPolicy::TickStop(absl::Time now, AgentEffects* effects) {
  if (holding_ && now >= hold_poll_at_) {
    hold_poll_at_ = now + kHoldPollEvery;
    effects->push_back(ReadProgress{});
  }
  if (!preemption_ || preemption_->fallen_back || now < preemption_->deadline) {
    return;
  }
  preemption_->fallen_back = true;
  holding_ = false;
  hold_poll_at_ = absl::InfiniteFuture();
  if (ending_ != Ending::kNone || live_workers() == 0) return;
  const int signal = preemption_->signal;
  effects->push_back(
      Say{absl::StrCat("the job did not stop within --preemption_grace=",
                       absl::FormatDuration(*config_.options.preemption_grace),
                       ": ", SignalName(signal), " acts as without it")});
  effects->push_back(PostStop{StopState::kFallback});
  stop_posted_ = true;
  // The workers' check held back any copy they had: send it.
  ActOnSignal(signal, /*delivered=*/false, now, effects);
}

}  // namespace ctrun
