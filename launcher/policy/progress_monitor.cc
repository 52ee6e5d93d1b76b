#include "launcher/policy/progress_monitor.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace ctrun {

void ProgressMonitor::Start(std::vector<int> ranks, absl::Time now) {
  started_ = now;
  workers_.assign(ranks.size(), Worker{});
  for (size_t i = 0; i < ranks.size(); ++i) workers_[i].rank = ranks[i];
  next_poll_ = now + kPollEvery;
  next_report_ = now + kReportEvery;
}

void ProgressMonitor::Exited(int local_rank) {
  if (local_rank >= 0 && static_cast<size_t>(local_rank) < workers_.size()) {
    workers_[static_cast<size_t>(local_rank)].alive = false;
  }
}

void ProgressMonitor::MergeLearned(
    const google::protobuf::RepeatedPtrField<v1::LearnedInterval>& longest) {
  for (const v1::LearnedInterval& l : longest) {
    auto it = job_.find(l.section());
    if (it == job_.end() && job_.size() >= kMaxSections) continue;
    const absl::Duration d = absl::Milliseconds(l.longest_ms());
    if (it == job_.end()) {
      job_.emplace(l.section(), d);
    } else {
      it->second = std::max(it->second, d);
    }
  }
}

std::optional<absl::Duration> ProgressMonitor::Longest(
    const std::string& section) const {
  std::optional<absl::Duration> longest;
  for (const auto* figures : {&local_, &job_}) {
    if (auto it = figures->find(section); it != figures->end()) {
      longest = std::max(longest.value_or(absl::ZeroDuration()), it->second);
    }
  }
  return longest;
}

absl::Duration ProgressMonitor::TimeoutIn(const std::string& section) const {
  switch (timeout_.mode) {
    case HangTimeout::Mode::kOff:
      return absl::InfiniteDuration();
    case HangTimeout::Mode::kFixed:
      return timeout_.fixed;
    case HangTimeout::Mode::kAuto:
      break;
  }
  const std::optional<absl::Duration> longest = Longest(section);
  if (!longest) return timeout_.warmup;
  return std::max(kAutoFactor * *longest, kAutoFloor);
}

absl::Duration ProgressMonitor::TimeoutFor(const Worker& w,
                                           const std::string& section) const {
  const absl::Duration t = TimeoutIn(section);
  // Starting up (imports, loading data) is not a step.
  if (w.last.events == 0) return std::max(t, timeout_.warmup);
  if (timeout_.mode != HangTimeout::Mode::kAuto) return t;
  auto it = w.intervals.find(section);
  const bool warming_up =
      it == w.intervals.end() || it->second < kWarmupIntervals;
  return warming_up ? std::max(t, timeout_.warmup) : t;
}

void ProgressMonitor::Learn(Worker& w, const std::string& section, bool untimed,
                            absl::Duration silence) {
  int& seen = w.intervals[section];
  ++seen;
  // Warm-up silences, and those of untimed sections, say nothing about
  // how long the job's steps take.
  if (seen <= kWarmupIntervals || untimed) return;
  auto it = local_.find(section);
  if (it == local_.end()) {
    if (local_.size() < kMaxSections) local_.emplace(section, silence);
  } else {
    it->second = std::max(it->second, silence);
  }
}

