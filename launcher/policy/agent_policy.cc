#include "launcher/policy/agent_policy.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/policy/classify_failure.h"
#include "rendezvous/core/failure_class.h"
#include "rendezvous/core/restart_reason.h"

namespace ctrun {
namespace {

using agent_effect::AbandonWorkers;
using agent_effect::CancelSession;
using agent_effect::CollectWorkers;
using agent_effect::Exit;
using agent_effect::Print;
using agent_effect::ProbeRendezvous;
using agent_effect::Send;
using agent_effect::SendRejoin;
using agent_effect::SignalWorkers;
using agent_effect::StartWorkers;
using agent_effect::SuspendAgent;

void Tell(std::string line, AgentEffects* effects) {
  effects->push_back(agent_effect::Say{std::move(line)});
}

// A broken connection, as opposed to an answer of the service.
bool IsTransportFailure(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsCancelled(status) ||
         absl::IsUnknown(status) || absl::IsInternal(status);
}

// Whether a failed call means only that nothing listens there (yet): the
// rendezvous may still come up, so the join goes on waiting. Anything else
// (a failed TLS handshake, a peer that speaks something else) will not mend
// itself.
bool MayComeUp(const absl::Status& status) {
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) {
    return true;  // it answered: the connection works
  }
  const absl::string_view m = status.message();
  return absl::StrContains(m, "Connection refused") ||
         absl::StrContains(m, " stands by") ||  // a standby ctrund replica
         absl::StrContains(m, "No route to host") ||
         absl::StrContains(m, "Network is unreachable") ||
         absl::StrContains(m, "DNS resolution failed") ||
         absl::StrContains(m, "Deadline Exceeded") ||
         absl::IsDeadlineExceeded(status);
}

// Why a probe could not reach the rendezvous, in a few words.
std::string UnreachableReason(const absl::Status& status) {
  const absl::string_view m = status.message();
  if (absl::StrContains(m, " stands by")) return std::string(m);
  for (const char* known :
       {"Connection refused", "No route to host", "Network is unreachable"}) {
    if (absl::StrContains(m, known)) return absl::AsciiStrToLower(known);
  }
  if (absl::StrContains(m, "DNS resolution failed")) {
    return "its name does not resolve";
  }
  if (absl::IsDeadlineExceeded(status) ||
      absl::StrContains(m, "Deadline Exceeded")) {
    return "no answer";
  }
  return std::string(m);
}

}  // namespace

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

AgentPolicy::AgentPolicy(AgentPolicyConfig config)
    : config_(std::move(config)), monitor_(config_.options.hang_timeout) {}

int AgentPolicy::live_workers() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(),
                    [](const Worker& w) { return w.alive; }));
}

// --- the session -------------------------------------------------------------

v1::Event& AgentPolicy::Record(const char* what, AgentEffects* effects) const {
  agent_effect::Record record;
  record.event.set_event(what);
  if (assignment_) {
    record.event.set_job(assignment_->job_id());
    record.event.set_round(static_cast<int32_t>(assignment_->round()));
  }
  effects->push_back(std::move(record));
  return std::get<agent_effect::Record>(effects->back()).event;
}

void AgentPolicy::Start(absl::Time now, AgentEffects* effects) {
  recap_.Start(now);
  JoinFresh(now, effects);
}

void AgentPolicy::JoinFresh(absl::Time now, AgentEffects* effects) {
  if (config_.health_gate) {
    after_health_ = AfterHealth::kJoin;
    effects->push_back(agent_effect::CheckHealth{});
    return;
  }
  OpenSession(std::nullopt, now, effects);
}

void AgentPolicy::Rejoin(int64_t round, AgentEffects* effects) {
  if (config_.health_gate) {
    after_health_ = AfterHealth::kRejoin;
    effects->push_back(agent_effect::CheckHealth{});
    return;
  }
  owed_rejoin_ = round;
  SendRejoinIfOwed(effects);
}

void AgentPolicy::OnHealthChecked(const std::string& problem, absl::Time now,
                                  AgentEffects* effects) {
  const AfterHealth after = std::exchange(after_health_, AfterHealth::kNothing);
  if (after == AfterHealth::kNothing || phase_ != Phase::kJoining ||
      ending_ != Ending::kNone) {
    return;
  }
  unhealthy_ = problem;
  if (!problem.empty()) {
    Tell(absl::StrCat("this node failed its health check: ", problem,
                      "; the rendezvous will not admit it (quarantined "
                      "for --quarantine_seconds=",
                      absl::ToInt64Seconds(config_.options.quarantine), ")"),
         effects);
  }
  if (after == AfterHealth::kJoin) {
    OpenSession(std::nullopt, now, effects);
  } else {
    owed_rejoin_ = rejoin_round_;
    SendRejoinIfOwed(effects);
  }
}

void AgentPolicy::OpenSession(std::optional<int64_t> resume_round,
                              absl::Time now, AgentEffects* effects) {
  effects->push_back(agent_effect::OpenSession{
      resume_round, resume_round ? std::string() : unhealthy_});
  next_heartbeat_ = now + config_.options.keep_alive_interval;
  if (resume_round || link_ == Link::kRetrying) return;
  // A fresh join that nobody answers fails after the join timeout; one
  // that cannot connect at all is probed long before that.
  link_ = Link::kConnecting;
  owed_rejoin_.reset();
  first_answer_deadline_ = now + config_.options.join_timeout;
  probe_at_ = now + kProbeAfter;
}

void AgentPolicy::CloseLink(AgentEffects* effects) {
  if (link_ != Link::kClosed) effects->push_back(CancelSession{});
  link_ = Link::kClosed;
  first_answer_deadline_ = probe_at_ = reconnect_deadline_ = reopen_at_ =
      next_heartbeat_ = absl::InfiniteFuture();
}

void AgentPolicy::OnMessage(const v1::ServerMessage& m, absl::Time now,
                            AgentEffects* effects) {
  if (phase_ == Phase::kDone) return;
  if (link_ == Link::kConnecting || link_ == Link::kRetrying) {
    link_ = Link::kOpen;
    first_answer_deadline_ = probe_at_ = reconnect_deadline_ =
        absl::InfiniteFuture();
    SendRejoinIfOwed(effects);
  }
  switch (m.kind_case()) {
    case v1::ServerMessage::kAssignment:
      return OnAssignment(m.assignment(), now, effects);
    case v1::ServerMessage::kRestartRequired:
      if (m.restart_required().collect_evidence()) {
        StartEvidence(-1, now, effects);
      }
      return OnRestartRequired(m.restart_required(), now, effects);
    case v1::ServerMessage::kJobFinished:
      Record("job_finished", effects);
      RequeueAfterStop(effects);
      End(Ending::kJobFinished, now, effects);
      return;
    case v1::ServerMessage::kJobFailed:
      Record("job_failed", effects).set_reason(m.job_failed().reason());
      if (ending_ < Ending::kJobFailed) {
        job_failure_ = m.job_failed().reason();
        job_hung_ = m.job_failed().hung();
        job_no_progress_ = m.job_failed().no_progress();
        if (m.job_failed().has_root_cause()) {
          root_cause_ = RootCause(m.job_failed());
        }
      }
      if (m.job_failed().hung()) StartEvidence(-1, now, effects);
      End(Ending::kJobFailed, now, effects);
      return;
    case v1::ServerMessage::kLearned:
      monitor_.MergeLearned(m.learned().longest());
      return;
    case v1::ServerMessage::kStraggler: {
      const v1::Straggler& st = m.straggler();
      Tell(absl::StrFormat(
               "rank %d on node %s is %.1fx slower than the median %s "
               "(%.3gs against %.3gs, %d steps); not restarting for it",
               st.rank(), st.node(), st.ratio(),
               st.sections() ? "time in sections" : "step",
               static_cast<double>(st.mean_step_us()) / 1e6,
               static_cast<double>(st.median_step_us()) / 1e6, st.steps()),
           effects);
      return;
    }
    case v1::ServerMessage::kProgress:
      return OnProgress(m.progress(), now, effects);
    case v1::ServerMessage::kResumed:
      return OnResumed(m.resumed(), effects);
    case v1::ServerMessage::kStopAt:
      return OnStopAt(m.stop_at(), now, effects);
    case v1::ServerMessage::KIND_NOT_SET:
      return;
  }
}

