// ProgressMonitor: hang timeouts, learning and paces, on a fake clock.
#include "launcher/policy/progress_monitor.h"

#include <catch2/catch.hpp>

namespace ctrun {
namespace {

const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);

HangTimeout Fixed(absl::Duration d) {
  HangTimeout t;
  t.mode = HangTimeout::Mode::kFixed;
  t.fixed = d;
  return t;
}

HangTimeout Auto(absl::Duration warmup = absl::Seconds(300)) {
  HangTimeout t;
  t.mode = HangTimeout::Mode::kAuto;
  t.warmup = warmup;
  return t;
}

// Workers on a fake clock: each beats, enters and leaves sections, and the
// monitor reads their slots at every poll as the agent does.
class Board {
 public:
  Board(HangTimeout timeout, int workers, absl::Time start = kStart)
      : monitor_(timeout), now_(start), samples_(static_cast<size_t>(workers)) {
    std::vector<int> ranks;
    for (int i = 0; i < workers; ++i) ranks.push_back(10 + i);
    monitor_.Start(ranks, now_);
  }

  void Beat(int w) {
    ProgressSample& s = samples_[static_cast<size_t>(w)];
    ++s.beats;
    s.beat_time = now_;
    Event(w);
  }
  void Enter(int w, const std::string& section, bool untimed = false) {
    stack_[w].push_back({section, untimed, now_});
    Publish(w);
  }
  void Done(int w) { samples_[static_cast<size_t>(w)].done = true; }
  void Leave(int w) {
    auto& stack = stack_[w];
    ProgressSample& s = samples_[static_cast<size_t>(w)];
    if (stack.size() == 1) {
      s.busy += now_ - stack.back().start;
      ++s.sections_done;
    }
    stack.pop_back();
    Publish(w);
  }

  // Advances the clock in poll steps; returns the first hang seen (its
  // silent workers), or an empty list.
  // With `beating`, that worker beats at every poll.
  std::vector<SilentWorker> Run(absl::Duration d, int beating = -1) {
    const absl::Time end = now_ + d;
    while (now_ < end) {
      now_ = std::min(end, now_ + ProgressMonitor::kPollEvery);
      if (beating >= 0) Beat(beating);
      auto silent = monitor_.Observe(samples_, now_);
      if (!silent.empty()) return silent;
    }
    return {};
  }
  // `steps` heartbeats `every` apart on every worker; the first hang, if any.
  std::vector<SilentWorker> Steps(int steps, absl::Duration every) {
    for (int i = 0; i < steps; ++i) {
      for (size_t w = 0; w < samples_.size(); ++w) Beat(static_cast<int>(w));
      auto silent = Run(every);
      if (!silent.empty()) return silent;
    }
    return {};
  }

  ProgressMonitor& monitor() { return monitor_; }
  ProgressSample& sample(int w) { return samples_[static_cast<size_t>(w)]; }
  absl::Time now() const { return now_; }
  void Restart() {
    for (auto& s : samples_) s = ProgressSample{};
    stack_.clear();
    std::vector<int> ranks;
    for (size_t i = 0; i < samples_.size(); ++i)
      ranks.push_back(10 + static_cast<int>(i));
    monitor_.Start(ranks, now_);
  }

 private:
  struct Open {
    std::string name;
    bool untimed;
    absl::Time start;
  };
  void Event(int w) {
    ProgressSample& s = samples_[static_cast<size_t>(w)];
    ++s.events;
    s.event_time = now_;
  }
  void Publish(int w) {
    ProgressSample& s = samples_[static_cast<size_t>(w)];
    const auto& stack = stack_[w];
    s.section = stack.empty() ? "" : stack.back().name;
    s.untimed = !stack.empty() && stack.back().untimed;
    Event(w);
  }

  ProgressMonitor monitor_;
  absl::Time now_;
  std::vector<ProgressSample> samples_;
  std::map<int, std::vector<Open>> stack_;
};

TEST_CASE("A fixed hang timeout catches a worker silent past it, not before",
          "[progress][unit]") {
  Board b(Fixed(absl::Seconds(2)), 2);
  REQUIRE(b.Steps(10, absl::Milliseconds(500)).empty());
  b.Beat(0);
  b.Beat(1);
  const absl::Time last = b.now();
  // Worker 0 goes on, worker 1 stops.
  std::vector<SilentWorker> silent;
  for (int i = 0; i < 10 && silent.empty(); ++i) {
    b.Beat(0);
    silent = b.Run(absl::Milliseconds(500));
  }
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].local_rank == 1);
  CHECK(silent[0].since == last);
  CHECK(silent[0].ever);
  CHECK(silent[0].beats == 11);
  CHECK(silent[0].timeout == absl::Seconds(2));
  // Caught on the first poll past the timeout.
  CHECK(b.now() - last > absl::Seconds(2));
  CHECK(b.now() - last <= absl::Seconds(2) + ProgressMonitor::kPollEvery);
}

