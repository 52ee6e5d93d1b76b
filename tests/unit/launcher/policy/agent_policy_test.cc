#include "launcher/policy/agent_policy.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "rendezvous/core/failure_class.h"

namespace ctrun {
namespace {

namespace e = agent_effect;
using Phase = AgentPolicy::Phase;
using Link = AgentPolicy::Link;

LaunchOptions Options(int workers = 2) {
  LaunchOptions o;
  o.local_world_size = workers;
  o.max_restarts = 3;
  o.entrypoint = "train.py";
  o.join_timeout = absl::Seconds(600);
  o.reconnect_timeout = absl::Seconds(60);
  o.keep_alive_interval = absl::Seconds(1);
  o.shutdown_timeout = absl::Seconds(30);
  return o;
}

// Drives an AgentPolicy with a fake clock and keeps the effects of the last
// input.
class Harness {
 public:
  // `parks`: the workers' program parks in wait_for_slot.
  // `health_gate`: joins and rejoins wait for a health check.
  explicit Harness(LaunchOptions options = Options(), bool parks = false,
                   bool health_gate = false)
      : workers_(options.local_world_size),
        policy_(Config(options, parks, health_gate)) {
    policy_.Start(now_, &effects_);
  }

  static AgentPolicyConfig Config(LaunchOptions options, bool parks = false,
                                  bool health_gate = false) {
    AgentPolicyConfig c;
    c.parks = parks;
    c.health_gate = health_gate;
    c.options = std::move(options);
    c.hostname = "node-a";
    c.endpoint = "10.0.0.1:29400";
    c.omp_threads_set = true;
    return c;
  }

  AgentPolicy& policy() { return policy_; }
  const AgentEffects& effects() const { return effects_; }
  absl::Time now() const { return now_; }

  // Each input replaces the kept effects.
  void Message(const v1::ServerMessage& m) {
    effects_.clear();
    policy_.OnMessage(m, now_, &effects_);
    AnswerEndEvidence();
  }
  void SessionEnd(const absl::Status& status, bool redirected = false) {
    effects_.clear();
    policy_.OnSessionEnd(status, redirected, now_, &effects_);
  }
  void Signal(int signal, bool from_parent = false) {
    effects_.clear();
    policy_.OnSignal(signal, from_parent, now_, &effects_);
    AnswerEndEvidence();
  }
  void TerminalStop() {
    effects_.clear();
    policy_.OnTerminalStop(now_, &effects_);
  }
  void HealthChecked(const std::string& problem) {
    effects_.clear();
    policy_.OnHealthChecked(problem, now_, &effects_);
  }
  void Probed(const absl::Status& status) {
    effects_.clear();
    policy_.OnProbeResult(status, now_, &effects_);
  }
  // Advances the clock by `d` in steps no longer than a tick would be, and
  // keeps every effect of the way.
  void Advance(absl::Duration d) {
    effects_.clear();
    const absl::Time end = now_ + d;
    while (true) {
      const absl::Time next = std::min(policy_.NextDeadline(), end);
      if (next > now_) now_ = next;
      policy_.Tick(now_, &effects_);
      AnswerEndEvidence();
      if (now_ >= end) return;
    }
  }

  // Assignment for round `round` with first global rank 4, answered with
  // pids 100 + local rank.
  void Assign(int64_t round = 0, bool resumable = false) {
    v1::ServerMessage m;
    auto* a = m.mutable_assignment();
    a->set_round(round);
    a->set_group_rank(1);
    a->set_first_global_rank(4);
    a->set_world_size(8);
    a->set_restart_count(round);
    a->set_resumable(resumable);
    Message(m);
    REQUIRE(Has<e::StartWorkers>());
    std::vector<WorkerStart> started;
    for (int lr = 0; lr < workers_; ++lr) {
      started.push_back({lr, 100 + lr, "/run/" + std::to_string(lr), "", {}});
    }
    AgentEffects more;
    policy_.OnWorkersStarted(started, now_, &more);
    effects_.insert(effects_.end(), more.begin(), more.end());
  }
  // An assignment for `round` (first global rank `first`), not answered.
  void AssignOnly(int64_t round, int first = 4, int world = 8) {
    v1::ServerMessage m;
    auto* a = m.mutable_assignment();
    a->set_round(round);
    a->set_group_rank(1);
    a->set_first_global_rank(first);
    a->set_world_size(world);
    a->set_restart_count(round);
    Message(m);
  }
  // The loop's answer to StartWorkers for `local_ranks`, pids 200 + rank.
  void Started(const std::vector<int>& local_ranks) {
    std::vector<WorkerStart> started;
    for (int lr : local_ranks) {
      started.push_back({lr, 200 + lr, "/run/" + std::to_string(lr), "", {}});
    }
    effects_.clear();
    policy_.OnWorkersStarted(started, now_, &effects_);
  }
  // The loop's answer to ReadProgress.
  void Progress(const std::vector<ProgressSample>& samples) {
    effects_.clear();
    policy_.OnProgressRead(samples, now_, absl::UnixEpoch(), &effects_);
    AnswerEndEvidence();
  }
  void ProcessGroupChecked(bool listening,
                           const std::vector<ProgressSample>& samples) {
    effects_.clear();
    policy_.OnProcessGroupChecked(listening, samples, now_, &effects_);
  }
  void Collected() {
    effects_.clear();
    policy_.OnEvidenceCollected(now_, &effects_);
    AnswerEndEvidence();
  }
  // What the stacks read at the end of the evidence will say.
  void SetStacks(std::vector<RankReading> stacks) {
    stacks_ = std::move(stacks);
  }
  void TimerLine(const std::string& line, absl::Time wall) {
    effects_.clear();
    policy_.OnTimerRequest(line, now_, wall, &effects_);
  }
  void Exit(int local_rank, int code, int signal = 0) {
    effects_.clear();
    policy_.OnWorkerExit({local_rank, code, signal, absl::UnixEpoch()}, now_,
                         &effects_);
    AnswerEndEvidence();
  }

  template <typename T>
  bool Has() const {
    return Count<T>() > 0;
  }
  template <typename T>
  int Count() const {
    int n = 0;
    for (const auto& effect : effects_) n += std::holds_alternative<T>(effect);
    return n;
  }
  template <typename T>
  const T& Get() const {
    for (const auto& effect : effects_) {
      if (auto* t = std::get_if<T>(&effect)) return *t;
    }
    FAIL("no such effect");
    static T none;
    return none;
  }
  // The signals sent to the workers, in order.
  std::vector<int> Signals() const {
    std::vector<int> signals;
    for (const auto& effect : effects_) {
      if (auto* s = std::get_if<e::SignalWorkers>(&effect)) {
        signals.push_back(s->signal);
      }
    }
    return signals;
  }
  // The worker reports sent, as their states.
  std::vector<v1::WorkerReport> Reports() const {
    std::vector<v1::WorkerReport> reports;
    for (const auto& effect : effects_) {
      if (auto* s = std::get_if<e::Send>(&effect);
          s != nullptr && s->message.has_worker_report()) {
        reports.push_back(s->message.worker_report());
      }
    }
    return reports;
  }
  bool Said(const std::string& needle) const {
    for (const auto& effect : effects_) {
      if (auto* s = std::get_if<e::Say>(&effect);
          s != nullptr && absl::StrContains(s->line, needle)) {
        return true;
      }
    }
    return false;
  }
  // The effects as names, in order: "signal N", "suspend" or "other".
  std::vector<std::string> Sequence() const {
    std::vector<std::string> names;
    for (const auto& effect : effects_) {
      if (auto* s = std::get_if<e::SignalWorkers>(&effect)) {
        names.push_back("signal " + std::to_string(s->signal));
      } else if (std::holds_alternative<e::SuspendAgent>(effect)) {
        names.push_back("suspend");
      } else {
        names.push_back("other");
      }
    }
    return names;
  }
  // The events recorded, as "event/round".
  std::vector<std::string> Records() const {
    std::vector<std::string> out;
    for (const auto& effect : effects_) {
      if (auto* r = std::get_if<e::Record>(&effect)) {
        out.push_back(absl::StrCat(r->event.event(), "/", r->event.round()));
      }
    }
    return out;
  }
  // The i-th event recorded.
  const v1::Event& Recorded(size_t i) const {
    for (const auto& effect : effects_) {
      if (auto* r = std::get_if<e::Record>(&effect); r && i-- == 0) {
        return r->event;
      }
    }
    FAIL("no such record");
    throw;
  }
  std::optional<int> ExitCode() const {
    if (!Has<e::Exit>()) return std::nullopt;
    return Get<e::Exit>().code;
  }

 private:
  // The loop answers EndEvidence with the stacks it read, always.
  void AnswerEndEvidence() {
    for (size_t i = 0; i < effects_.size(); ++i) {
      if (std::holds_alternative<e::EndEvidence>(effects_[i])) {
        AgentEffects more;
        policy_.OnStacksRead(stacks_, &more);
        effects_.insert(effects_.end(), more.begin(), more.end());
        return;
      }
    }
  }