void AgentPolicy::OnSessionEnd(const absl::Status& status, bool redirected,
                               absl::Time now, AgentEffects* effects) {
  if (phase_ == Phase::kDone || link_ == Link::kClosed) return;
  next_heartbeat_ = absl::InfiniteFuture();
  if (ending_ != Ending::kNone) {  // stopping for good: nothing to resume
    link_ = Link::kClosed;
    reconnect_deadline_ = reopen_at_ = absl::InfiniteFuture();
    return;
  }
  const std::string& endpoint = config_.endpoint;
  if (link_ == Link::kResuming && absl::IsNotFound(status)) {
    // The service came back without this node (it died while a round
    // collected, or lost its state): stop, then join afresh.
    Tell(absl::StrCat("the rendezvous at ", endpoint, " is back but ",
                      status.message(), "; stopping the workers"),
         effects);
    link_ = Link::kClosed;
    reconnect_deadline_ = reopen_at_ = absl::InfiniteFuture();
    next_ = Next::kJoinAfresh;
    StopWorkers(SIGTERM, /*send=*/true, now, effects);
    return;
  }
  // A service that keeps its state takes the node back with its workers
  // running; a node still joining just joins again. Before the first
  // assignment nobody knows whether the service keeps state, and nothing
  // runs that a retry could lose.
  const bool keeps_state = !assignment_ || assignment_->resumable();
  if (IsTransportFailure(status) && keeps_state) {
    Reconnect(phase_ == Phase::kJoining ? Link::kRetrying : Link::kResuming,
              status, redirected, now, effects);
    return;
  }
  if (IsTransportFailure(status)) {  // a running job's stateless service
    Tell(absl::StrCat("the rendezvous at ", endpoint, " went away (",
                      status.ToString(),
                      ") and keeps no state to resume from; stopping the "
                      "workers (a ctrund with --state-dir keeps them running "
                      "across its restarts)"),
         effects);
  } else {
    Tell(absl::StrCat("the rendezvous at ", endpoint,
                      " refused this node: ", status.message(), " (",
                      absl::StatusCodeToString(status.code()), ")"),
         effects);
  }
  link_ = Link::kClosed;
  reconnect_deadline_ = reopen_at_ = absl::InfiniteFuture();
  End(Ending::kLost, now, effects);
}

void AgentPolicy::Reconnect(Link link, const absl::Status& why, bool redirected,
                            absl::Time now, AgentEffects* effects) {
  if (reconnect_deadline_ == absl::InfiniteFuture() && !redirected) {
    // A retry keeps the first attempt's deadline.
    reconnect_deadline_ = now + config_.options.reconnect_timeout;
    const std::string what =
        link == Link::kRetrying ? "joining again"
        : phase_ == Phase::kRunning
            ? "the workers keep running while ctrun reconnects"
            : "reconnecting";
    Tell(absl::StrCat("lost the rendezvous at ", config_.endpoint, " (",
                      why.ToString(), "); ", what, " (up to ",
                      absl::FormatDuration(config_.options.reconnect_timeout),
                      ")"),
         effects);
  }
  link_ = link;
  first_answer_deadline_ = probe_at_ = absl::InfiniteFuture();
  reopen_at_ = redirected ? now : now + kReopenDelay;
  if (link == Link::kResuming) {
    reopen_round_ = assignment_->round();
  } else {
    reopen_round_.reset();
  }
}

void AgentPolicy::OnResumed(const v1::Resumed& resumed, AgentEffects* effects) {
  if (link_ != Link::kResuming) return;
  link_ = Link::kOpen;
  reconnect_deadline_ = absl::InfiniteFuture();
  Tell(
      absl::StrCat("resumed with the rendezvous at ", config_.endpoint,
                   " in round ", resumed.round(), "; the workers kept running"),
      effects);
  if (owed_rejoin_) return SendRejoinIfOwed(effects);
  // A report sent while the service was away may be lost: say it again.
  Report(effects);
}

void AgentPolicy::OnProbeResult(const absl::Status& status, absl::Time now,
                                AgentEffects* effects) {
  if (link_ != Link::kConnecting) return;
  if (MayComeUp(status)) {
    // Said now and every kUnreachableEvery, as the waiting line is: a node
    // that cannot reach its rendezvous must not wait in silence.
    const bool unreached =
        absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
    if (!unreached || now < unreachable_due_) return;
    unreachable_due_ = now + kUnreachableEvery;
    Tell(absl::StrCat("cannot reach the rendezvous at ", config_.endpoint, " (",
                      UnreachableReason(status), "); still trying for ",
                      absl::FormatDuration(absl::Trunc(
                          first_answer_deadline_ - now, absl::Seconds(1))),
                      " (--rdzv_conf join_timeout)"),
         effects);
    return;
  }
  Tell(absl::StrCat("cannot talk to the rendezvous at ", config_.endpoint, ": ",
                    status.message(),
                    "; is it a ctrun rendezvous (a ctrund or a ctrun agent: "
                    "a job cannot mix torchrun and ctrun nodes), and is TLS "
                    "set up alike on both sides (--rdzv_conf tls_ca here for "
                    "a rendezvous served with TLS, none for one without)?"),
       effects);
  CloseLink(effects);
  End(Ending::kLost, now, effects);
}

void AgentPolicy::OnProgress(const v1::Progress& p, absl::Time now,
                             AgentEffects* effects) {
  // Heard while the workers still stop (for the round they will rejoin):
  // shown later, it would be stale.
  if (phase_ != Phase::kJoining) return;
  const bool changed = !progress_ || progress_->joined() != p.joined() ||
                       progress_->pending_count() != p.pending_count() ||
                       progress_->round() != p.round();
  progress_ = p;
  progress_at_ = now;
  if (p.spare() && !told_spare_) {
    // Said at once: a spare may wait for days, and its operator should
    // know why it runs nothing.
    told_spare_ = true;
    Tell(absl::StrCat("this node is a spare of job '", config_.options.run_id,
                      "' (its ", p.max_nodes(),
                      p.max_nodes() == 1 ? " node runs" : " nodes run",
                      "): it holds no rank and takes the slot of a node "
                      "that is lost"),
         effects);
    Record("spare_waiting", effects);
    if (config_.parks && live_workers() == 0) {
      Tell("its workers start now and wait in wait_for_slot() for a slot",
           effects);
      parked_ = true;
      workers_.assign(static_cast<size_t>(config_.options.local_world_size),
                      Worker{});
      effects->push_back(agent_effect::ParkWorkers{});
    }
  }
  // Quiet when the round closes quickly; then a line on each change (at
  // most every few seconds) and every half minute while nothing changes.
  if (progress_due_ == absl::InfiniteFuture()) {
    progress_due_ = now + kProgressQuietFor;
  } else if (changed && now >= progress_printed_ + kProgressEvery &&
             progress_printed_ != absl::InfinitePast()) {
    PrintProgress(now, effects);
  }
}

void AgentPolicy::PrintProgress(absl::Time now, AgentEffects* effects) {
  const v1::Progress& p = *progress_;
  progress_printed_ = now;
  progress_due_ = now + kProgressRepeat;
  // The service's countdowns, as of now.
  auto left = [&](int64_t ms) {
    return absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(std::max(
        absl::ZeroDuration(), absl::Milliseconds(ms) - (now - progress_at_)))));
  };
  const std::string& at = config_.endpoint;
  std::string line;
  if (p.waiting_for_slot()) {
    line = absl::StrCat("the job at ", at, " runs with its ", p.max_nodes(),
                        " nodes; waiting as a spare for a free slot");
  } else if (p.joined() < p.min_nodes()) {
    const int32_t more = p.min_nodes() - p.joined();
    line = absl::StrCat("waiting for ", more,
                        more == 1 ? " more node" : " more nodes", " at ", at,
                        " (", p.joined(), "/", p.min_nodes(), " joined");
  } else {
    line = absl::StrCat("waiting for more nodes at ", at,
                        " until the last call ends (", p.joined(),
                        " joined, up to ", p.max_nodes());
  }
  if (!p.waiting_for_slot()) {
    if (p.round() > 0) absl::StrAppend(&line, "; round ", p.round());
    if (p.missing_node_ranks_size() > 0) {
      absl::StrAppend(&line, "; missing node ranks [",
                      absl::StrJoin(p.missing_node_ranks(), ","), "]");
    }
    if (p.pending_size() > 0) {
      absl::StrAppend(&line,
                      "; not back yet: ", absl::StrJoin(p.pending(), ", "));
    } else if (p.pending_count() > 0) {
      // A node's own acknowledgement counts them without names.
      absl::StrAppend(&line, "; ", p.pending_count(),
                      p.pending_count() == 1 ? " node" : " nodes",
                      " not back yet");
    }
    if (p.last_call_remaining_ms() >= 0) {
      absl::StrAppend(&line, "; closing in ", left(p.last_call_remaining_ms()));
    }
    absl::StrAppend(&line, "; join timeout in ",
                    left(p.join_timeout_remaining_ms()), ")");
  }
  if (p.other_waiting_jobs_size() > 0) {
    std::vector<std::string> others;
    for (const auto& o : p.other_waiting_jobs()) {
      others.push_back(absl::StrCat("'", o.job_id(), "' (", o.joined(), "/",
                                    o.min_nodes(), " joined)"));
    }
    absl::StrAppend(&line, "; also waiting there: job ",
                    absl::StrJoin(others, ", job "),
                    " (is --rdzv_id the same on every node?)");
  }
  Tell(line, effects);
}