TEST_CASE("The first signal is awaited for the warm-up allowance",
          "[progress][unit]") {
  HangTimeout t = Fixed(absl::Seconds(3));
  t.warmup = absl::Seconds(60);
  Board b(t, 2);
  auto silent = b.Run(absl::Seconds(70), /*beating=*/1);
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].local_rank == 0);
  CHECK_FALSE(silent[0].ever);
  CHECK(silent[0].timeout == absl::Seconds(60));
  CHECK(b.now() - kStart > absl::Seconds(60));
}

TEST_CASE("Without a warm-up the first signal is awaited for the timeout",
          "[progress][unit]") {
  HangTimeout t = Fixed(absl::Seconds(3));
  t.warmup = absl::ZeroDuration();
  Board b(t, 2);
  auto silent = b.Run(absl::Seconds(10), /*beating=*/1);
  REQUIRE(silent.size() == 1);
  CHECK_FALSE(silent[0].ever);
  CHECK(silent[0].since == kStart);
  CHECK(b.now() - kStart <= absl::Seconds(3) + ProgressMonitor::kPollEvery);
}

TEST_CASE(
    "Workers of a job that never signals are let off at the end of the "
    "warm-up, once",
    "[progress][unit]") {
  HangTimeout t = Fixed(absl::Seconds(3));
  t.warmup = absl::Seconds(60);
  Board b(t, 2);
  CHECK(b.Run(absl::Seconds(59)).empty());
  CHECK(b.monitor().TakeUnsignalled().empty());  // still warming up
  CHECK(b.Run(absl::Minutes(30)).empty());
  CHECK(b.monitor().TakeUnsignalled() == std::vector<int>{10, 11});
  CHECK(b.Run(absl::Minutes(30)).empty());
  CHECK(b.monitor().TakeUnsignalled().empty());  // said once
}

TEST_CASE("A rank silent from its start is judged once another rank signals",
          "[progress][unit]") {
  HangTimeout t = Fixed(absl::Seconds(3));
  t.warmup = absl::Seconds(60);
  Board b(t, 2);
  CHECK(b.Run(absl::Seconds(120)).empty());
  auto silent = b.Run(absl::Seconds(1), /*beating=*/1);
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].local_rank == 0);
  CHECK(silent[0].since == kStart);
}

TEST_CASE("Another node's figures mean the job signals", "[progress][unit]") {
  HangTimeout t = Fixed(absl::Seconds(3));
  t.warmup = absl::Seconds(60);
  Board b(t, 1);
  google::protobuf::RepeatedPtrField<v1::LearnedInterval> job;
  job.Add()->set_longest_ms(500);
  b.monitor().MergeLearned(job);
  auto silent = b.Run(absl::Seconds(70));
  REQUIRE(silent.size() == 1);
  CHECK_FALSE(silent[0].ever);
}

TEST_CASE("A worker's own times are kept within what the agent saw",
          "[progress][unit]") {
  Board b(Fixed(absl::Seconds(2)), 1);
  b.Run(absl::Seconds(1));
  // Far in the future: without the clamp, never hung again.
  ProgressSample& s = b.sample(0);
  ++s.events;
  s.event_time = b.now() + absl::Hours(1000);
  const absl::Time seen = b.now() + ProgressMonitor::kPollEvery;
  auto silent = b.Run(absl::Seconds(5));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].since == seen);
  // Far in the past: the silence counts from the previous event at most.
  ++s.events;
  s.event_time = absl::UnixEpoch() + absl::Nanoseconds(1);
  b.monitor().Start({10}, b.now());
  const absl::Time restart = b.now();
  silent = b.Run(absl::Seconds(5));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].since >= restart);
  CHECK(b.now() - silent[0].since <= absl::Seconds(3));
}

TEST_CASE("No timeout runs inside an untimed section", "[progress][unit]") {
  Board b(Fixed(absl::Seconds(1)), 1);
  b.Beat(0);
  b.Enter(0, "checkpoint", /*untimed=*/true);
  CHECK(b.Run(absl::Seconds(30)).empty());
  b.Leave(0);
  CHECK(b.Run(absl::Milliseconds(900)).empty());
  CHECK(b.Run(absl::Seconds(1)).size() == 1);
}