  std::vector<RankReading> stacks_;
  absl::Time now_ = absl::UnixEpoch() + absl::Hours(1);
  const int workers_;
  AgentPolicy policy_;
  AgentEffects effects_;
};

v1::ServerMessage Restart(int64_t round, const std::string& detail = "") {
  v1::ServerMessage m;
  m.mutable_restart_required()->set_round(round);
  m.mutable_restart_required()->set_restart_count(round);
  m.mutable_restart_required()->set_detail(detail);
  return m;
}

v1::ServerMessage Finished() {
  v1::ServerMessage m;
  m.mutable_job_finished();
  return m;
}

v1::ServerMessage Failed(const std::string& reason) {
  v1::ServerMessage m;
  m.mutable_job_failed()->set_reason(reason);
  return m;
}

v1::ServerMessage Resumed(int64_t round) {
  v1::ServerMessage m;
  m.mutable_resumed()->set_round(round);
  return m;
}

v1::ServerMessage Progress() {
  v1::ServerMessage m;
  m.mutable_progress()->set_joined(1);
  m.mutable_progress()->set_min_nodes(2);
  m.mutable_progress()->set_max_nodes(2);
  m.mutable_progress()->set_last_call_remaining_ms(-1);  // no last call
  return m;
}

// --- joining
// -------------------------------------------------------------------

TEST_CASE("An agent opens a fresh session and waits for its assignment",
          "[agent][unit]") {
  Harness h;
  REQUIRE(h.Has<e::OpenSession>());
  CHECK_FALSE(h.Get<e::OpenSession>().resume_round.has_value());
  CHECK(h.policy().phase() == Phase::kJoining);
  CHECK(h.policy().link() == Link::kConnecting);
}

TEST_CASE("A rendezvous that never answers fails the join after the timeout",
          "[agent][unit]") {
  Harness h;
  h.Advance(absl::Seconds(599));
  CHECK_FALSE(h.ExitCode());
  h.Advance(absl::Seconds(1));
  CHECK(
      h.Said("no answer from the rendezvous at 10.0.0.1:29400 within the "
             "join timeout of 10m"));
  CHECK(h.Has<e::CancelSession>());
  CHECK(h.ExitCode() == 1);
  CHECK(h.policy().phase() == Phase::kDone);
}

TEST_CASE("A silent rendezvous is probed and a TLS mismatch fails at once",
          "[agent][unit]") {
  Harness h;
  h.Advance(AgentPolicy::kProbeAfter);
  REQUIRE(h.Has<e::ProbeRendezvous>());
  h.Probed(absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:127.0.0.1:5: Ssl handshake failed: SSL_ERROR_SSL"));
  CHECK(
      h.Said("cannot talk to the rendezvous at 10.0.0.1:29400: failed to "
             "connect to all addresses"));
  CHECK(h.Said("is TLS set up alike on both sides"));
  CHECK(h.ExitCode() == 1);
}

TEST_CASE(
    "A rendezvous that is not up yet is waited for, probed again, and said "
    "out of reach at once and every 30 s with the time left",
    "[agent][unit]") {
  Harness h;
  const absl::Status refused = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: "
      "ipv4:127.0.0.1:5: Failed to connect to remote host: Connection "
      "refused");
  h.Advance(AgentPolicy::kProbeAfter);
  h.Probed(refused);
  CHECK_FALSE(h.ExitCode());
  CHECK(
      h.Said("cannot reach the rendezvous at 10.0.0.1:29400 (connection "
             "refused); still trying for 9m58s (--rdzv_conf join_timeout)"));
  h.Advance(AgentPolicy::kProbeEvery);
  REQUIRE(h.Has<e::ProbeRendezvous>());
  h.Probed(refused);
  CHECK_FALSE(h.Has<e::Say>());  // not before 30 s
  h.Advance(AgentPolicy::kUnreachableEvery - AgentPolicy::kProbeEvery);
  h.Probed(absl::UnavailableError("DNS resolution failed for nowhere:5"));
  CHECK(
      h.Said("cannot reach the rendezvous at 10.0.0.1:29400 (its name does "
             "not resolve); still trying for 9m28s"));
  h.Advance(AgentPolicy::kProbeEvery);
  CHECK(h.Has<e::ProbeRendezvous>());
  // An answer of any kind means the connection works.
  h.Probed(absl::UnauthenticatedError("wrong token"));
  CHECK_FALSE(h.ExitCode());
}

TEST_CASE("A probe that returns after the rendezvous answered changes nothing",
          "[agent][unit]") {
  Harness h;
  h.Advance(AgentPolicy::kProbeAfter);
  h.Message(Progress());
  h.Probed(absl::UnavailableError("Ssl handshake failed"));
  CHECK_FALSE(h.ExitCode());
  CHECK(h.policy().link() == Link::kOpen);
}

TEST_CASE("Progress is printed only when the round takes a while",
          "[agent][unit]") {
  Harness h;
  v1::ServerMessage m = Progress();
  m.mutable_progress()->set_min_nodes(3);
  m.mutable_progress()->set_max_nodes(3);
  m.mutable_progress()->set_join_timeout_remaining_ms(600'000);
  h.Message(m);
  CHECK_FALSE(h.Has<e::Say>());
  // Nothing more comes from the service: the agent says it waits anyway,
  // with the countdown as of now.
  h.Advance(AgentPolicy::kProgressQuietFor);
  CHECK(
      h.Said("waiting for 2 more nodes at 10.0.0.1:29400 (1/3 joined; "
             "join timeout in 9m58s)"));
  h.Advance(absl::Seconds(1));
  h.Message(m);  // no change: nothing said
  CHECK_FALSE(h.Has<e::Say>());
  h.Advance(AgentPolicy::kProgressRepeat - absl::Seconds(2));
  CHECK_FALSE(h.Has<e::Say>());
  h.Advance(absl::Seconds(1));
  // Counted from the last message, which said 10m at 0:03.
  CHECK(
      h.Said("waiting for 2 more nodes at 10.0.0.1:29400 (1/3 joined; "
             "join timeout in 9m31s)"));
  // A change is told at once, once a few seconds have passed.
  h.Advance(AgentPolicy::kProgressEvery);
  m.mutable_progress()->set_joined(2);
  m.mutable_progress()->set_join_timeout_remaining_ms(560'000);
  h.Message(m);
  CHECK(
      h.Said("waiting for 1 more node at 10.0.0.1:29400 (2/3 joined; join "
             "timeout in 9m20s)"));
}

TEST_CASE("Another job waiting at the same rendezvous is named",
          "[agent][unit]") {
  Harness h;
  v1::ServerMessage m = Progress();
  m.mutable_progress()->set_join_timeout_remaining_ms(600'000);
  auto* other = m.mutable_progress()->add_other_waiting_jobs();
  other->set_job_id("tarin");
  other->set_joined(1);
  other->set_min_nodes(2);
  h.Message(m);
  h.Advance(AgentPolicy::kProgressQuietFor);
  CHECK(
      h.Said("waiting for 1 more node at 10.0.0.1:29400 (1/2 joined; join "
             "timeout in 9m58s); also waiting there: job 'tarin' (1/2 "
             "joined) (is --rdzv_id the same on every node?)"));
}

TEST_CASE("An elastic round in its last call and a spare say so",
          "[agent][unit]") {
  Harness h;
  v1::ServerMessage m = Progress();
  m.mutable_progress()->set_min_nodes(1);
  m.mutable_progress()->set_max_nodes(4);
  m.mutable_progress()->set_last_call_remaining_ms(30'000);
  m.mutable_progress()->set_join_timeout_remaining_ms(600'000);
  h.Message(m);
  h.Advance(AgentPolicy::kProgressQuietFor);
  CHECK(
      h.Said("waiting for more nodes at 10.0.0.1:29400 until the last call "
             "ends (1 joined, up to 4; closing in 28s; join timeout in "
             "9m58s)"));
  Harness spare;
  v1::ServerMessage full = Progress();
  full.mutable_progress()->set_waiting_for_slot(true);
  full.mutable_progress()->set_max_nodes(4);
  spare.Message(full);
  spare.Advance(AgentPolicy::kProgressQuietFor);
  CHECK(
      spare.Said("the job at 10.0.0.1:29400 runs with its 4 nodes; waiting "
                 "as a spare for a free slot"));
}

TEST_CASE("A spare says so at once, and which slot it takes",
          "[agent][unit][spares]") {
  LaunchOptions o = Options();
  o.run_id = "train";
  Harness h(o);
  v1::ServerMessage full = Progress();
  full.mutable_progress()->set_waiting_for_slot(true);
  full.mutable_progress()->set_spare(true);
  full.mutable_progress()->set_max_nodes(3);
  h.Message(full);
  CHECK(
      h.Said("this node is a spare of job 'train' (its 3 nodes run): it "
             "holds no rank and takes the slot of a node that is lost"));
  h.Message(full);
  CHECK_FALSE(
      h.Said("this node is a spare of job 'train' (its 3 nodes run): "
             "it holds no rank and takes the slot of a node that is "
             "lost"));
  v1::ServerMessage m;
  auto* a = m.mutable_assignment();
  a->set_round(1);
  a->set_group_rank(1);
  a->set_first_global_rank(2);
  a->set_world_size(6);
  a->set_took_slot_of("b:4242");
  h.Message(m);
  REQUIRE(h.Has<e::StartWorkers>());
  CHECK(
      h.Said("this spare takes group rank 1, the slot of b:4242, which was "
             "lost: ranks 2..3 of 6"));
  // Its own progress counts the nodes not back yet without naming them.
  Harness counted;
  v1::ServerMessage back = Progress();
  back.mutable_progress()->set_round(1);
  back.mutable_progress()->set_pending_count(2);
  counted.Message(back);
  counted.Advance(AgentPolicy::kProgressQuietFor);
  CHECK(
      counted.Said("waiting for 1 more node at 10.0.0.1:29400 (1/2 joined; "
                   "round 1; 2 nodes not back yet; join timeout in "));
  bool recorded = false;
  for (const auto& effect : h.effects()) {
    if (auto* r = std::get_if<e::Record>(&effect);
        r && r->event.event() == "slot_taken") {
      recorded = r->event.detail() == "the slot of b:4242";
    }
  }
  CHECK(recorded);
}

TEST_CASE("A spare parks its workers and hands them its slot's world",
          "[agent][unit][spares]") {
  v1::ServerMessage full = Progress();
  full.mutable_progress()->set_waiting_for_slot(true);
  full.mutable_progress()->set_spare(true);
  v1::ServerMessage slot;
  auto* a = slot.mutable_assignment();
  a->set_round(1);
  a->set_group_rank(1);
  a->set_first_global_rank(2);
  a->set_world_size(4);
  a->set_took_slot_of("b:4242");

  Harness h(Options(), /*parks=*/true);
  h.Message(full);
  REQUIRE(h.Has<e::ParkWorkers>());
  CHECK(h.Said("its workers start now and wait in wait_for_slot() for a slot"));
  h.Started({0, 1});
  CHECK(h.policy().live_workers() == 2);
  CHECK(h.policy().phase() == Phase::kJoining);
  // One dies while parked: no failure, it starts with the slot.
  h.Exit(1, 3);
  CHECK(
      h.Said("a parked worker (local rank 1, pid 201) ended (exit code 3) "
             "before this spare took a slot; it starts afresh when the "
             "spare does"));
  CHECK_FALSE(h.Has<e::Send>());
  h.Message(slot);
  REQUIRE(h.Has<e::HandOver>());
  CHECK(h.Get<e::HandOver>().local_ranks == std::vector<int>{0});
  REQUIRE(h.Has<e::StartWorkers>());
  CHECK(h.Get<e::StartWorkers>().local_ranks == std::vector<int>{1});
  CHECK(h.Said("its parked worker takes rank 2"));
  CHECK(h.policy().phase() == Phase::kRunning);

  // Without parking, nothing starts before the slot.
  Harness cold(Options(), /*parks=*/false);
  cold.Message(full);
  CHECK_FALSE(cold.Has<e::ParkWorkers>());

  // A spare stopped while parked stops its workers, and that is no failure.
  Harness stopped(Options(), /*parks=*/true);
  stopped.Message(full);
  stopped.Started({0, 1});
  stopped.Signal(SIGTERM);
  REQUIRE(stopped.Has<e::SignalWorkers>());
  stopped.Exit(0, 0, SIGTERM);
  stopped.Exit(1, 0, SIGTERM);
  CHECK(stopped.ExitCode() == 128 + SIGTERM);
}

TEST_CASE("Group rank 0's node says once that the job formed no process group",
          "[agent][unit]") {
  auto assign = [](Harness& h, int group_rank, int world) {
    v1::ServerMessage m;
    auto* a = m.mutable_assignment();
    a->set_group_rank(group_rank);
    a->set_first_global_rank(2 * group_rank);
    a->set_world_size(world);
    a->set_master_port(29500);
    h.Message(m);
    REQUIRE(h.Has<e::StartWorkers>());
    h.Started({0, 1});
  };
  const std::string line =
      "the job's 4 ranks formed no process group within 1m of their start: "
      "nothing listens on MASTER_PORT=29500 on this node (group rank 0's) and "
      "no worker uses ctrun's store; a script that never calls "
      "torch.distributed.init_process_group trains each rank alone (said "
      "once; --process_group_check=off)";
  Harness h;
  assign(h, 0, 4);
  h.Advance(absl::Seconds(59));
  CHECK_FALSE(h.Has<e::CheckProcessGroup>());
  h.Advance(absl::Seconds(1));
  REQUIRE(h.Has<e::CheckProcessGroup>());
  CHECK(h.Get<e::CheckProcessGroup>().port == 29500);
  h.ProcessGroupChecked(false, {ProgressSample{}, ProgressSample{}});
  CHECK(h.Said(line));
  CHECK(h.ExitCode() == std::nullopt);  // nothing stops
  h.Advance(absl::Minutes(5));
  CHECK_FALSE(h.Has<e::CheckProcessGroup>());  // once

  // A store on MASTER_PORT, or a worker on ctrun's store: formed.
  for (int formed = 0; formed < 2; ++formed) {
    Harness ok;
    assign(ok, 0, 4);
    ok.Advance(absl::Seconds(60));
    REQUIRE(ok.Has<e::CheckProcessGroup>());
    ProgressSample used;
    used.store_used = true;
    ok.ProcessGroupChecked(
        formed == 0, {ProgressSample{}, formed ? used : ProgressSample{}});
    CHECK_FALSE(ok.Said("formed no process group"));
  }
  // Only group rank 0's node checks, only a job of several ranks, and
  // never with --process_group_check=off.
  Harness other;
  assign(other, 1, 4);
  Harness alone;
  assign(alone, 0, 1);
  LaunchOptions off_options = Options();
  off_options.process_group_check.reset();
  Harness off(off_options);
  assign(off, 0, 4);
  for (Harness* x : {&other, &alone, &off}) {
    x->Advance(absl::Minutes(2));
    CHECK_FALSE(x->Has<e::CheckProcessGroup>());
  }
}

TEST_CASE("Every node ends with the job's root cause and its exit code",
          "[agent][unit]") {
  v1::ServerMessage failed;
  auto* f = failed.mutable_job_failed();
  f->set_reason("worker rank 0 (local 0) on node-b:77 exited with code 7");
  f->set_root_cause_node("node-b:77");
  auto* root = f->mutable_root_cause();
  root->set_global_rank(0);
  root->set_local_rank(0);
  root->set_exit_code(7);
  root->set_pid(4242);
  root->set_error_file("/run/b/error.json");
  // This node's rank 4 died of the broken collective after it.
  Harness h;
  h.Assign();
  h.Exit(0, 1);
  h.Message(failed);
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.ExitCode());
  CHECK(*h.ExitCode() == 7);  // the root cause's, not this node's 1
  REQUIRE(h.Has<e::Print>());
  const std::string summary = h.Get<e::Print>().text;
  INFO(summary);
  const size_t root_at = summary.find("Root Cause (first observed failure)");
  REQUIRE(root_at != std::string::npos);
  const std::string root_part = summary.substr(root_at);
  CHECK(root_part.find("host       : node-b\n") != std::string::npos);
  CHECK(root_part.find("rank       : 0 (local_rank: 0)") != std::string::npos);
  CHECK(root_part.find("exitcode   : 7 (pid: 4242)") != std::string::npos);
  CHECK(root_part.find("error_file : /run/b/error.json on node-b (its "
                       "traceback is in that node's summary)") !=
        std::string::npos);
  // This node's own failure, listed after it.
  const std::string others = summary.substr(0, root_at);
  CHECK(others.find("[1]:") != std::string::npos);
  CHECK(others.find("rank       : 4 (local_rank: 0)") != std::string::npos);

  // The root cause's own node keeps its own record of it first.
  Harness own;
  own.AssignOnly(0, /*first=*/0, /*world=*/8);
  own.Started({0, 1});
  own.Exit(0, 7);
  own.Message(failed);
  own.Exit(1, 0, SIGTERM);
  CHECK(*own.ExitCode() == 7);
  const std::string own_summary = own.Get<e::Print>().text;
  CHECK(own_summary.find("<NO_OTHER_FAILURES>") != std::string::npos);
  CHECK(own_summary.find("host       : node-a\n") != std::string::npos);
}

TEST_CASE("A session broken while collecting joins again and the job goes on",
          "[agent][unit]") {
  Harness h;
  h.Message(Progress());
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  CHECK(
      h.Said("lost the rendezvous at 10.0.0.1:29400 (UNAVAILABLE: Socket "
             "closed); joining again (up to 1m)"));
  CHECK(h.policy().link() == Link::kRetrying);
  CHECK_FALSE(h.ExitCode());
  h.Advance(AgentPolicy::kReopenDelay);
  REQUIRE(h.Has<e::OpenSession>());
  CHECK_FALSE(h.Get<e::OpenSession>().resume_round.has_value());
  h.Message(Progress());
  CHECK(h.policy().link() == Link::kOpen);
  h.Assign();
  CHECK(h.policy().phase() == Phase::kRunning);
}

TEST_CASE("A join retried until the reconnect timeout gives up",
          "[agent][unit]") {
  Harness h;
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Advance(absl::Seconds(30));
  h.SessionEnd(absl::UnavailableError("Socket closed"));  // keeps the deadline
  h.Advance(absl::Seconds(29));
  CHECK_FALSE(h.ExitCode());
  h.Advance(absl::Seconds(1));
  CHECK(
      h.Said("could not reconnect to the rendezvous at 10.0.0.1:29400 "
             "within 1m (--rdzv_conf reconnect_timeout)"));
  CHECK(h.ExitCode() == 1);
}

TEST_CASE("A join refused by the rendezvous ends the agent", "[agent][unit]") {
  Harness h;
  h.SessionEnd(absl::FailedPreconditionError("settings differ"));
  CHECK(
      h.Said("the rendezvous at 10.0.0.1:29400 refused this node: settings "
             "differ (FAILED_PRECONDITION)"));
  CHECK(h.ExitCode() == 1);
}

TEST_CASE("A spare node that was never admitted says so when the job ends",
          "[agent][unit]") {
  Harness h;
  h.Message(Finished());
  CHECK(
      h.Said("the job finished without this node: it waited for a free "
             "slot and was never admitted"));
  CHECK(h.ExitCode() == 0);
  Harness ran;
  ran.Assign();
  ran.Exit(0, 0);
  ran.Exit(1, 0);
  ran.Message(Finished());
  CHECK_FALSE(
      ran.Said("the job finished without this node: it waited for a "
               "free slot and was never admitted"));
  CHECK(ran.ExitCode() == 0);
}

TEST_CASE("A restart given back is said when it happens and when the job ends",
          "[agent][unit]") {
  Harness h;
  v1::ServerMessage m;
  auto* a = m.mutable_assignment();
  a->set_round(1);
  a->set_restart_count(0);
  a->set_max_restarts(3);
  a->set_restart_refunded(
      "the restart spent on a worker failure in round 0 was given back: node "
      "c:3 of that round was lost (its session closed), and the failure was "
      "its consequence");
  h.Message(m);
  CHECK(
      h.Said("in round 0 was given back: node c:3 of that round was lost "
             "(its session closed), and the failure was its consequence "
             "(restarts used 0/3)"));
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Message(Finished());  // effects now: the job's end alone
  CHECK(h.ExitCode() == 0);
  CHECK(h.Said("in round 0 was given back: node c:3"));
}

TEST_CASE("A signal while joining exits at once", "[agent][unit]") {
  Harness h;
  h.Signal(SIGTERM);
  CHECK(h.Signals().empty());
  CHECK(h.ExitCode() == 128 + SIGTERM);
}

// --- running
// -------------------------------------------------------------------

TEST_CASE("An assignment starts the workers and reports them running",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  CHECK(h.policy().phase() == Phase::kRunning);
  CHECK(h.policy().live_workers() == 2);
  const auto reports = h.Reports();
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].state() == v1::WorkerReport::RUNNING);
  CHECK(reports[0].round() == 0);
}

TEST_CASE("Workers that all succeed are reported and the job's end exits 0",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Exit(0, 0);
  CHECK(h.Reports().empty());
  h.Exit(1, 0);
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::SUCCEEDED);
  CHECK(h.policy().phase() == Phase::kWaiting);
  h.Message(Finished());
  CHECK(h.Has<e::CollectWorkers>());
  CHECK(h.ExitCode() == 0);
}

TEST_CASE("A failed worker is reported and the others are stopped",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Exit(1, 7);
  CHECK(
      h.Said("worker rank 5 (local 1, pid 101) exited with code 7: other; "
             "stopping the others"));
  REQUIRE(h.Reports().size() == 1);
  const v1::WorkerReport report = h.Reports()[0];
  CHECK(report.state() == v1::WorkerReport::FAILED);
  CHECK(report.failure().global_rank() == 5);
  CHECK(report.failure().exit_code() == 7);
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  CHECK(h.policy().phase() == Phase::kStopping);
  // The other one stopping is expected, not a second failure.
  h.Exit(0, 0, SIGTERM);
  CHECK(h.Reports().empty());
  CHECK(h.Has<e::CollectWorkers>());
  CHECK(h.policy().phase() == Phase::kWaiting);
}

TEST_CASE("A worker stopped on the terminal is a failure, told as such",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  WorkerExit stopped{1, 0, SIGTTIN, absl::UnixEpoch(), true};
  AgentEffects effects;
  h.policy().OnWorkerExit(stopped, absl::UnixEpoch(), &effects);
  bool told = false;
  for (const auto& effect : effects) {
    if (auto* say = std::get_if<e::Say>(&effect)) {
      told |= say->line ==
              "worker rank 5 (local 1, pid 101) stopped on SIGTTIN trying to "
              "use the terminal, which only local rank 0 of a job in the "
              "terminal's foreground can read (give the others input another "
              "way); ended it: user_error; stopping the others";
    }
  }
  CHECK(told);
  CHECK(h.policy().phase() == Phase::kStopping);
}

TEST_CASE("A worker that cannot be started is a failure with code 127",
          "[agent][unit]") {
  Harness h;
  v1::ServerMessage m;
  m.mutable_assignment()->set_first_global_rank(0);
  h.Message(m);
  AgentEffects effects;
  h.policy().OnWorkersStarted(
      {{0, 100, "/e0", "", {}},
       {1, -1, "/e1", "cannot execute ./train: Permission denied", {}}},
      h.now(), &effects);
  bool said = false, failed = false, stopped = false;
  for (const auto& effect : effects) {
    if (auto* s = std::get_if<e::Say>(&effect)) {
      said |= s->line == "cannot execute ./train: Permission denied";
    }
    if (auto* s = std::get_if<e::Send>(&effect)) {
      failed |=
          s->message.worker_report().state() == v1::WorkerReport::FAILED &&
          s->message.worker_report().failure().exit_code() == 127;
    }
    if (auto* s = std::get_if<e::SignalWorkers>(&effect)) {
      stopped |= s->signal == SIGTERM;
    }
  }
  CHECK(said);
  CHECK(failed);
  CHECK(stopped);
}

TEST_CASE("A job failure prints the root cause and exits with its code",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Exit(0, 3);
  h.Exit(1, 0, SIGTERM);
  h.Message(Failed("restart budget spent"));
  REQUIRE(h.Has<e::Print>());
  CHECK(absl::StrContains(h.Get<e::Print>().text, "train.py"));
  CHECK(h.ExitCode() == 3);
}

TEST_CASE("Every failed rank is listed, the root cause first",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Exit(1, 7);  // the root cause
  h.Exit(0, 2);  // failed on its own while the others stopped
  h.Message(Failed("restart budget spent"));
  REQUIRE(h.Has<e::Print>());
  const std::string summary = h.Get<e::Print>().text;
  const size_t others = summary.find("Failures:\n[1]:");
  const size_t root =
      summary.find("Root Cause (first observed failure):\n[0]:");
  REQUIRE(others != std::string::npos);
  REQUIRE(root != std::string::npos);
  CHECK(summary.find("rank       : 4 (local_rank: 0)") < root);
  CHECK(summary.find("exitcode   : 2") < root);
  CHECK(summary.find("rank       : 5 (local_rank: 1)") > root);
  CHECK(h.ExitCode() == 7);
  // Workers ended by the stop itself are not failures.
  Harness stopped;
  stopped.Assign();
  stopped.Exit(1, 7);
  stopped.Exit(0, 0, SIGTERM);
  stopped.Message(Failed("restart budget spent"));
  CHECK(absl::StrContains(stopped.Get<e::Print>().text, "<NO_OTHER_FAILURES>"));
}

TEST_CASE(
    "A failure is classed from its last lines: reported with its class and "
    "error, and a user error's summary says why it was not restarted",
    "[agent][unit]") {
  Harness h;
  h.Assign();
  WorkerExit exit{1, 1, 0, absl::UnixEpoch()};
  exit.last_lines = {"Traceback (most recent call last):",
                     "  File \"train.py\", line 1, in <module>",
                     "ModuleNotFoundError: No module named 'tarnsformers'"};
  AgentEffects effects;
  h.policy().OnWorkerExit(exit, h.now(), &effects);
  std::optional<v1::WorkerFailure> reported;
  for (const auto& effect : effects) {
    if (auto* s = std::get_if<e::Send>(&effect);
        s != nullptr && s->message.has_worker_report()) {
      reported = s->message.worker_report().failure();
    }
  }
  REQUIRE(reported);
  CHECK(reported->failure_class() == v1::USER_ERROR);
  CHECK(reported->message() ==
        "ModuleNotFoundError: No module named 'tarnsformers'");
  h.Exit(0, 0, SIGTERM);
  v1::ServerMessage failed = Failed("not restarted: a user error");
  *failed.mutable_job_failed()->mutable_root_cause() = *reported;
  failed.mutable_job_failed()->set_root_cause_node("node-a:1");
  h.Message(failed);
  REQUIRE(h.Has<e::Print>());
  CHECK(absl::StrContains(
      h.Get<e::Print>().text,
      "  class      : user_error (ModuleNotFoundError: No module named "
      "'tarnsformers')\n"));
  CHECK(h.ExitCode() == 1);
  CHECK(h.Said(
      "rank 5's failure is a user error (ModuleNotFoundError: No module named "
      "'tarnsformers'), which a restart cannot mend: not restarted, 3 of "
      "--max_restarts=3 left (--restart_on=default; add user_error to "
      "restart for it)"));
  // Restarted for, it says nothing of the kind.
  LaunchOptions all = Options();
  all.restart_on = RestartOnAll();
  Harness restarts(all);
  restarts.Assign();
  restarts.policy().OnWorkerExit(exit, restarts.now(), &effects);
  restarts.Exit(0, 0, SIGTERM);
  restarts.Message(Failed("no restarts left"));
  CHECK_FALSE(restarts.Said("which a restart cannot mend"));
}

TEST_CASE(
    "Ranks that fail after the root cause of a communication failure are "
    "labelled a cascade",
    "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Exit(1, 0, SIGKILL);  // the root cause
  WorkerExit reset{0, 1, 0, absl::UnixEpoch()};
  reset.last_lines = {
      "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
      "Connection reset by peer"};
  AgentEffects effects;
  h.policy().OnWorkerExit(reset, h.now(), &effects);
  h.Message(Failed("no restarts left"));
  const std::string summary = h.Get<e::Print>().text;
  const size_t root = summary.find("Root Cause");
  const size_t cascade =
      summary.find("class      : network, after the root cause (a cascade");
  REQUIRE(cascade != std::string::npos);
  CHECK(cascade < root);
  CHECK(summary.find("class      : signal", root) != std::string::npos);
}

TEST_CASE(
    "An attempt without progress is reported so: no step in a job that "
    "steps, or a short run by --min_progress_seconds, and such a job failure "
    "exits 78",
    "[agent][unit]") {
  auto reported = [](Harness& h, WorkerExit exit) {
    AgentEffects effects;
    h.policy().OnWorkerExit(exit, h.now(), &effects);
    for (const auto& effect : effects) {
      if (auto* s = std::get_if<e::Send>(&effect);
          s != nullptr && s->message.has_worker_report()) {
        return s->message.worker_report().failure();
      }
    }
    FAIL("no failure reported");
    return v1::WorkerFailure();
  };
  const WorkerExit quick{1, 3, 0, absl::UnixEpoch()};
  // No signals, no --min_progress_seconds: nothing to tell progress by.
  Harness plain;
  plain.Assign();
  CHECK_FALSE(reported(plain, quick).no_progress());
  // No signals: shorter than --min_progress_seconds is no progress.
  LaunchOptions o = Options();
  o.min_progress = absl::Seconds(30);
  Harness timed(o);
  timed.Assign();
  CHECK(reported(timed, quick).no_progress());
  // A job whose workers stepped once: an attempt without a step made none,
  // one with a step did, however short.
  Harness stepped;
  stepped.Assign();
  WorkerExit after_steps = quick;
  after_steps.attempt_stepped = true;
  CHECK_FALSE(reported(stepped, after_steps).no_progress());
  stepped.Exit(0, 0, SIGTERM);
  stepped.Message(Restart(1));
  stepped.Assign(1);
  const v1::WorkerFailure none = reported(stepped, quick);
  CHECK(none.no_progress());

  // The job failed for it: the summary, then exit 78 said.
  stepped.Exit(0, 0, SIGTERM);
  v1::ServerMessage failed = Failed("no progress in 3 attempts in a row");
  failed.mutable_job_failed()->set_no_progress(true);
  *failed.mutable_job_failed()->mutable_root_cause() = none;
  failed.mutable_job_failed()->set_root_cause_node("node-a:1");
  stepped.Message(failed);
  CHECK(stepped.Has<e::Print>());
  CHECK(stepped.ExitCode() == kNoProgressExitCode);
  CHECK(
      stepped.Said("the job's last attempts made no progress: exiting 78, "
                   "which says not to requeue it (the root cause's own "
                   "code was 3)"));
}

TEST_CASE("A job failure without a local failure exits 1 with the reason",
          "[agent][unit]") {
  Harness h;
  h.Assign();
  h.Message(Failed("node b failed"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.Said("job failed: node b failed"));
  CHECK(h.ExitCode() == 1);
}

// --- restarts
// ------------------------------------------------------------------

TEST_CASE("A restart stops the workers and rejoins once they are gone",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Message(Restart(1, "node c was lost"));
  CHECK(
      h.Said("restarting the workers (round 1, restarts used 1/3): node c "
             "was lost"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  CHECK_FALSE(h.Has<e::SendRejoin>());
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 1);
  CHECK(h.policy().phase() == Phase::kJoining);
  h.Assign(1);
  CHECK(h.policy().phase() == Phase::kRunning);
}

TEST_CASE("The agent records its round, its workers' lives and the end",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  CHECK(h.Records() == std::vector<std::string>{"assigned/0",
                                                "worker_started/0",
                                                "worker_started/0"});
  const v1::Event& started = h.Recorded(2);
  CHECK(started.rank() == 5);
  CHECK(started.local_rank() == 1);
  CHECK(started.pid() == 101);
  h.Advance(absl::Seconds(2));
  h.Exit(1, 3);
  REQUIRE(h.Records() == std::vector<std::string>{"worker_exited/0"});
  const v1::Event& exited = h.Recorded(0);
  CHECK(exited.rank() == 5);
  CHECK(exited.exit_code() == 3);
  CHECK_FALSE(exited.has_signal());
  CHECK(exited.duration_s() == 2.0);
  v1::ServerMessage restart = Restart(1, "rank 5 exited with code 3");
  restart.mutable_restart_required()->set_reason(
      v1::RestartRequired::WORKER_FAILED);
  h.Message(restart);
  REQUIRE(h.Records() == std::vector<std::string>{"restart_required/1"});
  CHECK(h.Recorded(0).reason() == "worker_failed");
  h.Exit(0, 0, SIGTERM);
  REQUIRE(h.Records() == std::vector<std::string>{"worker_exited/0"});
  CHECK(h.Recorded(0).exit_code() == 128 + SIGTERM);
  h.Assign(1);
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Message(Finished());
  CHECK(h.Records() ==
        std::vector<std::string>{"job_finished/1", "agent_exited/1"});
}

TEST_CASE(
    "A lost node during a restart rejoins the newest round, signalling "
    "once",
    "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Message(Restart(1));
  h.Message(Restart(2, "node d was lost"));
  CHECK(h.Signals().empty());  // asked to stop already
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 2);
}

TEST_CASE("A restart after this node's failure rejoins once they stopped",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Exit(0, 1);
  h.Message(Restart(1));
  CHECK(h.Signals().empty());
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 1);
}

TEST_CASE("A restart of a node whose workers are done rejoins at once",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Message(Restart(1));
  CHECK(h.Signals().empty());
  REQUIRE(h.Has<e::SendRejoin>());
}

TEST_CASE("A worker failure while stopping is not reported", "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Message(Restart(1));
  h.Exit(0, 1);
  CHECK(h.Reports().empty());
  CHECK_FALSE(h.Said("exited with code"));
}

TEST_CASE("Workers that ignore SIGTERM get SIGKILL, and are abandoned after",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Message(Restart(1));
  h.Advance(absl::Seconds(29));
  CHECK(h.Signals().empty());
  h.Advance(absl::Seconds(1));
  CHECK(
      h.Said("worker rank 4 (pid 100) still running after 30s; sending "
             "SIGKILL"));
  CHECK(h.Signals() == std::vector<int>{SIGKILL});
  h.Exit(0, 0, SIGKILL);
  h.Advance(AgentPolicy::kGiveUpAfterKill);
  CHECK(h.Said("worker rank 5 (pid 101) did not exit after SIGKILL"));
  CHECK(h.Has<e::AbandonWorkers>());
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.policy().live_workers() == 0);
}

// --- signals
// -------------------------------------------------------------------

TEST_CASE("A signal stops the workers with it and exits 128 plus it",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Signal(SIGTERM);
  CHECK(h.Said("received SIGTERM; stopping 2 workers (SIGKILL after 30s)"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.ExitCode() == 128 + SIGTERM);
  CHECK(h.policy().stopped_by_signal());
}

// --- job control

const std::string kStop = "signal " + std::to_string(SIGTSTP);
const std::string kContinue = "signal " + std::to_string(SIGCONT);

TEST_CASE("Ctrl-Z stops the workers with the agent, fg continues them",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Signal(SIGTSTP);
  CHECK(h.Sequence() == std::vector<std::string>{kStop, "suspend", kContinue});
  CHECK(h.policy().phase() == Phase::kRunning);
  CHECK_FALSE(h.ExitCode());
  // Continued: the rendezvous hears from the node at once.
  h.Advance(absl::ZeroDuration());
  int heartbeats = 0;
  for (const auto& effect : h.effects()) {
    if (auto* s = std::get_if<e::Send>(&effect)) {
      heartbeats += s->message.has_heartbeat();
    }
  }
  CHECK(heartbeats == 1);
  // The job goes on as before.
  h.Exit(0, 0);
  h.Exit(1, 0);
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::SUCCEEDED);
}

TEST_CASE("Ctrl-Z while joining stops the agent alone", "[agent][unit]") {
  Harness h;
  h.Signal(SIGTSTP);
  CHECK(h.Sequence() == std::vector<std::string>{"suspend"});
  CHECK(h.policy().phase() == Phase::kJoining);
}

TEST_CASE("Rank 0 reading the terminal in the background stops the job",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.TerminalStop();
  CHECK(h.Sequence() == std::vector<std::string>{kStop, "suspend", kContinue});
  CHECK(h.Reports().empty());  // no failure
}

TEST_CASE("A stop the parent delivered to the workers is not sent again",
          "[agent][unit]") {
  LaunchOptions o = Options();
  o.parent_signals_workers = true;
  Harness h(o);
  h.Assign(0);
  h.Signal(SIGTSTP, /*from_parent=*/true);
  CHECK(h.Sequence() == std::vector<std::string>{"suspend", kContinue});
}

TEST_CASE("A restart request while stopping for a signal is ignored",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Signal(SIGINT);
  h.Message(Restart(1, "node b left"));
  CHECK(h.Signals().empty());
  CHECK_FALSE(h.Said("restarting"));
  h.Exit(0, 0, SIGINT);
  h.Exit(1, 0, SIGINT);
  CHECK_FALSE(h.Has<e::SendRejoin>());
  CHECK(h.ExitCode() == 128 + SIGINT);
}

TEST_CASE("A signal while restarting is not sent again but decides the exit",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Message(Restart(1));
  h.Signal(SIGTERM);
  CHECK(h.Signals().empty());
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK_FALSE(h.Has<e::SendRejoin>());
  CHECK(h.ExitCode() == 128 + SIGTERM);
}

TEST_CASE("A second signal kills the workers at once", "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Signal(SIGTERM);
  h.Signal(SIGTERM);
  CHECK(h.Said("SIGTERM again: killing the workers now"));
  CHECK(h.Signals() == std::vector<int>{SIGKILL});
}

TEST_CASE(
    "SIGUSR1 is forwarded, unless the parent delivered it in a Slurm "
    "step",
    "[agent][unit]") {
  LaunchOptions o = Options();
  o.parent_signals_workers = true;
  Harness h(o);
  h.Assign(0);
  h.Signal(SIGUSR1);
  CHECK(h.Signals() == std::vector<int>{SIGUSR1});
  h.Signal(SIGUSR1, /*from_parent=*/true);
  CHECK(h.Signals().empty());
  CHECK(h.policy().phase() == Phase::kRunning);
}

TEST_CASE("A terminating signal the parent delivered is not sent again",
          "[agent][unit]") {
  LaunchOptions o = Options();
  o.parent_signals_workers = true;
  Harness h(o);
  h.Assign(0);
  h.Signal(SIGTERM, /*from_parent=*/true);
  CHECK(h.Signals().empty());
  CHECK(h.policy().phase() == Phase::kStopping);
}

TEST_CASE(
    "A session a standby replica sent on opens again at once, saying "
    "nothing, and a later loss is still said",
    "[agent][unit]") {
  Harness h;
  const absl::Status standby = absl::UnavailableError(
      "the ctrund replica at 10.0.0.1:29400 stands by; the leader is "
      "10.0.0.2:29400");
  h.SessionEnd(standby, /*redirected=*/true);
  CHECK_FALSE(h.Has<e::Say>());
  CHECK(h.policy().link() == Link::kRetrying);
  h.Advance(absl::ZeroDuration());
  REQUIRE(h.Has<e::OpenSession>());
  h.Message(Progress());
  h.Assign(2, /*resumable=*/true);
  h.SessionEnd(standby, /*redirected=*/true);
  CHECK_FALSE(h.Has<e::Say>());
  CHECK(h.Signals().empty());
  h.Advance(absl::ZeroDuration());
  REQUIRE(h.Has<e::OpenSession>());
  CHECK(h.Get<e::OpenSession>().resume_round == 2);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  CHECK(h.Said("the workers keep running while ctrun reconnects (up to 1m)"));
}

// --- the rendezvous going away
// -------------------------------------------------

TEST_CASE(
    "Workers keep running while the agent resumes with a stateful "
    "rendezvous",
    "[agent][unit]") {
  Harness h;
  h.Assign(3, /*resumable=*/true);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  CHECK(h.Said("the workers keep running while ctrun reconnects (up to 1m)"));
  CHECK(h.Signals().empty());
  CHECK(h.policy().link() == Link::kResuming);
  h.Advance(AgentPolicy::kReopenDelay);
  REQUIRE(h.Has<e::OpenSession>());
  CHECK(h.Get<e::OpenSession>().resume_round == 3);
  h.Message(Resumed(3));
  CHECK(h.Said("resumed with the rendezvous at 10.0.0.1:29400 in round 3"));
  CHECK(h.policy().link() == Link::kOpen);
  // The last report is said again: one sent meanwhile may be lost.
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::RUNNING);
  CHECK(h.policy().phase() == Phase::kRunning);
}

TEST_CASE("A failure while resuming is reported once the session is back",
          "[agent][unit]") {
  Harness h;
  h.Assign(0, /*resumable=*/true);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Exit(0, 9);
  CHECK(h.Reports().empty());  // no session to carry it
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Advance(AgentPolicy::kReopenDelay);
  h.Message(Resumed(0));
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::FAILED);
  CHECK(h.Reports()[0].failure().exit_code() == 9);
}