WorkerFailureRecord AgentPolicy::RootCause(const v1::JobFailed& failed) {
  const v1::WorkerFailure& f = failed.root_cause();
  const std::string& node = failed.root_cause_node();
  WorkerFailureRecord r;
  r.time = absl::FromUnixMicros(f.time_us());
  r.host = node.substr(0, node.rfind(':'));
  r.rank = f.global_rank();
  r.local_rank = f.local_rank();
  r.signal = f.signal();
  r.exit_code = f.signal() != 0 ? 0 : f.exit_code();
  r.pid = f.pid();
  r.error_file = f.error_file();
  r.hung = f.hung();
  // The message says the signal again when nothing else ended it.
  if (f.message() != SignalName(f.signal())) r.cause = f.message();
  r.remote = true;
  r.failure_class = f.failure_class() == v1::FAILURE_CLASS_UNSPECIFIED
                        ? v1::OTHER
                        : f.failure_class();
  return r;
}

std::string AgentPolicy::ErrorFileOf(int local_rank) const {
  if (local_rank < 0 || local_rank >= static_cast<int>(workers_.size())) {
    return "";
  }
  return workers_[local_rank].error_file;
}

WorkerFailureRecord AgentPolicy::ExitFailure(const Worker& w,
                                             const WorkerExit& exit,
                                             const std::string& cause) const {
  WorkerFailureRecord record{exit.wall_time, config_.hostname, w.rank,
                             w.local_rank,   exit.exit_code,   exit.signal,
                             w.pid,          w.error_file,     cause,
                             false};
  FailureFacts facts;
  facts.exit_code = exit.exit_code;
  facts.signal = exit.signal;
  facts.error_message = exit.error_message;
  facts.last_lines = exit.last_lines;
  facts.oom_killed = exit.oom_killed;
  ClassifiedFailure classified = ClassifyFailure(facts);
  // A rank other than 0 reading the terminal: the program's to change.
  record.failure_class =
      exit.stopped_on_terminal ? v1::USER_ERROR : classified.failure_class;
  record.error = std::move(classified.error);
  return record;
}

void AgentPolicy::Report(AgentEffects* effects) const {
  if (link_ != Link::kOpen || !assignment_) return;
  v1::AgentMessage m;
  auto* r = m.mutable_worker_report();
  r->set_round(assignment_->round());
  r->set_state(report_);
  if (report_ == v1::WorkerReport::RUNNING) {
    r->set_kept_workers(kept_workers_);
    r->set_recovery_s(recovery_s_);
  }
  if (report_ == v1::WorkerReport::FAILED && !failures_.empty()) {
    const WorkerFailureRecord& failure = failures_.front();
    auto* f = r->mutable_failure();
    f->set_global_rank(failure.rank);
    f->set_local_rank(failure.local_rank);
    f->set_exit_code(failure.ExitCode());
    f->set_signal(failure.signal);
    f->set_hung(failure.hung);
    f->set_waiting(failure.waiting);
    f->set_error_file(failure.error_file);
    f->set_pid(failure.pid);
    f->set_time_us(absl::ToUnixMicros(failure.time));
    f->set_failure_class(failure.failure_class);
    f->set_no_progress(failure.no_progress);
    if (!failure.cause.empty()) {
      f->set_message(failure.cause);
    } else if (!failure.error.empty()) {
      f->set_message(failure.error);
    } else if (failure.signal != 0) {
      f->set_message(SignalName(failure.signal));
    }
  }
  effects->push_back(Send{std::move(m)});
}

void AgentPolicy::SendRejoinIfOwed(AgentEffects* effects) {
  if (!owed_rejoin_ || link_ != Link::kOpen) return;
  effects->push_back(SendRejoin{*owed_rejoin_, unhealthy_});
  owed_rejoin_.reset();
}

// --- the round's course
// -------------------------------------------------------

void AgentPolicy::OnAssignment(const v1::Assignment& a, absl::Time now,
                               AgentEffects* effects) {
  if (phase_ != Phase::kJoining) return;
  const auto& o = config_.options;
  assignment_ = a;
  ++assignments_;
  phase_ = Phase::kRunning;
  report_ = v1::WorkerReport::RUNNING;
  stop_aware_ = holding_ = false;
  stop_signal_ = 0;
  hold_poll_at_ = absl::InfiniteFuture();
  if (stop_posted_) {  // kept workers must not see the last round's stop
    effects->push_back(agent_effect::PostStop{agent_effect::StopState::kIdle});
    stop_posted_ = false;
  }
  kept_workers_ = 0;
  recovery_s_ = 0;
  failures_.clear();
  progress_.reset();
  progress_due_ = absl::InfiniteFuture();
  progress_printed_ = absl::InfinitePast();
  // In-process recovery: the workers still running keep their processes
  // (and their slots); the other local ranks get new ones.
  std::vector<Worker> before = std::move(workers_);
  workers_.assign(static_cast<size_t>(o.local_world_size), Worker{});
  std::vector<int> kept, fresh;
  for (int lr = 0; lr < o.local_world_size; ++lr) {
    Worker& w = workers_[static_cast<size_t>(lr)];
    if (static_cast<size_t>(lr) < before.size() &&
        before[static_cast<size_t>(lr)].alive) {
      w = before[static_cast<size_t>(lr)];
      w.kept = true;
      w.restarting = false;
      w.timer_scope.clear();
      kept.push_back(lr);
    } else {
      fresh.push_back(lr);
    }
    w.local_rank = lr;
    w.rank = static_cast<int>(a.first_global_rank()) + lr;
  }
  recap_.RoundStarted(a.round(), a.restart_count(), a.max_restarts(),
                      static_cast<int>(fresh.size()), now);
  if (!omp_notice_given_ && o.local_world_size > 1 &&
      !config_.omp_threads_set) {
    Tell(absl::StrCat("OMP_NUM_THREADS is unset; setting it to 1 for each of "
                      "the ",
                      o.local_world_size,
                      " workers so that they do not overload the node"),
         effects);
    omp_notice_given_ = true;
  }
  monitor_.MergeLearned(a.longest());
  if (o.hang_timeout.mode == HangTimeout::Mode::kAuto) {
    if (auto longest = monitor_.Longest("")) {
      Tell(absl::StrCat(
               "hang timeout ", absl::FormatDuration(monitor_.TimeoutIn("")),
               " after each worker's warm-up: ", ProgressMonitor::kAutoFactor,
               " x the longest silence this job has shown (",
               absl::FormatDuration(*longest), ")"),
           effects);
    }
  }
  {
    v1::Event& e = Record("assigned", effects);
    e.set_group_rank(a.group_rank());
    e.set_nodes(a.group_world_size());
    e.set_world_size(a.world_size());
    e.set_master(absl::StrCat(a.master_addr(), ":", a.master_port()));
    e.set_restart_count(a.restart_count());
    e.set_max_restarts(a.max_restarts());
  }
  if (!a.took_slot_of().empty()) {
    const int32_t last = a.first_global_rank() + o.local_world_size - 1;
    Tell(absl::StrCat(
             "this spare takes group rank ", a.group_rank(), ", the slot of ",
             a.took_slot_of(), ", which was lost: ",
             last > a.first_global_rank()
                 ? absl::StrCat("ranks ", a.first_global_rank(), "..", last)
                 : absl::StrCat("rank ", last),
             " of ", a.world_size()),
         effects);
    Record("slot_taken", effects)
        .set_detail(absl::StrCat("the slot of ", a.took_slot_of()));
  }
  told_spare_ = false;
  if (!a.restart_refunded().empty()) {
    refunds_.push_back(a.restart_refunded());
    Tell(absl::StrCat(a.restart_refunded(), " (restarts used ",
                      a.restart_count(), "/", a.max_restarts(), ")"),
         effects);
  }
  if (std::exchange(parked_, false))
    return Unpark(a, kept, fresh, now, effects);
  if (kept.empty()) {
    recovering_.reset();
    effects->push_back(StartWorkers{a, {}});
    return;
  }
  std::string line = absl::StrCat(
      "round ", a.round(), ": ", Ranks(kept),
      kept.size() == 1 ? " kept its process" : " kept their processes");
  if (!fresh.empty()) {
    absl::StrAppend(&line, "; new process", fresh.size() == 1 ? "" : "es",
                    " for ", Ranks(fresh));
  }
  Tell(line, effects);
  Record("workers_kept", effects)
      .set_detail(absl::StrCat("kept ", Ranks(kept, true), "; new ",
                               Ranks(fresh, true)));
  kept_workers_ = static_cast<int32_t>(kept.size());
  effects->push_back(agent_effect::HandOver{a, kept});
  recovery_deadline_ = now + o.recovery_timeout;
  recovering_ = Recovering{ended_at_, kept, fresh, now + o.recovery_timeout};
  if (!fresh.empty()) {
    effects->push_back(StartWorkers{a, fresh});
    return;
  }
  WorkersUp(now, effects);
}