std::vector<SilentWorker> ProgressMonitor::Observe(
    const std::vector<ProgressSample>& samples, absl::Time now) {
  std::vector<SilentWorker> silent;
  if (workers_.empty()) return silent;
  for (size_t i = 0; i < workers_.size() && i < samples.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.alive) continue;
    const ProgressSample& s = samples[i];
    if (s.events != w.last.events) {
      // The silence that the first new event ended began at the last event
      // seen (or the start), in what the worker was in then. With several
      // events since the last poll it is bounded by the newest one.
      const absl::Time from = w.last.events == 0 ? started_ : w.last.event_time;
      ProgressSample seen = s;
      seen.event_time = std::clamp(s.event_time, from, now);
      seen.beat_time = std::clamp(s.beat_time, started_, now);
      // Waiting in the stop check is no step's silence.
      Learn(w, w.last.section, w.last.untimed || w.last.held,
            seen.event_time - from);
      w.last = std::move(seen);
      signalled_ = true;
    }
    // A worker waiting in its stop check waits for the job's other ranks
    // (coordinated stops), which are timed themselves.
    if (timeout_.mode == HangTimeout::Mode::kOff || s.untimed || s.done ||
        s.held) {
      continue;
    }
    const bool ever = s.events > 0;
    const absl::Time since = ever ? w.last.event_time : started_;
    const absl::Duration timeout = TimeoutFor(w, s.section);
    if (now - since <= timeout) continue;
    if (!ever && !JobSignalled()) {
      if (!unsignalled_told_ &&
          std::find(unsignalled_.begin(), unsignalled_.end(), w.rank) ==
              unsignalled_.end()) {
        unsignalled_.push_back(w.rank);
      }
      continue;
    }
    silent.push_back(SilentWorker{static_cast<int>(i), since, ever, s.section,
                                  s.beats, timeout});
  }
  std::sort(silent.begin(), silent.end(),
            [](const SilentWorker& a, const SilentWorker& b) {
              return std::tie(a.since, a.beats, a.local_rank) <
                     std::tie(b.since, b.beats, b.local_rank);
            });
  return silent;
}

bool ProgressMonitor::JobSignalled() const {
  return signalled_ || !job_.empty() || !local_.empty();
}

std::vector<int> ProgressMonitor::TakeUnsignalled() {
  if (unsignalled_told_ || unsignalled_.empty()) return {};
  unsignalled_told_ = true;
  std::sort(unsignalled_.begin(), unsignalled_.end());
  return std::move(unsignalled_);
}

std::optional<v1::ProgressReport> ProgressMonitor::TakeReport(int64_t round,
                                                              absl::Time now) {
  if (workers_.empty()) return std::nullopt;
  next_report_ = now + kReportEvery;
  v1::ProgressReport report;
  report.set_round(round);
  for (const auto& [section, longest] : local_) {
    auto it = reported_.find(section);
    if (it != reported_.end() && it->second >= longest) continue;
    reported_[section] = longest;
    auto* l = report.add_longest();
    l->set_section(section);
    l->set_longest_ms(absl::ToInt64Milliseconds(longest));
  }
  for (Worker& w : workers_) {
    if (!w.alive) continue;
    const ProgressSample& s = w.last;
    // A rank that uses sections is timed by them: in a synchronous job its
    // heartbeats come as fast as the slowest rank's.
    if (s.sections_done > 0) {
      if (w.section_base && s.sections_done > w.base_done) {
        auto* p = report.add_paces();
        p->set_rank(w.rank);
        p->set_steps(static_cast<int64_t>(s.sections_done - w.base_done));
        p->set_mean_step_us(
            absl::ToInt64Microseconds((s.busy - w.base_busy) / p->steps()));
        p->set_sections(true);
      }
      // The first section is warm-up.
      w.section_base = true;
      w.base_done = s.sections_done;
      w.base_busy = s.busy;
      continue;
    }
    if (s.beats < static_cast<uint64_t>(kWarmupIntervals)) continue;
    if (w.beat_base && s.beats > w.base_beats) {
      auto* p = report.add_paces();
      p->set_rank(w.rank);
      p->set_steps(static_cast<int64_t>(s.beats - w.base_beats));
      p->set_mean_step_us(absl::ToInt64Microseconds(
          (s.beat_time - w.base_beat_time) / p->steps()));
    }
    w.beat_base = true;
    w.base_beats = s.beats;
    w.base_beat_time = s.beat_time;
  }
  if (report.longest_size() == 0 && report.paces_size() == 0) {
    return std::nullopt;
  }
  return report;
}

absl::Time ProgressMonitor::NextPoll() const {
  return workers_.empty() ? absl::InfiniteFuture() : next_poll_;
}

absl::Time ProgressMonitor::NextReport() const {
  return workers_.empty() ? absl::InfiniteFuture() : next_report_;
}

}  // namespace ctrun