TEST_CASE("A restart finished while resuming rejoins once resumed",
          "[agent][unit]") {
  Harness h;
  h.Assign(0, /*resumable=*/true);
  h.Message(Restart(1));
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK_FALSE(h.Has<e::SendRejoin>());
  h.Advance(AgentPolicy::kReopenDelay);
  h.Message(Resumed(0));
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 1);
  CHECK(h.Reports().empty());
}

TEST_CASE("A rendezvous back without this node: stop, then join afresh",
          "[agent][unit]") {
  Harness h;
  h.Assign(0, /*resumable=*/true);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Advance(AgentPolicy::kReopenDelay);
  h.SessionEnd(absl::NotFoundError("no node of incarnation 5"));
  CHECK(h.Said("is back but no node of incarnation 5; stopping the workers"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.Has<e::OpenSession>());
  CHECK_FALSE(h.Get<e::OpenSession>().resume_round.has_value());
  CHECK(h.policy().phase() == Phase::kJoining);
  CHECK(h.policy().link() == Link::kConnecting);
  CHECK_FALSE(h.ExitCode());
}

TEST_CASE("Resuming gives up after the reconnect timeout and stops",
          "[agent][unit]") {
  Harness h;
  h.Assign(0, /*resumable=*/true);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Advance(absl::Seconds(60));
  CHECK(h.Said("could not reconnect to the rendezvous"));
  CHECK(h.Has<e::CancelSession>());
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.ExitCode() == 1);
}