void AgentPolicy::OnWorkersStarted(const std::vector<WorkerStart>& started,
                                   absl::Time now, AgentEffects* effects) {
  if (phase_ == Phase::kJoining && parked_)
    return OnParked(started, now, effects);
  if (phase_ != Phase::kRunning) return;
  for (const WorkerStart& s : started) {
    if (s.local_rank < 0 || s.local_rank >= static_cast<int>(workers_.size())) {
      continue;
    }
    Worker& w = workers_[static_cast<size_t>(s.local_rank)];
    w.error_file = s.error_file;
    v1::Event& e =
        Record(s.pid > 0 ? "worker_started" : "worker_start_failed", effects);
    e.set_rank(w.rank);
    e.set_local_rank(w.local_rank);
    if (s.pid > 0) {
      w.pid = s.pid;
      w.alive = true;
      w.started = now;
      w.kept = w.restarting = w.resilient = false;
      w.replacement = recovering_.has_value();
      w.round_left = -1;
      w.warm = s.warm;
      if (s.warm) e.set_detail("warm");
      e.set_pid(s.pid);
      continue;
    }
    e.set_detail(s.error);
    Tell(s.error, effects);
    WorkerFailureRecord failure{
        s.wall_time, config_.hostname, w.rank, w.local_rank, 127, 0,
        0,           w.error_file,     "",     false};
    failure.failure_class = v1::USER_ERROR;
    failure.error = s.error;
    OnWorkerFailure(failure, now, effects);
    return;
  }
  WorkersUp(now, effects);
}

void AgentPolicy::OnParked(const std::vector<WorkerStart>& started,
                           absl::Time now, AgentEffects* effects) {
  for (const WorkerStart& s : started) {
    if (s.local_rank < 0 || s.local_rank >= static_cast<int>(workers_.size())) {
      continue;
    }
    Worker& w = workers_[static_cast<size_t>(s.local_rank)];
    w.local_rank = s.local_rank;
    w.rank = -1;
    if (s.pid <= 0) {
      // It starts with the slot instead, cold or warm as any start.
      Tell(absl::StrCat("cannot park the worker of local rank ", s.local_rank,
                        ": ", s.error,
                        "; it starts when this spare takes a slot"),
           effects);
      continue;
    }
    w.pid = s.pid;
    w.alive = true;
    w.started = now;
    w.warm = s.warm;
    v1::Event& e = Record("worker_started", effects);
    e.set_local_rank(w.local_rank);
    e.set_pid(s.pid);
    e.set_detail(s.warm ? "parked, warm" : "parked");
  }
}

void AgentPolicy::Unpark(const v1::Assignment& a, const std::vector<int>& kept,
                         const std::vector<int>& fresh, absl::Time now,
                         AgentEffects* effects) {
  recovering_.reset();
  if (!kept.empty()) {
    Tell(absl::StrCat("its parked ",
                      kept.size() == 1 ? "worker takes " : "workers take ",
                      Ranks(kept)),
         effects);
    Record("workers_unparked", effects).set_detail(Ranks(kept, true));
    effects->push_back(agent_effect::HandOver{a, kept});
    recovery_deadline_ = now + config_.options.recovery_timeout;
  }
  if (!fresh.empty()) {
    effects->push_back(StartWorkers{a, fresh});
    return;
  }
  WorkersUp(now, effects);
}

void AgentPolicy::WorkersUp(absl::Time now, AgentEffects* effects) {
  const auto& check = config_.options.process_group_check;
  if (check && !process_group_checked_ && assignment_->world_size() > 1 &&
      assignment_->group_rank() == 0) {
    process_group_check_at_ = now + *check;
  }
  std::vector<int> ranks;
  for (const Worker& w : workers_) ranks.push_back(w.rank);
  monitor_.Start(std::move(ranks), now);
  timers_.Clear();
  timer_kills_.clear();
  Report(effects);
}

void AgentPolicy::OnWorkerExit(const WorkerExit& e, absl::Time now,
                               AgentEffects* effects) {
  auto it = std::find_if(
      workers_.begin(), workers_.end(),
      [&](const Worker& w) { return w.local_rank == e.local_rank; });
  if (it == workers_.end() || !it->alive) return;
  it->alive = false;
  monitor_.Exited(e.local_rank);
  {
    v1::Event& r = Record("worker_exited", effects);
    r.set_rank(it->rank);
    r.set_local_rank(it->local_rank);
    r.set_pid(it->pid);
    r.set_exit_code(e.signal != 0 ? 128 + e.signal : e.exit_code);
    if (e.signal != 0) r.set_signal(e.signal);
    r.set_duration_s(absl::ToDoubleSeconds(now - it->started));
  }
  std::string timer_cause;
  if (!it->timer_scope.empty() && e.signal == it->timer_signal) {
    timer_cause =
        absl::StrCat("torchrun file timer '", it->timer_scope,
                     "' expired; ctrun killed it with ", SignalName(e.signal));
  }
  if (phase_ == Phase::kStopping || phase_ == Phase::kCollecting) {
    // Expected when stopping: it was asked to.
    // Stopping for a local failure, a worker that failed on its own (not
    // of the stop: SIGTERM, SIGKILL, a shell's 128+N for them) is listed
    // too, as torchrun lists every failed rank.
    const int code = e.signal != 0 ? 128 + e.signal : e.exit_code;
    if (!failures_.empty() && code != 0 && code != 128 + SIGTERM &&
        code != 128 + SIGKILL && timer_cause.empty()) {
      failures_.push_back(ExitFailure(*it, e, timer_cause));
    }
    if (live_workers() > 0) return;
    if (phase_ == Phase::kCollecting) return EndEvidence(now, effects);
    return OnStopped(now, effects);
  }
  if (phase_ == Phase::kJoining && parked_) {
    Tell(absl::StrCat("a parked worker (local rank ", it->local_rank, ", pid ",
                      it->pid, ") ended (",
                      e.signal ? SignalName(e.signal)
                               : absl::StrCat("exit code ", e.exit_code),
                      ") before this spare took a slot; it starts afresh "
                      "when the spare does"),
         effects);
    return;
  }
  if (phase_ != Phase::kRunning) return;
  if (it->restarting) {
    // In-process recovery killed it for not taking the new world in time.
    effects->push_back(StartWorkers{*assignment_, {it->local_rank}});
    return;
  }
  if (e.signal == 0 && e.exit_code == 0) {
    // Not over a failure that the rendezvous has yet to answer (the
    // others kept running for in-process recovery).
    if (live_workers() == 0 && report_ != v1::WorkerReport::FAILED) {
      monitor_.Stop();
      report_ = v1::WorkerReport::SUCCEEDED;
      phase_ = Phase::kWaiting;
      Report(effects);
    }
    return;
  }
  std::string how =
      e.stopped_on_terminal
          ? absl::StrCat("stopped on ", SignalName(e.signal),
                         " trying to use the terminal, which only local rank "
                         "0 of a job in the terminal's foreground can read "
                         "(give the others input another way); ended it")
      : !timer_cause.empty()
          ? absl::StrCat("was killed by ", SignalName(e.signal),
                         ": its torchrun file timer '", it->timer_scope,
                         "' expired")
      : e.signal ? absl::StrCat("was killed by ", SignalName(e.signal))
                 : absl::StrCat("exited with code ", e.exit_code);
  WorkerFailureRecord failure = ExitFailure(*it, e, timer_cause);
  // Progress: a step signalled, in a job that signals steps; else, with
  // --min_progress_seconds, a long enough run.
  stepped_ever_ |= e.attempt_stepped;
  if (stepped_ever_) {
    failure.no_progress = !e.attempt_stepped;
  } else {
    const absl::Duration min = config_.options.min_progress;
    failure.no_progress = min > absl::ZeroDuration() && now - it->started < min;
  }
  // In process, the others keep running only where a restart will come:
  // never a promise the next line breaks.
  const int used = assignment_ ? assignment_->restart_count() : 0;
  const int budget = config_.options.max_restarts;
  const bool restarts = used < budget && RestartsOn(config_.options.restart_on,
                                                    failure.failure_class);
  std::string next = "; stopping the others";
  if (inprocess() && restarts) {
    next = "; the others keep running (--recovery=inprocess)";
  } else if (inprocess() && used >= budget) {
    next = absl::StrCat("; no restart left (--max_restarts=", budget,
                        "): the job ends");
  }
  Tell(absl::StrCat(
           "worker rank ", it->rank, " (local ", it->local_rank, ", pid ",
           it->pid, ") ", how, ": ", FailureClassName(failure.failure_class),
           failure.error.empty() ? "" : " (" + failure.error + ")", next),
       effects);
  OnWorkerFailure(failure, now, effects);
}

// --- hangs, evidence, file timers -------------------------------------------

void AgentPolicy::OnProgressRead(const std::vector<ProgressSample>& samples,
                                 absl::Time now, absl::Time wall_now,
                                 AgentEffects* effects) {
  if (phase_ != Phase::kRunning) return;
  wall_offset_ = wall_now - now;
  uint64_t steps = 0;
  for (const ProgressSample& sample : samples) {
    steps += sample.beats + sample.sections_done;
  }
  recap_.Stepped(steps, now);
  for (size_t i = 0; i < samples.size() && i < workers_.size(); ++i) {
    workers_[i].resilient = samples[i].resilient;
    workers_[i].round_left = samples[i].round_left;
    stepped_ever_ |= samples[i].beats > 0 || samples[i].sections_done > 0;
  }
  const std::vector<SilentWorker> silent = monitor_.Observe(samples, now);
  if (const std::vector<int> ranks = monitor_.TakeUnsignalled();
      !ranks.empty()) {
    Tell(absl::StrCat(
             "no worker of this job has sent a progress signal within its "
             "warm-up (",
             absl::FormatDuration(config_.options.hang_timeout.warmup),
             ", --hang_warmup): hang detection needs ctrun.heartbeat(), "
             "ctrun.section() or torchrun's file timers, and is off for rank ",
             absl::StrJoin(ranks, ", rank "),
             " until a worker of the job sends one"),
         effects);
  }
  if (!silent.empty()) OnHang(silent, now, wall_now, effects);
  if (phase_ == Phase::kRunning) TrackStop(samples, effects);
  if (recovering_ && phase_ == Phase::kRunning) {
    TrackRecovery(samples, now, wall_now, effects);
  }
}