TEST_CASE("No timeout runs while a worker waits in its stop check",
          "[progress][unit]") {
  Board b(Fixed(absl::Seconds(1)), 2);
  b.Beat(0);
  b.Beat(1);
  b.sample(0).held = true;
  CHECK(b.Run(absl::Seconds(10), /*beating=*/1).empty());
  b.sample(0).held = false;
  b.Beat(0);
  CHECK(b.Run(absl::Milliseconds(900), 1).empty());
  CHECK(b.Run(absl::Seconds(1), 1).size() == 1);
}

TEST_CASE("A worker that is done is not timed", "[progress][unit]") {
  Board b(Fixed(absl::Seconds(1)), 1);
  b.Beat(0);
  b.Done(0);
  CHECK(b.Run(absl::Minutes(10)).empty());
}

TEST_CASE("Off never declares a hang", "[progress][unit]") {
  Board b(HangTimeout{}, 1);
  CHECK(b.Run(absl::Hours(2)).empty());
}

TEST_CASE("The worker whose last signal is oldest stopped first",
          "[progress][unit]") {
  Board b(Fixed(absl::Seconds(1)), 3);
  b.Beat(2);
  b.Run(absl::Milliseconds(200));
  b.Beat(0);
  b.Beat(1);
  auto silent = b.Run(absl::Seconds(3));
  REQUIRE(silent.size() == 1);  // caught on the poll it passed the timeout
  CHECK(silent[0].local_rank == 2);
  // The others pass their timeout 0.2 s later.
  for (int poll = 0; poll < 5 && silent.size() < 3; ++poll) {
    silent = b.Run(ProgressMonitor::kPollEvery);
  }
  REQUIRE(silent.size() == 3);
  CHECK(silent[0].local_rank == 2);
  CHECK(silent[1].local_rank == 0);  // same time as 1: lower rank first
}

TEST_CASE("An exited worker is not hung", "[progress][unit]") {
  Board b(Fixed(absl::Seconds(1)), 2);
  b.Beat(0);
  b.Beat(1);
  b.monitor().Exited(1);
  for (int i = 0; i < 20; ++i) {
    b.Beat(0);
    REQUIRE(b.Run(absl::Milliseconds(500)).empty());
  }
}

TEST_CASE("Auto learns five times the longest silence and catches a stall",
          "[progress][unit]") {
  Board b(Auto(), 2);
  // Warm-up: a slow first step is not learned from.
  b.Run(absl::Seconds(20));
  REQUIRE(b.Steps(30, absl::Milliseconds(200)).empty());
  REQUIRE(b.monitor().Longest("").has_value());
  CHECK(*b.monitor().Longest("") <= absl::Milliseconds(300));
  CHECK(b.monitor().TimeoutIn("") == ProgressMonitor::kAutoFloor);
  b.Beat(0);
  b.Beat(1);
  const absl::Time stall = b.now();
  auto silent = b.Run(absl::Seconds(5));
  REQUIRE(silent.size() == 2);
  CHECK(b.now() - stall < absl::Seconds(2));
}

TEST_CASE("Auto gives a warming-up worker the allowance", "[progress][unit]") {
  Board b(Auto(absl::Seconds(60)), 1);
  CHECK(b.Run(absl::Seconds(59)).empty());  // before the first step
  b.Beat(0);
  CHECK(b.Run(absl::Seconds(59)).empty());  // the first step
  b.Beat(0);
  // Two warm-up silences and nothing learned: still the allowance.
  CHECK(b.Run(absl::Seconds(59)).empty());
  b.Beat(0);
  CHECK(b.Run(absl::Seconds(2)).size() == 0);
  CHECK(b.monitor().Longest("") == absl::Seconds(59));
}

TEST_CASE("Auto times each section by its own longest silence",
          "[progress][unit]") {
  Board b(Auto(absl::Seconds(100)), 1);
  for (int step = 0; step < 6; ++step) {
    b.Enter(0, "forward");
    b.Run(absl::Milliseconds(200));
    b.Leave(0);
    b.Enter(0, "eval");
    b.Run(absl::Seconds(3));
    b.Leave(0);
  }
  CHECK(b.monitor().TimeoutIn("forward") == absl::Seconds(1));
  CHECK(b.monitor().TimeoutIn("eval") >= absl::Seconds(15));
  b.Enter(0, "eval");
  CHECK(b.Run(absl::Seconds(10)).empty());
  b.Leave(0);
  b.Enter(0, "forward");
  auto silent = b.Run(absl::Seconds(10));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].section == "forward");
  CHECK(silent[0].timeout == absl::Seconds(1));
}