TEST_CASE("A rendezvous without state lost while running stops the job",
          "[agent][unit]") {
  Harness h;
  h.Assign(0, /*resumable=*/false);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  CHECK(
      h.Said("the rendezvous at 10.0.0.1:29400 went away (UNAVAILABLE: "
             "Socket closed) and keeps no state to resume from"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.ExitCode() == 1);
}

TEST_CASE("A session end after the job's end decided changes nothing",
          "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Signal(SIGTERM);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  CHECK_FALSE(h.Has<e::Say>());
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.ExitCode() == 128 + SIGTERM);
}

TEST_CASE("Heartbeats go out every keep-alive interval, not while reopening",
          "[agent][unit]") {
  Harness h;
  auto heartbeats = [&] {
    int n = 0;
    for (const auto& effect : h.effects()) {
      if (auto* s = std::get_if<e::Send>(&effect))
        n += s->message.has_heartbeat();
    }
    return n;
  };
  h.Advance(absl::Milliseconds(1500));
  CHECK(heartbeats() == 1);
  h.Assign(0, /*resumable=*/true);
  h.SessionEnd(absl::UnavailableError("Socket closed"));
  h.Advance(AgentPolicy::kReopenDelay - absl::Milliseconds(1));
  CHECK(heartbeats() == 0);
  h.Advance(absl::Milliseconds(2500));
  CHECK(heartbeats() == 2);  // on the reopened session
}