void AgentPolicy::TrackRecovery(const std::vector<ProgressSample>& samples,
                                absl::Time now, absl::Time wall_now,
                                AgentEffects* effects) {
  const int64_t round = assignment_->round();
  const size_t n = std::min(samples.size(), workers_.size());
  for (size_t i = 0; i < n; ++i) {
    Worker& w = workers_[i];
    if (samples[i].stuck && w.alive && w.kept && !w.restarting &&
        w.round_left < round) {
      RestartUnreleased(
          w,
          absl::StrCat("is blocked forming round ", w.round_left,
                       "'s process group, waiting for a peer of that round "
                       "where ctrun.resilient cannot release it, and cannot "
                       "take round ",
                       round, "'s world"),
          now, effects);
    }
  }
  Recovering& r = *recovering_;
  if (r.beats.empty()) {  // not formed yet, as last seen
    absl::Time formed = absl::InfinitePast();
    std::vector<int> unformed;
    for (size_t i = 0; i < n; ++i) {
      const Worker& w = workers_[i];
      // A kept worker that has not taken the world is TickRecovery's.
      if (!w.alive || w.restarting || (w.kept && w.round_left < round)) {
        continue;
      }
      if (samples[i].round_ready < round) {
        unformed.push_back(static_cast<int>(i));
      } else {
        formed = std::max(formed, samples[i].ready_time);
      }
    }
    const bool waiting_for_others =
        std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
          return w.alive && !w.restarting && w.kept && w.round_left < round;
        });
    if (!unformed.empty() || waiting_for_others) {
      if (now >= r.deadline && !unformed.empty()) {
        RoundNotRecovered(unformed, {}, now, wall_now, effects);
      }
      return;
    }
    r.formed = formed;
    r.formed_seen = now;
    for (size_t i = 0; i < n; ++i) {
      r.beats.push_back(samples[i].beats);
      r.sections.push_back(samples[i].sections_done);
    }
  }
  // Recovered means every rank stepped again (a heartbeat, or an outermost
  // section's end) in the new group, not that the group formed: a kept
  // rank can form it and die at its next step.
  bool signalling = false;
  for (size_t i = 0; i < n; ++i) {
    signalling |= samples[i].beats > 0 || samples[i].sections_done > 0;
  }
  absl::Time stepped = absl::InfinitePast();
  std::vector<int> not_stepped;
  for (size_t i = 0; i < n; ++i) {
    if (!workers_[i].alive) continue;
    if (samples[i].beats > r.beats[i]) {
      stepped = std::max(stepped, samples[i].beat_time);
    } else if (samples[i].sections_done > r.sections[i]) {
      stepped = std::max(stepped, samples[i].event_time);
    } else {
      not_stepped.push_back(static_cast<int>(i));
    }
  }
  if (signalling && !not_stepped.empty()) {
    if (now >= r.deadline) {
      RoundNotRecovered({}, not_stepped, now, wall_now, effects);
    }
    return;
  }
  // Worker clock readings: clamped to what the agent saw (a worker may
  // write anything into its slot).
  auto seen = [&](absl::Time t) { return std::clamp(t, r.ended, now); };
  auto since = [&](absl::Time t) {
    return absl::StrFormat("%.2fs", absl::ToDoubleSeconds(seen(t) - r.ended));
  };
  absl::Time left = absl::InfinitePast(), up = absl::InfinitePast();
  for (int lr : r.kept) left = std::max(left, samples[lr].left_time);
  int warm = 0;
  for (int lr : r.fresh) {
    up = std::max(up, samples[lr].left_time);
    warm += workers_[lr].warm;
  }
  std::string parts =
      absl::StrCat(Ranks(r.kept), " took the new world at ", since(left));
  if (!r.fresh.empty()) {
    absl::StrAppend(&parts, ", new process", r.fresh.size() == 1 ? "" : "es",
                    " for ", Ranks(r.fresh), " up at ", since(up),
                    warm == static_cast<int>(r.fresh.size()) ? " (warm)"
                    : warm == 0                              ? " (cold)"
                                                             : " (some warm)");
  }
  absl::StrAppend(&parts, ", process group formed at ", since(r.formed));
  if (signalling) absl::StrAppend(&parts, ", first step at ", since(stepped));
  const absl::Time done = seen(signalling ? stepped : r.formed);
  if (signalling) {
    Tell(absl::StrCat("round ", round, " recovered in ", since(done),
                      " from the failure: ", parts),
         effects);
  } else {
    Tell(absl::StrCat("round ", round, ": process group formed in ",
                      since(done), " from the failure: ", parts,
                      "; no rank sends progress signals, so when every rank "
                      "steps again is not known (ctrun.heartbeat() or "
                      "ctrun.section() would tell)"),
         effects);
  }
  v1::Event& e =
      Record(signalling ? "round_recovered" : "round_formed", effects);
  e.set_duration_s(absl::ToDoubleSeconds(done - r.ended));
  e.set_detail(parts);
  recovering_.reset();
  // The rendezvous hears it too (ctrun status, metrics).
  recovery_s_ = std::max(1e-6, absl::ToDoubleSeconds(done - r.ended));
  if (report_ == v1::WorkerReport::RUNNING) Report(effects);
}

void AgentPolicy::RoundNotRecovered(const std::vector<int>& unformed,
                                    const std::vector<int>& unstepped,
                                    absl::Time now, absl::Time wall_now,
                                    AgentEffects* effects) {
  const int64_t round = assignment_->round();
  const std::vector<int>& late = unformed.empty() ? unstepped : unformed;
  const std::string what =
      unformed.empty()
          ? absl::StrCat(late.size() == 1 ? " has" : " have",
                         " not stepped since the process group formed")
          : absl::StrCat(late.size() == 1 ? " has" : " have",
                         " not formed the process group");
  Tell(absl::StrCat(
           "round ", round, " has not recovered within ",
           absl::FormatDuration(config_.options.recovery_timeout),
           " (--recovery_timeout): ", Ranks(late), what,
           ". Most often a collective that only some ranks make: a "
           "DistributedDataParallel (or anything bound to the process group) "
           "built outside the ctrun.resilient function broadcasts as it is "
           "built, in a new process only; build it inside the function. "
           "Their stacks follow; the round ends as a hang"),
       effects);
  Record("round_not_recovered", effects).set_detail(Ranks(late, true));
  recovering_.reset();
  std::vector<SilentWorker> silent;
  for (int lr : late) {
    SilentWorker s;
    s.local_rank = lr;
    s.since = workers_[static_cast<size_t>(lr)].started;
    silent.push_back(s);
  }
  OnHang(
      silent, now, wall_now, effects,
      absl::StrCat("round ", round, " did not recover within ",
                   absl::FormatDuration(config_.options.recovery_timeout),
                   " (--recovery_timeout): it has not ",
                   unformed.empty() ? "stepped since the process group formed"
                                    : "formed the process group"));
}