TEST_CASE("Auto keeps the job's figures across a restart", "[progress][unit]") {
  Board b(Auto(absl::Seconds(100)), 1);
  google::protobuf::RepeatedPtrField<v1::LearnedInterval> job;
  auto* l = job.Add();
  l->set_section("");
  l->set_longest_ms(800);
  b.monitor().MergeLearned(job);
  // Steps of 0.2 s but one of 0.8 s earlier in the job: a 3 s pause is no
  // hang, after warm-up as before it.
  REQUIRE(b.Steps(5, absl::Milliseconds(200)).empty());
  b.Beat(0);
  CHECK(b.Run(absl::Seconds(3)).empty());
  b.Restart();
  REQUIRE(b.Steps(3, absl::Milliseconds(200)).empty());
  CHECK(b.monitor().TimeoutIn("") == absl::Seconds(4));
  b.Beat(0);
  CHECK(b.Run(absl::Seconds(5)).size() == 1);
}

TEST_CASE("Reports carry grown figures once and each rank's pace",
          "[progress][unit]") {
  Board b(Auto(), 2);
  b.Steps(3, absl::Milliseconds(100));
  auto first = b.monitor().TakeReport(7, b.now());
  REQUIRE(first.has_value());
  CHECK(first->round() == 7);
  b.Steps(10, absl::Milliseconds(100));
  auto report = b.monitor().TakeReport(7, b.now());
  REQUIRE(report.has_value());
  REQUIRE(report->paces_size() == 2);
  CHECK(report->paces(0).rank() == 10);
  CHECK(report->paces(0).steps() == 10);
  CHECK(report->paces(0).mean_step_us() == 100000);
  CHECK_FALSE(report->paces(0).sections());
  // Nothing new: nothing to say.
  CHECK_FALSE(b.monitor().TakeReport(7, b.now()).has_value());
  // A longer silence is told once.
  b.Steps(1, absl::Milliseconds(700));
  b.Steps(1, absl::Milliseconds(100));
  report = b.monitor().TakeReport(7, b.now());
  REQUIRE(report.has_value());
  REQUIRE(report->longest_size() == 1);
  CHECK(report->longest(0).longest_ms() >= 700);
}

TEST_CASE("A delayed report keeps what it would have said",
          "[progress][unit]") {
  Board b(Auto(), 1);
  b.Steps(3, absl::Milliseconds(100));
  b.monitor().DelayReport(b.now());
  CHECK(b.monitor().NextReport() == b.now() + ProgressMonitor::kReportEvery);
  auto report = b.monitor().TakeReport(0, b.now());
  REQUIRE(report.has_value());
  CHECK(report->longest_size() == 1);
}

TEST_CASE("A rank that uses sections is paced by its time in them",
          "[progress][unit]") {
  Board b(HangTimeout{}, 1);
  for (int step = 0; step < 5; ++step) {
    b.Beat(0);
    b.Enter(0, "compute");
    b.Run(absl::Milliseconds(300));
    b.Leave(0);
    b.Run(absl::Milliseconds(700));  // waiting for the others
  }
  b.monitor().TakeReport(0, b.now());  // the baseline
  for (int step = 0; step < 4; ++step) {
    b.Beat(0);
    b.Enter(0, "compute");
    b.Run(absl::Milliseconds(300));
    b.Leave(0);
    b.Run(absl::Milliseconds(700));
  }
  auto report = b.monitor().TakeReport(0, b.now());
  REQUIRE(report.has_value());
  REQUIRE(report->paces_size() == 1);
  CHECK(report->paces(0).sections());
  CHECK(report->paces(0).steps() == 4);
  CHECK(report->paces(0).mean_step_us() == 300000);
}

TEST_CASE("Values of --hang_timeout", "[progress][unit]") {
  CHECK(HangTimeout::Parse("off")->mode == HangTimeout::Mode::kOff);
  CHECK(HangTimeout::Parse("auto")->mode == HangTimeout::Mode::kAuto);
  auto fixed = HangTimeout::Parse("2.5");
  REQUIRE(fixed.ok());
  CHECK(fixed->fixed == absl::Milliseconds(2500));
  CHECK_FALSE(HangTimeout::Parse("-1").ok());
  CHECK_FALSE(HangTimeout::Parse("soon").ok());
  CHECK_FALSE(HangTimeout::Parse("nan").ok());
}

}  // namespace
}  // namespace ctrun