// --- hangs, evidence, file timers -------------------------------------------

LaunchOptions HangOptions(absl::Duration timeout = absl::Seconds(2)) {
  LaunchOptions o = Options();
  o.hang_timeout.mode = HangTimeout::Mode::kFixed;
  o.hang_timeout.fixed = timeout;
  o.hang_evidence_timeout = absl::Seconds(10);
  o.hang_timeout.warmup = absl::ZeroDuration();
  return o;
}

// Local rank 0 beat just now; local rank 1 never did.
std::vector<ProgressSample> OneSilent(absl::Time now) {
  std::vector<ProgressSample> s(2);
  s[0].beats = s[0].events = 40;
  s[0].beat_time = s[0].event_time = now;
  return s;
}

TEST_CASE("The board is read while workers run, and only then",
          "[agent][unit]") {
  Harness h(HangOptions());
  h.Advance(absl::Seconds(1));
  CHECK_FALSE(h.Has<e::ReadProgress>());
  h.Assign(0);
  h.Advance(absl::Milliseconds(350));
  CHECK(h.Count<e::ReadProgress>() == 3);
  h.Exit(0, 1);
  h.Advance(absl::Seconds(1));
  CHECK_FALSE(h.Has<e::ReadProgress>());
}

TEST_CASE(
    "Workers that never signal are let off at the end of the warm-up, with "
    "one notice",
    "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  int notices = 0;
  for (int i = 0; i < 30; ++i) {
    h.Advance(absl::Seconds(1));
    h.Progress(std::vector<ProgressSample>(2));
    CHECK(h.Reports().empty());
    CHECK(h.Signals().empty());
    if (h.Said("no worker of this job has sent a progress signal within its "
               "warm-up")) {
      ++notices;
      CHECK(
          h.Said("is off for rank 4, rank 5 until a worker of the job "
                 "sends one"));
    }
  }
  CHECK(notices == 1);
  CHECK(h.policy().phase() == Phase::kRunning);
}

TEST_CASE("A hung worker is reported and its evidence taken before the stop",
          "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  h.Advance(absl::Seconds(1));
  h.Progress(OneSilent(h.now()));
  CHECK(h.Reports().empty());
  h.Advance(absl::Milliseconds(1100));
  h.Progress(OneSilent(h.now()));
  CHECK(
      h.Said("worker rank 5 (local 1, pid 101) is hung: no progress signal "
             "in the 2.1s since it started (allowed 2s to start"));
  REQUIRE(h.Has<e::CollectEvidence>());
  CHECK(h.Get<e::CollectEvidence>().focus == 1);
  CHECK(h.Get<e::CollectEvidence>().dir == "hang_round_0");
  CHECK(h.Get<e::CollectEvidence>().deadline == h.now() + absl::Seconds(10));
  CHECK(h.Signals().empty());
  CHECK(h.policy().phase() == Phase::kCollecting);
  // Reported once its stacks are read: they may name another rank.
  CHECK(h.Reports().empty());
  h.Advance(absl::Seconds(1));
  CHECK(h.Reports().empty());
  h.Collected();
  CHECK(h.Has<e::EndEvidence>());
  REQUIRE(h.Reports().size() == 1);
  const v1::WorkerReport r = h.Reports()[0];
  CHECK(r.state() == v1::WorkerReport::FAILED);
  CHECK(r.failure().hung());
  CHECK_FALSE(r.failure().waiting());  // no stacks: nothing known
  CHECK(r.failure().global_rank() == 5);
  CHECK(absl::StrContains(r.failure().message(), "no progress signal"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  CHECK(h.policy().phase() == Phase::kStopping);
}

StackReading Waiting() {
  return {StackReading::Place::kWaiting, "all_reduce", "Python"};
}
StackReading Sleeping() {
  return {StackReading::Place::kElsewhere, "train.py, line 25, in step",
          "Python"};
}

TEST_CASE(
    "A hung worker whose stack waits in a collective gives way to the rank "
    "here that its stacks show outside any",
    "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  h.Advance(absl::Milliseconds(2100));
  h.Progress(OneSilent(h.now()));  // rank 5 stopped signalling first
  REQUIRE(h.Has<e::CollectEvidence>());
  h.SetStacks({{4, 0, Sleeping()}, {5, 1, Waiting()}});
  h.Collected();
  CHECK(
      h.Said("rank 4 holds up the job: its main thread is outside any "
             "collective (at train.py, line 25, in step) while rank 5 "
             "waits in all_reduce; decided from the workers' Python "
             "stacks"));
  CHECK(h.Records() == std::vector<std::string>{"hang_culprit/0"});
  CHECK(h.Recorded(0).rank() == 4);
  REQUIRE(h.Reports().size() == 1);
  const v1::WorkerFailure f = h.Reports()[0].failure();
  CHECK(f.hung());
  CHECK_FALSE(f.waiting());
  CHECK(f.global_rank() == 4);
  CHECK(f.local_rank() == 0);
  CHECK(f.pid() == 100);
  CHECK(absl::StrContains(f.message(), "rank 4 holds up the job"));
  CHECK(absl::StrContains(f.message(),
                          "; rank 5 stopped signalling first: no progress "
                          "signal in the 2.1s"));
  // The rendezvous fails the job with it: the summary names rank 4.
  v1::ServerMessage failed;
  failed.mutable_job_failed()->set_reason("rank 4 hung");
  failed.mutable_job_failed()->set_hung(true);
  *failed.mutable_job_failed()->mutable_root_cause() = f;
  failed.mutable_job_failed()->set_root_cause_node("node-a:1");
  h.Message(failed);
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  REQUIRE(h.ExitCode());
  CHECK(*h.ExitCode() == kHangExitCode);
  const std::string summary = h.Get<e::Print>().text;
  INFO(summary);
  const size_t root_at = summary.find("Root Cause (first observed failure)");
  REQUIRE(root_at != std::string::npos);
  CHECK(absl::StrContains(summary.substr(root_at),
                          "rank       : 4 (local_rank: 0)"));
}

TEST_CASE(
    "Every worker here waiting in a collective: the hang is reported as "
    "waiting, so a rank hung elsewhere outside any takes its place",
    "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  h.Advance(absl::Milliseconds(2100));
  h.Progress(OneSilent(h.now()));
  h.SetStacks({{4, 0, Waiting()}, {5, 1, Waiting()}});
  h.Collected();
  CHECK(
      h.Said("every worker here (ranks 4, 5) waits in all_reduce: the rank "
             "they wait for is not on this node"));
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].failure().global_rank() == 5);
  CHECK(h.Reports()[0].failure().waiting());
}

TEST_CASE("Evidence that takes too long is cut at its deadline",
          "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  h.Advance(absl::Milliseconds(2100));
  h.Progress(OneSilent(h.now()));
  REQUIRE(h.Has<e::CollectEvidence>());
  h.Advance(absl::Milliseconds(9900));
  CHECK(h.Signals().empty());
  h.Advance(absl::Milliseconds(200));
  CHECK(h.Has<e::EndEvidence>());
  CHECK(h.Reports().size() == 1);  // the hang, owed until the stacks
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
}