void AgentPolicy::OnHang(const std::vector<SilentWorker>& silent,
                         absl::Time now, absl::Time wall_now,
                         AgentEffects* effects, const std::string& why) {
  recap_.RoundEnded(now);
  const SilentWorker& first = silent.front();
  const Worker& w = workers_[static_cast<size_t>(first.local_rank)];
  auto seconds = [](absl::Duration d) {
    return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(10)));
  };
  const std::string in =
      first.section.empty() ? ""
                            : absl::StrCat(" in section '", first.section, "'");
  const std::string timeout =
      absl::StrCat("hang timeout ", seconds(first.timeout),
                   config_.options.hang_timeout.mode == HangTimeout::Mode::kAuto
                       ? ", learned"
                       : "");
  const std::string since = absl::FormatTime(
      "%H:%M:%E2S", wall_now - (now - first.since), absl::LocalTimeZone());
  const std::string cause =
      !why.empty() ? why
      : first.ever
          ? absl::StrCat("no progress for ", seconds(now - first.since),
                         " (since ", since, ")", in, " after ", first.beats,
                         " heartbeats (", timeout, ")")
          : absl::StrCat("no progress signal in the ",
                         seconds(now - first.since),
                         " since it started (allowed ", seconds(first.timeout),
                         " to start: --hang_warmup or the hang "
                         "timeout, the longer; other ranks of the job "
                         "do signal)");
  {
    v1::Event& e = Record("worker_hung", effects);
    e.set_rank(w.rank);
    e.set_local_rank(w.local_rank);
    e.set_pid(w.pid);
    e.set_detail(cause);
  }
  Tell(absl::StrCat("worker rank ", w.rank, " (local ", w.local_rank, ", pid ",
                    w.pid, ") is hung: ", cause,
                    "; collecting evidence from every worker of the job "
                    "before stopping them"),
       effects);
  if (silent.size() > 1) {
    std::vector<std::string> others;
    for (size_t i = 1; i < silent.size(); ++i) {
      const SilentWorker& o = silent[i];
      others.push_back(absl::StrCat(
          workers_[static_cast<size_t>(o.local_rank)].rank, " (",
          seconds(now - o.since),
          o.section.empty() ? "" : absl::StrCat(" in '", o.section, "'"), ")"));
    }
    Tell(absl::StrCat("also silent past their timeout here: rank ",
                      absl::StrJoin(others, ", rank "), "; rank ", w.rank,
                      " stopped first"),
         effects);
  }
  failures_.push_back(WorkerFailureRecord{wall_now, config_.hostname, w.rank,
                                          w.local_rank, 0, 0, w.pid,
                                          w.error_file, cause,
                                          /*hung=*/true});
  failures_.back().failure_class = v1::HANG;
  report_ = v1::WorkerReport::FAILED;
  StartEvidence(first.local_rank, now, effects);
  if (phase_ == Phase::kCollecting) {
    // Reported once the stacks are read (OnStacksRead): when every rank
    // stalls in one step, the first to stop signalling is a matter of
    // milliseconds, and the stacks may name the rank the others wait for.
    hang_record_ = failures_.size() - 1;
    report_owed_ = true;
    return;
  }
  // Without evidence to collect, the workers stop at once.
  Report(effects);
  if (phase_ == Phase::kRunning) {
    StopWorkers(SIGTERM, /*send=*/true, now, effects);
  }
}

void AgentPolicy::OnStacksRead(const std::vector<RankReading>& readings,
                               AgentEffects* effects) {
  const std::optional<HangVerdict> verdict = JudgeHang(readings);
  if (verdict) {
    Tell(verdict->line, effects);
    v1::Event& e = Record("hang_culprit", effects);
    if (!verdict->culprits.empty()) e.set_rank(verdict->culprits.front());
    e.set_detail(verdict->line);
  }
  if (verdict && hang_record_) {
    WorkerFailureRecord& hung = failures_[*hang_record_];
    const auto waits = [&](int rank) {
      return std::find(verdict->waiting.begin(), verdict->waiting.end(),
                       rank) != verdict->waiting.end();
    };
    if (waits(hung.rank) && !verdict->culprits.empty()) {
      // The rank the others wait for is the hang's cause.
      const auto culprit = std::find_if(
          readings.begin(), readings.end(), [&](const RankReading& r) {
            return r.rank == verdict->culprits.front();
          });
      const Worker& w = workers_[static_cast<size_t>(culprit->local_rank)];
      hung.cause = absl::StrCat(verdict->line, "; rank ", hung.rank,
                                " stopped signalling first: ", hung.cause);
      hung.rank = w.rank;
      hung.local_rank = w.local_rank;
      hung.pid = w.pid;
      hung.error_file = w.error_file;
    }
    hung.waiting = waits(hung.rank);
  }
  hang_record_.reset();
  if (std::exchange(report_owed_, false)) Report(effects);
}

void AgentPolicy::OnTimerExpired(Worker& w, const FileTimers::Expired& x,
                                 absl::Time now, AgentEffects* effects) {
  w.timer_scope = x.scope;
  w.timer_signal = x.signal;
  const std::string cause =
      absl::StrCat("torchrun file timer '", x.scope,
                   "' expired; ctrun killed it with ", SignalName(x.signal));
  {
    v1::Event& e = Record("worker_hung", effects);
    e.set_rank(w.rank);
    e.set_local_rank(w.local_rank);
    e.set_pid(w.pid);
    e.set_detail(cause);
  }
  failures_.push_back(WorkerFailureRecord{now + wall_offset_, config_.hostname,
                                          w.rank, w.local_rank, 0, x.signal,
                                          w.pid, w.error_file, cause, false});
  failures_.back().failure_class = v1::HANG;  // the user's own watchdog
  report_ = v1::WorkerReport::FAILED;
  Report(effects);
  timer_kills_.push_back(agent_effect::KillTimedOut{x.pid, x.signal, x.scope});
  StartEvidence(w.local_rank, now, effects);
  const bool collecting = phase_ == Phase::kCollecting;
  Tell(absl::StrCat("torchrun file timer '", x.scope, "' of worker rank ",
                    w.rank, " (pid ", w.pid, ") expired; ",
                    collecting ? "collecting evidence from this node's "
                                 "workers, then killing it with "
                               : "killing it with ",
                    SignalName(x.signal), " and stopping the others"),
       effects);
  if (!collecting) StopAfterEvidence(now, effects);
}

void AgentPolicy::StartEvidence(int focus, absl::Time now,
                                AgentEffects* effects) {
  if (phase_ != Phase::kRunning || live_workers() == 0 ||
      config_.options.hang_evidence_timeout <= absl::ZeroDuration()) {
    return;
  }
  phase_ = Phase::kCollecting;
  monitor_.Stop();
  evidence_deadline_ = now + config_.options.hang_evidence_timeout;
  effects->push_back(agent_effect::CollectEvidence{
      absl::StrCat("hang_round_", round()), focus, evidence_deadline_});
}

void AgentPolicy::OnEvidenceCollected(absl::Time now, AgentEffects* effects) {
  EndEvidence(now, effects);
}

void AgentPolicy::EndEvidence(absl::Time now, AgentEffects* effects) {
  if (phase_ != Phase::kCollecting) return;
  LeaveCollecting(effects);
  StopAfterEvidence(now, effects);
}

void AgentPolicy::StopAfterEvidence(absl::Time now, AgentEffects* effects) {
  // Expired file timers get the signal they asked for, first.
  for (auto& kill : std::exchange(timer_kills_, {})) {
    effects->push_back(std::move(kill));
  }
  // Evidence is collected only on the way to stopping (a hang here, or a
  // restart or failure for one elsewhere): stop now.
  StopWorkers(SIGTERM, /*send=*/true, now, effects);
}

void AgentPolicy::LeaveCollecting(AgentEffects* effects) {
  evidence_deadline_ = absl::InfiniteFuture();
  effects->push_back(agent_effect::EndEvidence{});
  phase_ = Phase::kRunning;
}

void AgentPolicy::OnTimerRequest(absl::string_view line, absl::Time now,
                                 absl::Time wall_now, AgentEffects* effects) {
  wall_offset_ = wall_now - now;
  auto request = ParseFileTimerRequest(line);
  absl::Status status =
      request.ok() ? timers_.Apply(*request, now, wall_now) : request.status();
  if (!status.ok() && malformed_timer_requests_++ == 0) {
    Tell(absl::StrCat(
             "ignoring a request on the file-timer FIFO: ", status.message(),
             " (further ones are ignored without a word)"),
         effects);
  }
}

void AgentPolicy::OnWorkerFailure(const WorkerFailureRecord& failure,
                                  absl::Time now, AgentEffects* effects) {
  recap_.RoundEnded(now);
  failures_.push_back(failure);
  const bool first = report_ != v1::WorkerReport::FAILED;
  report_ = v1::WorkerReport::FAILED;
  if (!inprocess()) {
    Report(effects);
    StopWorkers(SIGTERM, /*send=*/true, now, effects);
    return;
  }
  // The survivors keep running; the rendezvous's restart decides. Told
  // now, they leave the old round while it is decided.
  if (first) Report(effects);
  EndRoundOnce(now, effects);
}

void AgentPolicy::EndRoundOnce(absl::Time now, AgentEffects* effects) {
  if (!assignment_ || ended_round_ == assignment_->round() ||
      live_workers() == 0) {
    return;
  }
  ended_round_ = assignment_->round();
  ended_at_ = now;
  effects->push_back(agent_effect::EndRound{ended_round_});
}

std::string AgentPolicy::Ranks(const std::vector<int>& local_ranks,
                               bool listed) const {
  std::vector<int> ranks;
  for (int lr : local_ranks) ranks.push_back(workers_[lr].rank);
  const std::string joined = absl::StrJoin(ranks, ",");
  if (listed) return absl::StrCat("ranks [", joined, "]");
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", joined);
}

bool AgentPolicy::KeepsWorkers(const v1::RestartRequired& r,
                               AgentEffects* effects) const {
  if (!inprocess() || r.collect_evidence() || next_ == Next::kJoinAfresh ||
      live_workers() == 0) {
    return false;
  }
  if (phase_ != Phase::kRunning && phase_ != Phase::kJoining) return false;
  std::vector<int> plain;
  for (const Worker& w : workers_) {
    // A replacement still in its first start is resilient-to-be.
    if (w.alive && !w.resilient && !w.replacement) plain.push_back(w.rank);
  }
  if (plain.empty()) return true;
  Tell(absl::StrCat(plain.size() == 1 ? "rank " : "ranks ",
                    absl::StrJoin(plain, ","),
                    plain.size() == 1 ? " does not" : " do not",
                    " run under ctrun.resilient (or worker_lib's "
                    "re-creatable communicator): restarting this node's "
                    "workers the old way"),
       effects);
  return false;
}

void AgentPolicy::OnRestartRequired(const v1::RestartRequired& r,
                                    absl::Time now, AgentEffects* effects) {
  // Stopping for good: the other nodes restart without this one.
  if (ending_ != Ending::kNone || phase_ == Phase::kDone) return;
  // A new node's admission is no failure.
  if (r.reason() != v1::RestartRequired::NODE_WAITING) recap_.RoundEnded(now);
  {
    v1::Event& e = Record("restart_required", effects);
    e.set_round(static_cast<int32_t>(r.round()));
    e.set_reason(RestartReasonName(r.reason()));
    e.set_detail(r.detail());
    e.set_restart_count(r.restart_count());
  }
  if (KeepsWorkers(r, effects)) {
    Tell(
        absl::StrCat("round ", r.round(), " (restarts used ", r.restart_count(),
                     "/", config_.options.max_restarts, "): ", r.detail(),
                     "; the live workers keep their processes "
                     "(--recovery=inprocess)"),
        effects);
    EndRoundOnce(now, effects);
    phase_ = Phase::kJoining;
    monitor_.Stop();
    recovery_deadline_ = absl::InfiniteFuture();
    owed_rejoin_ = r.round();
    SendRejoinIfOwed(effects);
    return;
  }
  Tell(absl::StrCat("restarting the workers (round ", r.round(),
                    ", restarts used ", r.restart_count(), "/",
                    config_.options.max_restarts, "): ", r.detail()),
       effects);
  // A join afresh (the service lost this node) supersedes any rejoin; a
  // later restart request supersedes an earlier one.
  if (next_ != Next::kJoinAfresh) {
    next_ = Next::kRejoin;
    rejoin_round_ = r.round();
  }
  StopWorkers(SIGTERM, /*send=*/true, now, effects);
}

void AgentPolicy::OnSignal(int signal, bool from_parent, absl::Time now,
                           AgentEffects* effects) {
  if (phase_ == Phase::kDone) return;
  // Under Slurm, slurmstepd signals every process of the step: forwarding
  // would deliver it to the workers twice.
  const bool delivered = config_.options.parent_signals_workers && from_parent;
  if (signal == SIGTERM || signal == SIGUSR1 || signal == SIGUSR2) {
    if (AskToStop(signal, now, effects)) return;
    if (preemption_ && !preemption_->fallen_back) {
      preemption_->fallen_back = true;
      Tell(absl::StrCat(SignalName(signal), " again: no waiting for the stop"),
           effects);
    }
    // What the workers' stop check held back acts now; the workers had
    // the signal already when the parent delivered it.
    if (stop_aware_ && live_workers() > 0) {
      effects->push_back(
          agent_effect::PostStop{agent_effect::StopState::kFallback});
      stop_posted_ = true;
    }
  }
  ActOnSignal(signal, delivered, now, effects);
}

void AgentPolicy::ActOnSignal(int signal, bool delivered, absl::Time now,
                              AgentEffects* effects) {
  if (signal == SIGUSR1 || signal == SIGUSR2) {
    if (!delivered && live_workers() > 0) {
      effects->push_back(SignalWorkers{signal});
    }
    return;
  }
  if (signal == SIGTSTP) {
    Suspend(delivered, now, effects);
    return;
  }
  // A signal does not wait for the evidence.
  if (phase_ == Phase::kCollecting) LeaveCollecting(effects);
  if (ending_ == Ending::kSignal) {
    Tell(absl::StrCat(SignalName(signal), " again: killing the workers now"),
         effects);
    if (live_workers() > 0) effects->push_back(SignalWorkers{SIGKILL});
    return;
  }
  exit_signal_ = signal;
  ending_ = Ending::kSignal;
  const int live = live_workers();
  Tell(live == 0
           ? absl::StrCat("received ", SignalName(signal),
                          "; leaving the rendezvous")
           : absl::StrCat(
                 "received ", SignalName(signal), "; stopping ", live,
                 live == 1 ? " worker" : " workers", " (SIGKILL after ",
                 absl::FormatDuration(config_.options.shutdown_timeout), ")"),
       effects);
  StopWorkers(signal, /*send=*/!delivered, now, effects);
}

void AgentPolicy::OnTerminalStop(absl::Time now, AgentEffects* effects) {
  if (phase_ == Phase::kDone) return;
  Suspend(/*workers_told=*/false, now, effects);
}

void AgentPolicy::Suspend(bool workers_told, absl::Time now,
                          AgentEffects* effects) {
  const bool workers = live_workers() > 0;
  if (workers && !workers_told) effects->push_back(SignalWorkers{SIGTSTP});
  effects->push_back(SuspendAgent{});
  if (workers) effects->push_back(SignalWorkers{SIGCONT});
  // The rendezvous heard nothing while the agent was stopped.
  if (next_heartbeat_ != absl::InfiniteFuture()) next_heartbeat_ = now;
}

void AgentPolicy::End(Ending ending, absl::Time now, AgentEffects* effects) {
  ending_ = std::max(ending_, ending);
  StopWorkers(SIGTERM, /*send=*/true, now, effects);
}

void AgentPolicy::StopWorkers(int signal, bool send, absl::Time now,
                              AgentEffects* effects) {
  // Workers asked to stop are not asked again (a node lost while a signal
  // stops them, say): a second signal can cut short the handler that saves
  // their state. The SIGKILL deadline stands.
  // While evidence is collected the stop waits for it (EndEvidence).
  if (phase_ == Phase::kStopping || phase_ == Phase::kDone ||
      phase_ == Phase::kCollecting) {
    return;
  }
  phase_ = Phase::kStopping;
  monitor_.Stop();
  if (live_workers() == 0) return OnStopped(now, effects);
  if (send) effects->push_back(SignalWorkers{signal});
  kill_deadline_ = now + config_.options.shutdown_timeout;
}

void AgentPolicy::OnStopped(absl::Time now, AgentEffects* effects) {
  kill_deadline_ = give_up_deadline_ = absl::InfiniteFuture();
  effects->push_back(CollectWorkers{});
  if (ending_ != Ending::kNone) {
    phase_ = Phase::kDone;
    const int code = ExitCode(effects);
    CloseLink(effects);
    Record("agent_exited", effects).set_exit_code(code);
    effects->push_back(Exit{code});
    return;
  }
  const Next next = std::exchange(next_, Next::kWait);
  switch (next) {
    case Next::kJoinAfresh:
      phase_ = Phase::kJoining;
      assignment_.reset();  // that round's service is gone
      workers_.clear();
      parked_ = told_spare_ = false;
      JoinFresh(now, effects);
      return;
    case Next::kRejoin:
      phase_ = Phase::kJoining;
      Rejoin(rejoin_round_, effects);
      return;
    case Next::kWait:
      phase_ = Phase::kWaiting;
      return;
  }
}

int AgentPolicy::ExitCode(AgentEffects* effects) const {
  // A run that spent fewer restarts than it failed says why.
  for (const std::string& refund : refunds_) Tell(refund, effects);
  switch (ending_) {
    case Ending::kSignal:
      return 128 + exit_signal_;
    case Ending::kJobFailed: {
      // The job's root cause first (this node's own record of it, with its
      // traceback, when it failed here), then this node's other failures.
      std::vector<WorkerFailureRecord> summary = failures_;
      if (root_cause_) {
        auto own = std::find_if(summary.begin(), summary.end(),
                                [this](const WorkerFailureRecord& f) {
                                  return f.rank == root_cause_->rank;
                                });
        if (own == summary.end()) {
          summary.insert(summary.begin(), *root_cause_);
        } else {
          std::rotate(summary.begin(), own, own + 1);
        }
      }
      if (!summary.empty()) {
        effects->push_back(
            Print{FormatFailureSummary(config_.options.entrypoint, summary)});
        const WorkerFailureRecord& root = summary.front();
        const int used = assignment_ ? assignment_->restart_count() : 0;
        const int budget = config_.options.max_restarts;
        if (used < budget &&
            !RestartsOn(config_.options.restart_on, root.failure_class)) {
          Tell(absl::StrCat("rank ", root.rank, "'s failure is ",
                            FailureClassWords(root.failure_class),
                            root.error.empty() ? "" : " (" + root.error + ")",
                            ", which a restart cannot mend: not restarted, ",
                            budget - used, " of --max_restarts=", budget,
                            " left (--restart_on=",
                            FormatRestartOn(config_.options.restart_on),
                            "; add ", FailureClassName(root.failure_class),
                            " to restart for it)"),
               effects);
        }
        if (job_no_progress_) {
          Tell(absl::StrCat("the job's last attempts made no progress: "
                            "exiting ",
                            kNoProgressExitCode,
                            ", which says not to requeue it (the root "
                            "cause's own code was ",
                            root.ExitCode(), ")"),
               effects);
          return kNoProgressExitCode;
        }
        return root.ExitCode();
      }
      Tell(absl::StrCat("job failed: ", job_failure_), effects);
      return job_hung_ ? kHangExitCode : 1;
    }
    case Ending::kJobFinished:
      if (assignments_ == 0) {
        Tell(
            "the job finished without this node: it waited for a free slot "
            "and was never admitted",
            effects);
      }
      return 0;
    case Ending::kLost:
    case Ending::kNone:
      return 1;
  }
  return 1;
}