TEST_CASE("A node told of a hang elsewhere collects before it stops",
          "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  v1::ServerMessage restart = Restart(1, "rank 0 on node-b hung");
  restart.mutable_restart_required()->set_collect_evidence(true);
  h.Message(restart);
  REQUIRE(h.Has<e::CollectEvidence>());
  CHECK(h.Get<e::CollectEvidence>().focus == -1);
  CHECK(h.Signals().empty());
  // What its stacks say is said; there is no hang of its own to report.
  h.SetStacks({{4, 0, Sleeping()}, {5, 1, Waiting()}});
  h.Collected();
  CHECK(h.Said("rank 4 holds up the job"));
  CHECK(h.Reports().empty());
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.Has<e::SendRejoin>());
}

TEST_CASE("A signal does not wait for the evidence", "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  h.Advance(absl::Milliseconds(2100));
  h.Progress(OneSilent(h.now()));
  REQUIRE(h.policy().phase() == Phase::kCollecting);
  h.Signal(SIGINT);
  CHECK(h.Sequence().size() >= 2);
  CHECK(h.Has<e::EndEvidence>());
  CHECK(h.Signals() == std::vector<int>{SIGINT});
}

TEST_CASE("A hang with no restarts left exits with the hang code",
          "[agent][unit]") {
  LaunchOptions o = HangOptions();
  o.max_restarts = 0;
  Harness h(o);
  h.Assign(0);
  h.Advance(absl::Milliseconds(2100));
  h.Progress(OneSilent(h.now()));
  h.Collected();
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  v1::ServerMessage failed;
  failed.mutable_job_failed()->set_reason("rank 5 hung; no restarts left");
  failed.mutable_job_failed()->set_hung(true);
  h.Message(failed);
  REQUIRE(h.ExitCode() == kHangExitCode);
  REQUIRE(h.Has<e::Print>());
  const std::string& summary = h.Get<e::Print>().text;
  CHECK(absl::StrContains(summary, "cause      : hung: no progress signal"));
  CHECK(absl::StrContains(summary, "exitcode   : <hung> (pid: 101"));
}

TEST_CASE(
    "A node whose job failed by a hang elsewhere exits with the hang "
    "code after collecting",
    "[agent][unit]") {
  Harness h(HangOptions());
  h.Assign(0);
  v1::ServerMessage failed;
  failed.mutable_job_failed()->set_reason("rank 0 on node-b hung");
  failed.mutable_job_failed()->set_hung(true);
  h.Message(failed);
  REQUIRE(h.Has<e::CollectEvidence>());
  CHECK(h.Signals().empty());
  h.Collected();
  h.Exit(0, 0, SIGTERM);
  h.Exit(1, 0, SIGTERM);
  CHECK(h.ExitCode() == kHangExitCode);
}

TEST_CASE("Learned silences come with the assignment and are said",
          "[agent][unit]") {
  LaunchOptions o = Options();
  o.hang_timeout.mode = HangTimeout::Mode::kAuto;
  Harness h(o);
  v1::ServerMessage m;
  auto* a = m.mutable_assignment();
  a->set_round(3);
  a->set_restart_count(1);
  auto* l = a->add_longest();
  l->set_section("");
  l->set_longest_ms(240);
  h.Message(m);
  CHECK(
      h.Said("hang timeout 1.2s after each worker's warm-up: 5 x the "
             "longest silence this job has shown (240ms)"));
  CHECK(h.policy().monitor().TimeoutIn("") == absl::Milliseconds(1200));
}

TEST_CASE("A straggler named by the rendezvous is said", "[agent][unit]") {
  Harness h;
  h.Assign(0);
  v1::ServerMessage m;
  auto* s = m.mutable_straggler();
  s->set_rank(5);
  s->set_node("gpu03:77");
  s->set_ratio(1.4);
  s->set_steps(12);
  s->set_mean_step_us(140000);
  s->set_median_step_us(100000);
  h.Message(m);
  CHECK(
      h.Said("rank 5 on node gpu03:77 is 1.4x slower than the median step "
             "(0.14s against 0.1s, 12 steps); not restarting for it"));
  CHECK(h.Signals().empty());
}

// A timer of worker rank 5 (pid 101) asking for `signal`, expired by now.
void ExpireTimer(Harness& h, int signal) {
  const absl::Time wall = absl::FromUnixSeconds(1'800'000'000);
  h.TimerLine(absl::StrCat(R"({"version": 1, "pid": 101, )",
                           R"("scope_id": "dataloader", )",
                           R"("expiration_time": 1800000001.0, "signal": )",
                           signal, "}"),
              wall);
  h.Advance(absl::Milliseconds(900));
  CHECK_FALSE(h.Has<e::KillTimedOut>());
  h.Advance(absl::Milliseconds(200));
}

TEST_CASE(
    "An expired file timer's worker fails with its scope named, and gets its "
    "signal once the evidence is in",
    "[agent][unit]") {
  LaunchOptions o = Options();
  o.file_timers = true;
  o.hang_evidence_timeout = absl::Seconds(10);
  Harness h(o);
  h.Assign(0);
  ExpireTimer(h, SIGKILL);
  CHECK(
      h.Said("torchrun file timer 'dataloader' of worker rank 5 (pid 101) "
             "expired; collecting evidence from this node's workers, then "
             "killing it with SIGKILL and stopping the others"));
  REQUIRE(h.Has<e::CollectEvidence>());
  CHECK(h.Get<e::CollectEvidence>().focus == 1);
  CHECK_FALSE(h.Has<e::KillTimedOut>());
  CHECK(h.Signals().empty());
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::FAILED);
  CHECK(h.Reports()[0].failure().global_rank() == 5);
  CHECK(absl::StrContains(h.Reports()[0].failure().message(),
                          "file timer 'dataloader' expired"));
  h.Collected();
  REQUIRE(h.Has<e::KillTimedOut>());
  CHECK(h.Get<e::KillTimedOut>().pid == 101);
  CHECK(h.Get<e::KillTimedOut>().signal == SIGKILL);
  CHECK(h.Get<e::KillTimedOut>().scope == "dataloader");
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
}

TEST_CASE("Without evidence an expired file timer kills at once",
          "[agent][unit]") {
  LaunchOptions o = Options();
  o.file_timers = true;
  o.hang_evidence_timeout = absl::ZeroDuration();
  Harness h(o);
  h.Assign(0);
  ExpireTimer(h, SIGTERM);
  REQUIRE(h.Has<e::KillTimedOut>());
  CHECK(h.Get<e::KillTimedOut>().signal == SIGTERM);
  CHECK_FALSE(h.Has<e::CollectEvidence>());
  CHECK(
      h.Said("torchrun file timer 'dataloader' of worker rank 5 (pid 101) "
             "expired; killing it with SIGTERM and stopping the others"));
}

TEST_CASE("A file timer that asks for SIGSTOP gets SIGKILL", "[agent][unit]") {
  LaunchOptions o = Options();
  o.file_timers = true;
  o.hang_evidence_timeout = absl::ZeroDuration();
  Harness h(o);
  h.Assign(0);
  ExpireTimer(h, SIGSTOP);
  REQUIRE(h.Has<e::KillTimedOut>());
  CHECK(h.Get<e::KillTimedOut>().signal == SIGKILL);
  CHECK(
      h.Said("asks for SIGSTOP, which would stop it, not end it: SIGKILL "
             "instead"));
}

TEST_CASE("A malformed file-timer request is said once and ignored",
          "[agent][unit]") {
  LaunchOptions o = Options();
  o.file_timers = true;
  Harness h(o);
  h.Assign(0);
  h.TimerLine("garbage", absl::UnixEpoch());
  CHECK(h.Said("ignoring a request on the file-timer FIFO: not a JSON object"));
  h.TimerLine("more garbage", absl::UnixEpoch());
  CHECK(h.effects().empty());
}

// --- in-process recovery
// ---------------------------------------------------------

LaunchOptions InProcess(int workers = 3) {
  LaunchOptions o = Options(workers);
  o.recovery = Recovery::kInProcess;
  o.recovery_timeout = absl::Seconds(5);
  return o;
}

// Board samples: each worker recovers in process (or not) and took `left`.
std::vector<ProgressSample> Resilient(std::vector<bool> resilient,
                                      int64_t left = 0) {
  std::vector<ProgressSample> samples(resilient.size());
  for (size_t i = 0; i < resilient.size(); ++i) {
    samples[i].resilient = resilient[i];
    samples[i].round_left = left;
  }
  return samples;
}

TEST_CASE("In-process recovery keeps the survivors and replaces the dead rank",
          "[agent][unit]") {
  Harness h(InProcess());
  h.Assign(0);
  h.Progress(Resilient({true, true, true}));
  h.Exit(1, 0, SIGKILL);
  CHECK(
      h.Said("worker rank 5 (local 1, pid 101) was killed by SIGKILL: signal; "
             "the "
             "others keep running (--recovery=inprocess)"));
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::FAILED);
  // Nobody is stopped; the survivors are told their round ends.
  CHECK(h.Signals().empty());
  REQUIRE(h.Has<e::EndRound>());
  CHECK(h.Get<e::EndRound>().round == 0);
  CHECK(h.policy().phase() == Phase::kRunning);

  h.Message(Restart(1, "worker rank 5 failed"));
  CHECK(h.Said("the live workers keep their processes"));
  CHECK(h.Signals().empty());
  CHECK_FALSE(h.Has<e::EndRound>());  // said once per round
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 1);
  CHECK(h.policy().phase() == Phase::kJoining);
  CHECK(h.policy().live_workers() == 2);

  h.AssignOnly(1, /*first=*/0, /*world=*/3);
  CHECK(
      h.Said("round 1: ranks 0,2 kept their processes; new process for "
             "rank 1"));
  REQUIRE(h.Has<e::HandOver>());
  CHECK(h.Get<e::HandOver>().local_ranks == std::vector<int>{0, 2});
  REQUIRE(h.Has<e::StartWorkers>());
  CHECK(h.Get<e::StartWorkers>().local_ranks == std::vector<int>{1});
  CHECK(h.Records() ==
        std::vector<std::string>{"assigned/1", "workers_kept/1"});
  h.Started({1});
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::RUNNING);
  CHECK(h.policy().live_workers() == 3);
  // Everyone finishes: the job's end.
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Exit(2, 0);
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::SUCCEEDED);
}

// Fails before: "the others keep running" was said, and the job ended at
// the next line (torchrun's default budget is 0).
TEST_CASE(
    "In process without a restart left, a failure says the job ends instead "
    "of promising a recovery",
    "[agent][unit]") {
  LaunchOptions o = InProcess(2);
  o.max_restarts = 0;
  Harness h(o);
  h.Assign(0);
  h.Progress(Resilient({true, true}));
  h.Exit(1, 0, SIGKILL);
  CHECK(
      h.Said("was killed by SIGKILL: signal; no restart left "
             "(--max_restarts=0): the job ends"));
  CHECK_FALSE(h.Said("the others keep running"));
}

TEST_CASE("An in-process round says how long each part took", "[agent][unit]") {
  Harness h(InProcess(2));
  h.Assign(0);
  std::vector<ProgressSample> samples = Resilient({true, true});
  for (ProgressSample& s : samples) s.beats = 10;  // they heartbeat
  h.Progress(samples);
  const absl::Time failed = h.now();
  h.Exit(1, 0, SIGKILL);
  h.Message(Restart(1, "worker rank 5 failed"));
  h.AssignOnly(1, /*first=*/4, /*world=*/8);
  h.Started({1});
  // Local rank 0 took the world at +0.05 s; the new process reached its
  // wrapper at +0.10 s; both formed the group by +0.20 s.
  samples[0].round_left = samples[1].round_left = 1;
  samples[0].round_ready = samples[1].round_ready = 1;
  samples[0].left_time = failed + absl::Milliseconds(50);
  samples[1].left_time = failed + absl::Milliseconds(100);
  samples[0].ready_time = failed + absl::Milliseconds(190);
  samples[1].ready_time = failed + absl::Milliseconds(200);
  samples[1].beats = 0;
  h.Advance(absl::Milliseconds(400));  // the agent reads after the fact
  h.Progress(samples);
  CHECK(h.Records().empty());  // they heartbeat: waits for the first step
  samples[0].beats = 11;
  samples[1].beats = 1;
  samples[0].beat_time = failed + absl::Milliseconds(250);
  samples[1].beat_time = failed + absl::Milliseconds(300);
  h.Progress(samples);
  CHECK(
      h.Said("round 1 recovered in 0.30s from the failure: rank 4 took the "
             "new world at 0.05s, new process for rank 5 up at 0.10s "
             "(cold), process group formed at 0.20s, first step at 0.30s"));
  REQUIRE(h.Records() == std::vector<std::string>{"round_recovered/1"});
  CHECK(h.Recorded(0).duration_s() == Approx(0.3));
  h.Progress(samples);
  CHECK(h.Records().empty());  // said once
}