// --- time
// ----------------------------------------------------------------------

void AgentPolicy::Tick(absl::Time now, AgentEffects* effects) {
  if (phase_ == Phase::kDone) return;
  if (!TickLink(now, effects)) return;
  if (now >= ProgressDue()) PrintProgress(now, effects);
  if (now >= evidence_deadline_) EndEvidence(now, effects);
  TickProgress(now, effects);
  TickStop(now, effects);
  TickRecovery(now, effects);
  TickProcessGroup(now, effects);
  TickFileTimers(now, effects);
  TickSession(now, effects);
  TickStopping(now, effects);
}

bool AgentPolicy::TickLink(absl::Time now, AgentEffects* effects) {
  if (now >= first_answer_deadline_) {
    Tell(absl::StrCat("no answer from the rendezvous at ", config_.endpoint,
                      " within the join timeout of ",
                      absl::FormatDuration(config_.options.join_timeout),
                      "; is it up, and is this the right endpoint?"),
         effects);
    CloseLink(effects);
    End(Ending::kLost, now, effects);
    return false;
  }
  if (now >= probe_at_) {
    probe_at_ = now + kProbeEvery;
    effects->push_back(ProbeRendezvous{});
  }
  if (now >= reconnect_deadline_) {
    Tell(absl::StrCat("could not reconnect to the rendezvous at ",
                      config_.endpoint, " within ",
                      absl::FormatDuration(config_.options.reconnect_timeout),
                      " (--rdzv_conf reconnect_timeout); stopping the workers"),
         effects);
    CloseLink(effects);
    End(Ending::kLost, now, effects);
    if (phase_ == Phase::kDone) return false;
  }
  return true;
}

void AgentPolicy::TickProgress(absl::Time now, AgentEffects* effects) {
  if (phase_ == Phase::kRunning && now >= monitor_.NextPoll()) {
    monitor_.Polled(now);
    effects->push_back(agent_effect::ReadProgress{});
  }
  if (now >= monitor_.NextReport()) {
    if (link_ != Link::kOpen) {
      monitor_.DelayReport(now);  // kept for when the rendezvous is back
    } else if (auto report = monitor_.TakeReport(round(), now)) {
      v1::AgentMessage m;
      *m.mutable_progress_report() = *std::move(report);
      effects->push_back(Send{std::move(m)});
    }
  }
}

void AgentPolicy::TickFileTimers(absl::Time now, AgentEffects* effects) {
  for (FileTimers::Expired& x : timers_.TakeExpired(now)) {
    if (phase_ != Phase::kRunning) continue;
    // A stop signal would leave the job waiting for ever on a worker that
    // ctrun itself stopped.
    if (x.signal == SIGSTOP || x.signal == SIGTSTP || x.signal == SIGTTIN ||
        x.signal == SIGTTOU) {
      Tell(absl::StrCat("torchrun file timer '", x.scope, "' of pid ", x.pid,
                        " asks for ", SignalName(x.signal),
                        ", which would stop it, not end it: SIGKILL instead"),
           effects);
      x.signal = SIGKILL;
    }
    auto w = std::find_if(
        workers_.begin(), workers_.end(),
        [&](const Worker& w) { return w.alive && w.pid == x.pid; });
    if (w != workers_.end()) {
      OnTimerExpired(*w, x, now, effects);
    } else {
      // Maybe a process in a worker's group: the edge checks, and says.
      effects->push_back(agent_effect::KillTimedOut{x.pid, x.signal, x.scope});
    }
  }
}

void AgentPolicy::TickSession(absl::Time now, AgentEffects* effects) {
  if (now >= reopen_at_) {
    reopen_at_ = absl::InfiniteFuture();
    OpenSession(reopen_round_, now, effects);
  }
  if (now >= next_heartbeat_) {
    v1::AgentMessage m;
    m.mutable_heartbeat();
    effects->push_back(Send{std::move(m)});
    next_heartbeat_ = now + config_.options.keep_alive_interval;
  }
}

void AgentPolicy::TickStopping(absl::Time now, AgentEffects* effects) {
  if (now >= kill_deadline_) {
    kill_deadline_ = absl::InfiniteFuture();
    for (const Worker& w : workers_) {
      if (!w.alive) continue;
      Tell(absl::StrCat("worker rank ", w.rank, " (pid ", w.pid,
                        ") still running after ",
                        absl::FormatDuration(config_.options.shutdown_timeout),
                        "; sending SIGKILL"),
           effects);
    }
    effects->push_back(SignalWorkers{SIGKILL});
    give_up_deadline_ = now + kGiveUpAfterKill;
  }
  if (now >= give_up_deadline_) {
    give_up_deadline_ = absl::InfiniteFuture();
    for (Worker& w : workers_) {
      if (!w.alive) continue;
      Tell(absl::StrCat("worker rank ", w.rank, " (pid ", w.pid,
                        ") did not exit after SIGKILL (stuck in the kernel?); "
                        "leaving it behind"),
           effects);
      w.alive = false;
    }
    effects->push_back(AbandonWorkers{});
    OnStopped(now, effects);
  }
}

void AgentPolicy::TickProcessGroup(absl::Time now, AgentEffects* effects) {
  if (phase_ != Phase::kRunning || now < process_group_check_at_) return;
  process_group_check_at_ = absl::InfiniteFuture();
  effects->push_back(
      agent_effect::CheckProcessGroup{assignment_->master_port()});
}

void AgentPolicy::OnProcessGroupChecked(
    bool listening, const std::vector<ProgressSample>& samples, absl::Time now,
    AgentEffects* effects) {
  if (phase_ != Phase::kRunning || process_group_checked_) return;
  process_group_checked_ = true;
  const bool formed =
      listening ||
      std::any_of(samples.begin(), samples.end(), [](const ProgressSample& s) {
        return s.store_used || s.round_ready >= 0;
      });
  if (formed) return;
  const std::string what = absl::StrCat(
      "the job's ", assignment_->world_size(),
      " ranks formed no process group within ",
      absl::FormatDuration(*config_.options.process_group_check),
      " of their start: nothing listens on MASTER_PORT=",
      assignment_->master_port(),
      " on this node (group rank 0's) and no worker uses ctrun's store");
  Tell(absl::StrCat(what,
                    "; a script that never calls "
                    "torch.distributed.init_process_group trains each rank "
                    "alone (said once; --process_group_check=off)"),
       effects);
  Record("no_process_group", effects).set_detail(what);
}

void AgentPolicy::TickRecovery(absl::Time now, AgentEffects* effects) {
  if (phase_ != Phase::kRunning || !assignment_) return;
  const int64_t round = assignment_->round();
  const bool waiting =
      std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
        return w.alive && w.kept && w.round_left < round && !w.restarting;
      });
  if (!waiting) {
    recovery_deadline_ = absl::InfiniteFuture();
    return;
  }
  if (now < recovery_deadline_) return;
  recovery_deadline_ = absl::InfiniteFuture();
  for (Worker& w : workers_) {
    if (!w.alive || !w.kept || w.round_left >= round || w.restarting) continue;
    RestartUnreleased(
        w,
        absl::StrCat("did not take round ", round, "'s world within ",
                     absl::FormatDuration(config_.options.recovery_timeout),
                     " (--recovery_timeout): blocked where ctrun.resilient "
                     "cannot reach it"),
        now, effects);
  }
}

void AgentPolicy::RestartUnreleased(Worker& w, const std::string& why,
                                    absl::Time now, AgentEffects* effects) {
  Tell(absl::StrCat("worker rank ", w.rank, " (local ", w.local_rank, ", pid ",
                    w.pid, ") ", why, "; restarting it in a new process"),
       effects);
  Record("worker_not_recovered", effects).set_rank(w.rank);
  w.restarting = true;
  effects->push_back(agent_effect::SignalWorker{w.local_rank, SIGKILL});
  if (recovering_) {
    recovering_->deadline =
        std::max(recovering_->deadline, now + config_.options.recovery_timeout);
  }
}

absl::Time AgentPolicy::NextDeadline() const {
  if (phase_ == Phase::kDone) return absl::InfiniteFuture();
  const absl::Time running =
      phase_ == Phase::kRunning
          ? std::min({monitor_.NextPoll(), timers_.NextExpiry(),
                      recovery_deadline_, process_group_check_at_})
          : absl::InfiniteFuture();
  return std::min(
      {first_answer_deadline_, probe_at_, reconnect_deadline_, reopen_at_,
       next_heartbeat_, kill_deadline_, give_up_deadline_, ProgressDue(),
       evidence_deadline_, monitor_.NextReport(), running, hold_poll_at_,
       preemption_ && !preemption_->fallen_back ? preemption_->deadline
                                                : absl::InfiniteFuture()});
}

}  // namespace ctrun