TEST_CASE("Times a worker stamps are taken within what the agent saw",
          "[agent][unit]") {
  Harness h(InProcess(1));
  h.Assign(0);
  h.Progress(Resilient({true}));
  h.Message(Restart(1, "node b was lost"));
  h.AssignOnly(1, /*first=*/4, /*world=*/8);
  h.Advance(absl::Milliseconds(500));
  std::vector<ProgressSample> samples = Resilient({true}, 1);
  samples[0].round_ready = 1;
  samples[0].left_time = absl::InfinitePast();  // before the round ended
  samples[0].ready_time = h.now() + absl::Hours(1000);  // in the future
  h.Progress(samples);
  // It sends no progress signals: the group formed, and that is all that
  // is known (never "recovered").
  CHECK(
      h.Said("round 1: process group formed in 0.50s from the failure: "
             "rank 4 took the new world at 0.00s, process group formed at "
             "0.50s; no rank sends progress signals"));
  CHECK_FALSE(h.Said("recovered"));
  REQUIRE(h.Records() == std::vector<std::string>{"round_formed/1"});
  CHECK(h.Recorded(0).duration_s() == Approx(0.5));
}

// Round 0 of two local ranks (ranks 4 and 5) reporting `before`; local
// rank 1 is killed; round 1 keeps rank 4 and starts a new process for 5.
void ReplaceRank5(Harness& h, const std::vector<ProgressSample>& before) {
  h.Assign(0);
  h.Progress(before);
  h.Exit(1, 0, SIGKILL);
  h.Message(Restart(1, "worker rank 5 failed"));
  h.AssignOnly(1, /*first=*/4, /*world=*/8);
  REQUIRE(h.Has<e::StartWorkers>());
  h.Started({1});
}

// Fails before: nothing was said after "new process for rank 5" while it
// waited for ever in a collective the others never made.
TEST_CASE(
    "A new process that never forms the group is named within "
    "--recovery_timeout of the round's start, and the round ends as a hang",
    "[agent][unit]") {
  Harness h(InProcess(2));
  ReplaceRank5(h, Resilient({true, true}));
  std::vector<ProgressSample> samples = Resilient({true, false}, 1);
  samples[0].round_ready = 1;  // rank 4 formed it; rank 5 never does
  samples[1].round_left = 0;
  h.Progress(samples);
  h.Advance(absl::Seconds(4));
  h.Progress(samples);
  CHECK_FALSE(h.Said("has not recovered"));
  h.Advance(absl::Seconds(2));
  h.Progress(samples);
  CHECK(
      h.Said("round 1 has not recovered within 5s (--recovery_timeout): "
             "rank 5 has not formed the process group."));
  CHECK(h.Has<e::CollectEvidence>());
}

// Fails before: "round 1 recovered" was said 5 s after the group formed
// although rank 5 never stepped again.
TEST_CASE(
    "A round whose ranks formed the group but do not step is said not "
    "recovered, naming them, within --recovery_timeout",
    "[agent][unit]") {
  Harness h(InProcess(2));
  std::vector<ProgressSample> samples = Resilient({true, true});
  for (ProgressSample& s : samples) s.beats = 10;
  ReplaceRank5(h, samples);
  samples[0].round_left = samples[1].round_left = 1;
  samples[0].round_ready = samples[1].round_ready = 1;
  samples[1].beats = 0;  // the new process
  h.Progress(samples);
  samples[0].beats = 11;  // rank 4 steps; rank 5 never does
  h.Advance(absl::Seconds(4));
  h.Progress(samples);
  CHECK_FALSE(h.Said("recovered"));
  h.Advance(absl::Seconds(2));  // past the 5 s --recovery_timeout
  h.Progress(samples);
  CHECK(
      h.Said("round 1 has not recovered within 5s (--recovery_timeout): "
             "rank 5 has not stepped since the process group formed. Most "
             "often a collective that only some ranks make"));
  CHECK(
      h.Said(") is hung: round 1 did not "
             "recover within 5s (--recovery_timeout): it has not stepped "
             "since the process group formed"));
  CHECK_FALSE(h.Said("round 1 recovered"));
  REQUIRE(h.Records().size() >= 1);
  CHECK(h.Records()[0] == "round_not_recovered/1");
  // It ends as a hang: the evidence, then the workers stop.
  CHECK(h.Has<e::CollectEvidence>());
  h.Progress(samples);
  CHECK(h.Records().empty());  // said once
}

TEST_CASE("In-process recovery of a lost node starts no process",
          "[agent][unit]") {
  Harness h(InProcess(2));
  h.Assign(0);
  h.Progress(Resilient({true, true}));
  h.Message(Restart(1, "node b was lost"));
  REQUIRE(h.Has<e::EndRound>());
  REQUIRE(h.Has<e::SendRejoin>());
  h.AssignOnly(1, /*first=*/0, /*world=*/2);
  REQUIRE(h.Has<e::HandOver>());
  CHECK(h.Get<e::HandOver>().local_ranks == std::vector<int>{0, 1});
  CHECK(h.Get<e::HandOver>().assignment.world_size() == 2);
  CHECK_FALSE(h.Has<e::StartWorkers>());
  // Reported running at once: nothing is started.
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::RUNNING);
  CHECK(h.policy().phase() == Phase::kRunning);
}

// Two resilient workers kept into round 1 (a node lost); local rank 0
// takes its world, local rank 1 stays in round 0. Their slots as read.
std::vector<ProgressSample> OneSurvivorLeftBehind(Harness& h) {
  h.Assign(0);
  h.Progress(Resilient({true, true}));
  h.Message(Restart(1, "node b was lost"));
  h.AssignOnly(1, /*first=*/0, /*world=*/2);
  std::vector<ProgressSample> samples = Resilient({true, true}, 0);
  samples[0].round_left = 1;
  h.Progress(samples);
  return samples;
}

TEST_CASE("A survivor that does not take the new world is restarted",
          "[agent][unit]") {
  Harness h(InProcess(2));
  OneSurvivorLeftBehind(h);
  h.Advance(absl::Seconds(4));
  CHECK_FALSE(h.Has<e::SignalWorker>());
  h.Advance(absl::Seconds(2));
  REQUIRE(h.Has<e::SignalWorker>());
  CHECK(h.Get<e::SignalWorker>().local_rank == 1);
  CHECK(h.Get<e::SignalWorker>().signal == SIGKILL);
  CHECK(
      h.Said("worker rank 1 (local 1, pid 101) did not take round 1's "
             "world within 5s (--recovery_timeout)"));
  // Its end is no failure: it is started again.
  h.Exit(1, 0, SIGKILL);
  CHECK(h.Reports().empty());
  REQUIRE(h.Has<e::StartWorkers>());
  CHECK(h.Get<e::StartWorkers>().local_ranks == std::vector<int>{1});
  h.Started({1});
  // The new process's end is its own.
  h.Exit(1, 3);
  REQUIRE(h.Reports().size() == 1);
  CHECK(h.Reports()[0].state() == v1::WorkerReport::FAILED);
  CHECK_FALSE(h.Has<e::StartWorkers>());
}

// Fails before: a survivor blocked in Gloo's connect for a peer of the old
// round waited out --recovery_timeout, and the round then ended as a hang
// because its new process had no time left to start.
TEST_CASE(
    "A survivor stuck forming the old round's group is restarted at once, "
    "its new process given the time a start gets",
    "[agent][unit]") {
  Harness h(InProcess(2));
  std::vector<ProgressSample> samples = OneSurvivorLeftBehind(h);
  CHECK_FALSE(h.Has<e::SignalWorker>());
  h.Advance(absl::Seconds(4));
  samples[1].stuck = true;
  h.Progress(samples);
  REQUIRE(h.Has<e::SignalWorker>());
  CHECK(h.Get<e::SignalWorker>().local_rank == 1);
  CHECK(h.Get<e::SignalWorker>().signal == SIGKILL);
  CHECK(
      h.Said("worker rank 1 (local 1, pid 101) is blocked forming round "
             "0's process group"));
  CHECK(h.Said("cannot take round 1's world; restarting it in a new process"));
  h.Exit(1, 0, SIGKILL);
  CHECK(h.Reports().empty());  // no failure
  REQUIRE(h.Has<e::StartWorkers>());
  h.Started({1});
  // Past the round's first deadline (5s after its start) the new process
  // is still forming: not yet a hang.
  std::vector<ProgressSample> forming = Resilient({true, false}, 1);
  forming[1].round_left = 1;
  h.Advance(absl::Seconds(3));
  h.Progress(forming);
  CHECK_FALSE(h.Said("has not recovered"));
  CHECK_FALSE(h.Has<e::CollectEvidence>());
  // Its own --recovery_timeout after the restart, it is.
  h.Advance(absl::Seconds(3));
  h.Progress(forming);
  CHECK(h.Said("round 1 has not recovered within 5s"));
}

// Fails before: the replacement had not reached ctrun.resilient yet, so the
// node restarted every process and blamed it.
TEST_CASE(
    "A second failure while the replacement still starts keeps every live "
    "process",
    "[agent][unit]") {
  Harness h(InProcess(2));
  ReplaceRank5(h, Resilient({true, true}));
  // The new process is still importing: its slot does not say resilient.
  h.Progress(Resilient({true, false}));
  h.Message(Restart(2, "worker rank 6 failed"));
  CHECK(h.Said("the live workers keep their processes"));
  CHECK_FALSE(h.Said("does not run under ctrun.resilient"));
  CHECK(h.Signals().empty());
  h.AssignOnly(2, /*first=*/4, /*world=*/8);
  REQUIRE(h.Has<e::HandOver>());
  CHECK(h.Get<e::HandOver>().local_ranks == std::vector<int>{0, 1});
  CHECK_FALSE(h.Has<e::StartWorkers>());
}

TEST_CASE("A worker without ctrun.resilient makes its node restart the old way",
          "[agent][unit]") {
  Harness h(InProcess(2));
  h.Assign(0);
  h.Progress(Resilient({true, false}));
  h.Message(Restart(1, "node b was lost"));
  CHECK(h.Said("rank 5 does not run under ctrun.resilient"));
  CHECK(h.Said("restarting the workers (round 1"));
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
  CHECK(h.policy().phase() == Phase::kStopping);
}

TEST_CASE("Without --recovery=inprocess nothing is kept", "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Progress(Resilient({true, true}));
  h.Exit(1, 0, SIGKILL);
  CHECK_FALSE(h.Has<e::EndRound>());
  CHECK(h.Signals() == std::vector<int>{SIGTERM});
}

TEST_CASE("A hang under in-process recovery restarts the old way",
          "[agent][unit]") {
  Harness h(InProcess(2));
  h.Assign(0);
  h.Progress(Resilient({true, true}));
  v1::ServerMessage m = Restart(1, "rank 9 hung");
  m.mutable_restart_required()->set_collect_evidence(true);
  h.Message(m);
  CHECK_FALSE(h.Has<e::SendRejoin>());
  CHECK(h.policy().phase() == Phase::kCollecting);
}

// --- coordinated stops (--preemption_grace)
// -------------------------------------------------------------------

namespace stops {

// Two workers' samples: both call the stop check, with these heartbeats,
// and hold in it or not.
std::vector<ProgressSample> Checking(uint64_t beats0, uint64_t beats1,
                                     bool held) {
  std::vector<ProgressSample> samples(2);
  samples[0].beats = beats0;
  samples[1].beats = beats1;
  for (ProgressSample& s : samples) {
    s.stop_aware = true;
    s.held = held;
  }
  return samples;
}

v1::ServerMessage StopAt(int64_t round, bool decided, int64_t step = 0) {
  v1::ServerMessage m;
  m.mutable_stop_at()->set_round(round);
  m.mutable_stop_at()->set_reason("SIGTERM to ctrun on node-b");
  m.mutable_stop_at()->set_decided(decided);
  m.mutable_stop_at()->set_step(step);
  return m;
}

// The stop votes sent.
std::vector<v1::StopVote> Votes(const AgentEffects& effects) {
  std::vector<v1::StopVote> votes;
  for (const auto& effect : effects) {
    if (auto* s = std::get_if<e::Send>(&effect);
        s != nullptr && s->message.has_stop_vote()) {
      votes.push_back(s->message.stop_vote());
    }
  }
  return votes;
}

std::vector<e::StopState> Posted(const AgentEffects& effects) {
  std::vector<e::StopState> states;
  for (const auto& effect : effects) {
    if (auto* p = std::get_if<e::PostStop>(&effect)) {
      states.push_back(p->state);
    }
  }
  return states;
}

}  // namespace stops

TEST_CASE(
    "A preemption signal with workers calling the stop check asks the job "
    "for one step instead of stopping them",
    "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Progress(stops::Checking(10, 7, /*held=*/false));
  h.Signal(SIGTERM);
  CHECK(h.Signals().empty());
  CHECK(h.policy().phase() == Phase::kRunning);
  const auto votes = stops::Votes(h.effects());
  REQUIRE(votes.size() == 1);
  CHECK(votes[0].round() == 0);
  CHECK(votes[0].asked() == "SIGTERM to ctrun on node-a");
  CHECK(votes[0].hold_ms() == 12'500);  // half of the default 25 s grace
  CHECK(
      h.Said("received SIGTERM: the job stops at one step that every rank "
             "reaches (ctrun.should_stop()), within "
             "--preemption_grace=25s"));

  // Told to hold: the board says so and is read often until both hold.
  h.Message(stops::StopAt(0, /*decided=*/false));
  CHECK(stops::Posted(h.effects()) ==
        std::vector<e::StopState>{e::StopState::kHold});
  h.Advance(AgentPolicy::kHoldPollEvery);
  CHECK(h.Has<e::ReadProgress>());
  h.Progress(stops::Checking(10, 7, /*held=*/false));
  CHECK(stops::Votes(h.effects()).empty());
  h.Progress(stops::Checking(11, 7, /*held=*/true));
  const auto held = stops::Votes(h.effects());
  REQUIRE(held.size() == 1);
  CHECK(held[0].held());
  CHECK(held[0].step() == 11);
  h.Advance(absl::Milliseconds(50));
  CHECK_FALSE(h.Has<e::ReadProgress>());  // back to the usual pace

  // The step: posted; the workers end by themselves and the job finishes.
  h.Message(stops::StopAt(0, /*decided=*/true, 11));
  REQUIRE(h.Has<e::PostStop>());
  CHECK(h.Get<e::PostStop>().state == e::StopState::kAt);
  CHECK(h.Get<e::PostStop>().step == 11);
  CHECK(h.Said("the job stops at step 11 (SIGTERM to ctrun on node-b)"));
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Message(Finished());
  CHECK(h.ExitCode() == 0);
}

TEST_CASE(
    "A coordinated stop that does not end within the grace falls back to "
    "the signal, and so does the signal again",
    "[agent][unit]") {
  SECTION("the grace") {
    LaunchOptions o = Options();
    o.preemption_grace = absl::Seconds(4);
    Harness h(o);
    h.Assign(0);
    h.Progress(stops::Checking(3, 3, false));
    h.Signal(SIGTERM);
    REQUIRE(stops::Votes(h.effects()).size() == 1);
    CHECK(stops::Votes(h.effects())[0].hold_ms() == 2000);
    h.Advance(absl::Seconds(3));
    CHECK(h.Signals().empty());
    h.Advance(absl::Seconds(1));
    CHECK(
        h.Said("the job did not stop within --preemption_grace=4s: SIGTERM "
               "acts as without it"));
    // The board says so before the signal goes out.
    CHECK(stops::Posted(h.effects()) ==
          std::vector<e::StopState>{e::StopState::kFallback});
    CHECK(h.Signals() == std::vector<int>{SIGTERM});
    CHECK(h.policy().phase() == Phase::kStopping);
  }
  SECTION("the signal again") {
    Harness h;
    h.Assign(0);
    h.Progress(stops::Checking(3, 3, false));
    h.Signal(SIGUSR1);
    CHECK(h.Signals().empty());
    h.Signal(SIGUSR1);
    CHECK(h.Said("SIGUSR1 again: no waiting for the stop"));
    CHECK(stops::Posted(h.effects()) ==
          std::vector<e::StopState>{e::StopState::kFallback});
    CHECK(h.Signals() == std::vector<int>{SIGUSR1});  // forwarded, as always
    // A late step changes nothing.
    h.Message(stops::StopAt(0, /*decided=*/true, 5));
    CHECK_FALSE(h.Has<e::PostStop>());
  }
}

TEST_CASE(
    "Without workers that call the stop check, or with the grace off, a "
    "preemption signal acts at once",
    "[agent][unit]") {
  SECTION("no worker calls it") {
    Harness h;
    h.Assign(0);
    std::vector<ProgressSample> samples(2);
    samples[0].beats = 5;
    h.Progress(samples);
    h.Signal(SIGTERM);
    CHECK(stops::Votes(h.effects()).empty());
    CHECK_FALSE(h.Has<e::PostStop>());
    CHECK(h.Signals() == std::vector<int>{SIGTERM});
  }
  SECTION("--preemption_grace=off") {
    LaunchOptions o = Options();
    o.preemption_grace.reset();
    Harness h(o);
    h.Assign(0);
    h.Progress(stops::Checking(3, 3, false));
    h.Signal(SIGTERM);
    CHECK(stops::Votes(h.effects()).empty());
    // Their check holds nothing back: the board says "fall back" anyway.
    CHECK(h.Signals() == std::vector<int>{SIGTERM});
  }
  SECTION("SIGINT is never a preemption") {
    Harness h;
    h.Assign(0);
    h.Progress(stops::Checking(3, 3, false));
    h.Signal(SIGINT);
    CHECK(stops::Votes(h.effects()).empty());
    CHECK(h.Signals() == std::vector<int>{SIGINT});
  }
}

TEST_CASE(
    "A node told to hold with no worker left says so at once, and a stop "
    "of another round is ignored",
    "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Exit(0, 0);
  h.Exit(1, 0);
  h.Message(stops::StopAt(0, /*decided=*/false));
  auto votes = stops::Votes(h.effects());
  REQUIRE(votes.size() == 1);
  CHECK(votes[0].held());
  CHECK(votes[0].step() == -1);
  h.Message(stops::StopAt(3, /*decided=*/false));
  CHECK(stops::Votes(h.effects()).empty());
}

TEST_CASE(
    "A stop asked in a round that ended is asked again once the new "
    "round's workers call the check",
    "[agent][unit]") {
  Harness h;
  h.Assign(0);
  h.Progress(stops::Checking(3, 3, false));
  h.Signal(SIGUSR2);
  REQUIRE(stops::Votes(h.effects()).size() == 1);
  h.Message(stops::StopAt(0, /*decided=*/false));
  h.Message(Restart(1));
  h.Exit(0, 143);
  h.Exit(1, 143);
  h.Assign(1);
  // The last round's hold is not left on the board.
  CHECK(stops::Posted(h.effects()) ==
        std::vector<e::StopState>{e::StopState::kIdle});
  h.Progress(std::vector<ProgressSample>(2));
  CHECK(stops::Votes(h.effects()).empty());
  h.Progress(stops::Checking(0, 1, false));
  const auto votes = stops::Votes(h.effects());
  REQUIRE(votes.size() == 1);
  CHECK(votes[0].round() == 1);
  CHECK(votes[0].asked() == "SIGUSR2 to ctrun on node-a");
  h.Progress(stops::Checking(0, 1, false));
  CHECK(stops::Votes(h.effects()).empty());  // once
}

TEST_CASE(
    "A job that finishes after a stop on SIGUSR1 in Slurm is requeued by "
    "group rank 0's node only",
    "[agent][unit]") {
  struct Case {
    int group_rank;
    int signal;
    std::string slurm_job;
    bool requeued;
  };
  for (const Case& c :
       {Case{0, SIGUSR1, "42", true}, Case{1, SIGUSR1, "42", false},
        Case{0, SIGTERM, "42", false}, Case{0, SIGUSR1, "", false}}) {
    LaunchOptions o = Options();
    o.slurm_job_id = c.slurm_job;
    Harness h(o);
    v1::ServerMessage m;
    m.mutable_assignment()->set_group_rank(c.group_rank);
    m.mutable_assignment()->set_world_size(4);
    h.Message(m);
    h.Started({0, 1});
    v1::ServerMessage stop = stops::StopAt(0, /*decided=*/true, 9);
    stop.mutable_stop_at()->set_signal(c.signal);
    h.Message(stop);
    h.Exit(0, 0);
    h.Exit(1, 0);
    h.Message(Finished());
    INFO("group rank " << c.group_rank << ", signal " << c.signal);
    CHECK(h.Has<e::RequeueSlurmJob>() == c.requeued);
    if (c.requeued) CHECK(h.Get<e::RequeueSlurmJob>().job_id == "42");
    CHECK(h.ExitCode() == 0);
  }
}

// --- health gate
// -------------------------------------------------------------------

TEST_CASE(
    "With a health gate the first join waits for the check, and a failed "
    "check joins saying why",
    "[agent][unit]") {
  SECTION("healthy") {
    Harness h(Options(), false, /*health_gate=*/true);
    CHECK(h.Has<e::CheckHealth>());
    CHECK_FALSE(h.Has<e::OpenSession>());
    h.Advance(absl::Seconds(700));  // no join timeout runs before the join
    CHECK_FALSE(h.Has<e::Exit>());
    h.HealthChecked("");
    REQUIRE(h.Has<e::OpenSession>());
    CHECK(h.Get<e::OpenSession>().unhealthy.empty());
    CHECK_FALSE(h.Get<e::OpenSession>().resume_round.has_value());
  }
  SECTION("unhealthy") {
    Harness h(Options(), false, /*health_gate=*/true);
    h.HealthChecked("`check.sh` exited 1: disk full");
    CHECK(
        h.Said("this node failed its health check: `check.sh` exited 1: "
               "disk full; the rendezvous will not admit it (quarantined "
               "for --quarantine_seconds=600)"));
    REQUIRE(h.Has<e::OpenSession>());
    CHECK(h.Get<e::OpenSession>().unhealthy ==
          "`check.sh` exited 1: disk full");
    // The refusal ends the agent as any refusal does.
    h.SessionEnd(absl::FailedPreconditionError(
        "node a failed its health check: disk full; quarantined for 10m"));
    CHECK(h.Said("refused this node: node a failed its health check"));
    CHECK(h.ExitCode().has_value());
    CHECK(h.ExitCode() != 0);
  }
}

TEST_CASE(
    "With a health gate a rejoin waits for the check after the workers "
    "stopped",
    "[agent][unit]") {
  Harness h(Options(), false, /*health_gate=*/true);
  h.HealthChecked("");
  h.Assign(0);
  h.Message(Restart(1));
  h.Exit(0, 143);
  h.Exit(1, 143);
  CHECK(h.Has<e::CheckHealth>());
  CHECK_FALSE(h.Has<e::SendRejoin>());
  h.HealthChecked("GPU 1 has 5 uncorrected ECC errors since boot");
  REQUIRE(h.Has<e::SendRejoin>());
  CHECK(h.Get<e::SendRejoin>().round == 1);
  CHECK(h.Get<e::SendRejoin>().unhealthy ==
        "GPU 1 has 5 uncorrected ECC errors since boot");
  // A late answer changes nothing.
  h.HealthChecked("");
  CHECK(h.effects().empty());
}

}  // namespace
}  // namespace ctrun
