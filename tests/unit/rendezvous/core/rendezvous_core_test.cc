#include "rendezvous/core/rendezvous_core.h"

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rendezvous/core/coordinated_stop.h"
#include "rendezvous/core/failure_class.h"
#include "rendezvous/durable/journal.h"

namespace ctrun {
namespace {

using v1::RestartRequired;

// Drives a RendezvousCore with a fake clock and keeps what it said to each
// session.
class Harness {
 public:
  explicit Harness(int min_nodes = 2, int max_nodes = 2, int max_restarts = 1,
                   RendezvousLimits limits = {})
      : core_(limits) {
    settings_.set_min_nodes(min_nodes);
    settings_.set_max_nodes(max_nodes);
    settings_.set_max_restarts(max_restarts);
    settings_.set_join_timeout_ms(60'000);
    settings_.set_last_call_timeout_ms(10'000);
    settings_.set_heartbeat_timeout_ms(3'000);
  }

  v1::JobSettings& settings() { return settings_; }
  absl::Time now() const { return now_; }
  RendezvousCore& core() { return core_; }

  v1::Join MakeJoin(SessionId s, const std::string& host, int workers = 1,
                    int hint = -1) {
    v1::Join join;
    join.set_job_id("job");
    *join.mutable_settings() = settings_;
    join.mutable_node()->set_hostname(host);
    join.mutable_node()->set_pid(static_cast<int32_t>(1000 + s));
    join.mutable_node()->set_incarnation(0xC0FFEE00 + s);
    join.set_address("10.0.0." + std::to_string(s));
    join.set_local_world_size(workers);
    join.set_node_rank_hint(hint);
    join.set_master_port_candidate(static_cast<int32_t>(20000 + s));
    return join;
  }

  void Join(SessionId s, const std::string& host, int workers = 1,
            int hint = -1) {
    SendJoin(s, MakeJoin(s, host, workers, hint));
  }
  void SendJoin(SessionId s, const v1::Join& join) {
    joined_.insert(s);
    Send(s, [&](v1::AgentMessage& m) { *m.mutable_join() = join; });
  }
  // Session `s` resumes the node that session `as` joined as.
  void Resume(SessionId s, SessionId as, const std::string& host,
              int64_t round) {
    v1::Join join = MakeJoin(as, host);
    join.mutable_resume()->set_round(round);
    SendJoin(s, join);
  }
  void Rejoin(SessionId s, int64_t round) {
    Send(s, [&](v1::AgentMessage& m) {
      m.mutable_rejoin()->set_round(round);
      m.mutable_rejoin()->set_master_port_candidate(
          static_cast<int32_t>(30000 + s));
    });
  }
  // A failure: rank `rank` exits 7, of class `failure_class`, its attempt
  // having made progress or not.
  void Report(SessionId s, int64_t round, v1::WorkerReport::State state,
              v1::FailureClass failure_class = v1::OTHER, int rank = 3,
              bool no_progress = false) {
    Send(s, [&](v1::AgentMessage& m) {
      auto* r = m.mutable_worker_report();
      r->set_round(round);
      r->set_state(state);
      if (state == v1::WorkerReport::FAILED) {
        r->mutable_failure()->set_global_rank(rank);
        r->mutable_failure()->set_exit_code(7);
        r->mutable_failure()->set_failure_class(failure_class);
        r->mutable_failure()->set_no_progress(no_progress);
      }
    });
  }
  // RUNNING, with in-process recovery's figures.
  void ReportKept(SessionId s, int64_t round, int kept, double recovery_s) {
    Send(s, [&](v1::AgentMessage& m) {
      auto* r = m.mutable_worker_report();
      r->set_round(round);
      r->set_state(v1::WorkerReport::RUNNING);
      r->set_kept_workers(kept);
      r->set_recovery_s(recovery_s);
    });
  }
  void Heartbeat(SessionId s) {
    Send(s, [](v1::AgentMessage& m) { m.mutable_heartbeat(); });
  }
  // `waiting`: its stacks show it waiting in a collective.
  void ReportHang(SessionId s, int64_t round, int rank, bool waiting = false) {
    Send(s, [&](v1::AgentMessage& m) {
      auto* r = m.mutable_worker_report();
      r->set_round(round);
      r->set_state(v1::WorkerReport::FAILED);
      r->mutable_failure()->set_global_rank(rank);
      r->mutable_failure()->set_hung(true);
      r->mutable_failure()->set_waiting(waiting);
      r->mutable_failure()->set_message("no progress for 2s");
    });
  }
  void ReportProgress(SessionId s, const v1::ProgressReport& report) {
    Send(s,
         [&](v1::AgentMessage& m) { *m.mutable_progress_report() = report; });
  }
  // A stop vote: asked by a signal (`asked` non-empty), or held at `step`.
  void AskStop(SessionId s, int64_t round, const std::string& asked,
               int64_t hold_ms = 5000) {
    Send(s, [&](v1::AgentMessage& m) {
      m.mutable_stop_vote()->set_round(round);
      m.mutable_stop_vote()->set_asked(asked);
      m.mutable_stop_vote()->set_hold_ms(hold_ms);
    });
  }
  void Held(SessionId s, int64_t round, int64_t step) {
    Send(s, [&](v1::AgentMessage& m) {
      m.mutable_stop_vote()->set_round(round);
      m.mutable_stop_vote()->set_held(true);
      m.mutable_stop_vote()->set_step(step);
    });
  }
  void Close(SessionId s) {
    joined_.erase(s);
    Effects fx;
    core_.OnSessionClosed(s, now_, &fx);
    Absorb(fx);
  }
  // Moves the clock in steps of at most 500 ms; every joined session that is
  // not silenced heartbeats at each step, like a healthy agent.
  void Advance(absl::Duration d) {
    const absl::Time end = now_ + d;
    while (now_ < end) {
      now_ = std::min(end, now_ + absl::Milliseconds(500));
      for (SessionId s : joined_) {
        if (!silent_.contains(s) && !ended_.contains(s)) Heartbeat(s);
      }
      Effects fx;
      core_.Tick(now_, &fx);
      Absorb(fx);
    }
  }
  void Silence(SessionId s) { silent_.insert(s); }
  // The service is stopped for `d`: time passes with no tick and no
  // message, then one tick.
  void Pause(absl::Duration d) {
    now_ += d;
    Effects fx;
    core_.Tick(now_, &fx);
    Absorb(fx);
  }

  // The latest message of a kind sent to `s`, if any since the last Clear.
  std::optional<v1::Assignment> LastAssignment(SessionId s) const {
    return Last<v1::Assignment>(s, [](const v1::ServerMessage& m) {
      return m.has_assignment() ? std::optional(m.assignment()) : std::nullopt;
    });
  }
  std::optional<v1::RestartRequired> LastRestart(SessionId s) const {
    return Last<v1::RestartRequired>(s, [](const v1::ServerMessage& m) {
      return m.has_restart_required() ? std::optional(m.restart_required())
                                      : std::nullopt;
    });
  }
  std::optional<v1::JobFailed> LastFailed(SessionId s) const {
    return Last<v1::JobFailed>(s, [](const v1::ServerMessage& m) {
      return m.has_job_failed() ? std::optional(m.job_failed()) : std::nullopt;
    });
  }
  std::optional<v1::Progress> LastProgress(SessionId s) const {
    return Last<v1::Progress>(s, [](const v1::ServerMessage& m) {
      return m.has_progress() ? std::optional(m.progress()) : std::nullopt;
    });
  }
  std::optional<v1::Resumed> LastResumed(SessionId s) const {
    return Last<v1::Resumed>(s, [](const v1::ServerMessage& m) {
      return m.has_resumed() ? std::optional(m.resumed()) : std::nullopt;
    });
  }
  std::optional<v1::Learned> LastLearned(SessionId s) const {
    return Last<v1::Learned>(s, [](const v1::ServerMessage& m) {
      return m.has_learned() ? std::optional(m.learned()) : std::nullopt;
    });
  }
  std::optional<v1::Straggler> LastStraggler(SessionId s) const {
    return Last<v1::Straggler>(s, [](const v1::ServerMessage& m) {
      return m.has_straggler() ? std::optional(m.straggler()) : std::nullopt;
    });
  }
  std::vector<v1::StopAt> StopsSent(SessionId s) const {
    std::vector<v1::StopAt> stops;
    for (const auto& m : sent_.at_or(s)) {
      if (m.has_stop_at()) stops.push_back(m.stop_at());
    }
    return stops;
  }
  // Every event so far, in order.
  const std::vector<v1::Event>& events() const { return events_; }
  // Jobs named changed since the last Clear.
  const std::set<std::string>& changed() const { return changed_; }
  bool Finished(SessionId s) const {
    return std::any_of(sent_.at_or(s).begin(), sent_.at_or(s).end(),
                       [](const auto& m) { return m.has_job_finished(); });
  }
  std::optional<absl::Status> Ended(SessionId s) const {
    auto it = ended_.find(s);
    if (it == ended_.end()) return std::nullopt;
    return it->second;
  }
  void Clear() {
    sent_.map.clear();
    changed_.clear();
  }

 private:
  struct Log {
    std::map<SessionId, std::vector<v1::ServerMessage>> map;
    const std::vector<v1::ServerMessage>& at_or(SessionId s) const {
      static const std::vector<v1::ServerMessage> kNone;
      auto it = map.find(s);
      return it == map.end() ? kNone : it->second;
    }
  };

  template <typename T, typename F>
  std::optional<T> Last(SessionId s, F pick) const {
    std::optional<T> last;
    for (const auto& m : sent_.at_or(s)) {
      if (auto v = pick(m)) last = v;
    }
    return last;
  }

  template <typename F>
  void Send(SessionId s, F fill) {
    v1::AgentMessage m;
    fill(m);
    Effects fx;
    core_.OnMessage(s, m, now_, &fx);
    Absorb(fx);
  }

  void Absorb(Effects& fx) {
    for (auto& [s, m] : fx.messages) sent_.map[s].push_back(std::move(m));
    for (auto& [s, status] : fx.finishes) ended_[s] = status;
    for (auto& f : fx.fired) f.callback(std::move(f.result));
    changed_.insert(fx.changed_jobs.begin(), fx.changed_jobs.end());
    for (auto& e : fx.events) events_.push_back(std::move(e));
  }

  v1::JobSettings settings_;
  RendezvousCore core_;
  absl::Time now_ = absl::UnixEpoch() + absl::Hours(100);
  Log sent_;
  std::map<SessionId, absl::Status> ended_;
  std::set<SessionId> joined_;
  std::set<SessionId> silent_;
  std::set<std::string> changed_;
  std::vector<v1::Event> events_;
};

TEST_CASE("Round closes at max nodes without waiting for last call",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  CHECK_FALSE(h.LastAssignment(1));
  h.Join(2, "b");
  auto a1 = h.LastAssignment(1);
  auto a2 = h.LastAssignment(2);
  REQUIRE(a1);
  REQUIRE(a2);
  CHECK(a1->round() == 0);
  CHECK(a1->group_world_size() == 2);
  CHECK(a1->world_size() == 2);
  CHECK(a1->job_id() == "job");
}

TEST_CASE("Round below max closes when the last call window passes",
          "[rendezvous][unit]") {
  Harness h(2, 4);
  h.Join(1, "a");
  h.Join(2, "b");
  CHECK_FALSE(h.LastAssignment(1));
  CHECK(h.core().NextDeadline() <= h.now() + absl::Seconds(10));
  h.Advance(absl::Seconds(9));
  CHECK_FALSE(h.LastAssignment(1));
  h.Advance(absl::Seconds(1));
  REQUIRE(h.LastAssignment(1));
  CHECK(h.LastAssignment(1)->world_size() == 2);
}

TEST_CASE("Each join after min extends the last call", "[rendezvous][unit]") {
  Harness h(2, 4);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Advance(absl::Seconds(8));
  h.Join(3, "c");
  h.Advance(absl::Seconds(8));
  CHECK_FALSE(h.LastAssignment(1));
  h.Advance(absl::Seconds(2));
  REQUIRE(h.LastAssignment(3));
  CHECK(h.LastAssignment(3)->group_world_size() == 3);
}

TEST_CASE("Join timeout below min fails the job naming who is missing",
          "[rendezvous][unit]") {
  Harness h(3, 3);
  h.Join(1, "a", 1, 0);
  h.Join(2, "b", 1, 2);
  h.Advance(absl::Seconds(59));
  CHECK_FALSE(h.LastFailed(1));
  h.Advance(absl::Seconds(1));
  auto failed = h.LastFailed(1);
  REQUIRE(failed);
  CHECK(failed->reason().find("2 of at least 3 nodes") != std::string::npos);
  CHECK(failed->reason().find("a:1001") != std::string::npos);
  CHECK(failed->reason().find("missing node ranks: [1]") != std::string::npos);
  REQUIRE(h.LastFailed(2));
}

TEST_CASE("Jobs waiting below min on one service learn of each other",
          "[rendezvous][unit]") {
  Harness h;  // two nodes needed
  h.Join(1, "a");
  v1::Join typo = h.MakeJoin(2, "b");
  typo.set_job_id("jbo");
  h.SendJoin(2, typo);
  h.Advance(absl::Seconds(2));
  auto p1 = h.LastProgress(1);
  REQUIRE(p1);
  REQUIRE(p1->other_waiting_jobs_size() == 1);
  CHECK(p1->other_waiting_jobs(0).job_id() == "jbo");
  CHECK(p1->other_waiting_jobs(0).joined() == 1);
  CHECK(p1->other_waiting_jobs(0).min_nodes() == 2);
  auto p2 = h.LastProgress(2);
  REQUIRE(p2);
  REQUIRE(p2->other_waiting_jobs_size() == 1);
  CHECK(p2->other_waiting_jobs(0).job_id() == "job");
  // Once a job has its nodes, it is no longer named to the other.
  h.Join(3, "c");
  REQUIRE(h.LastAssignment(1));
  h.Clear();
  h.Advance(absl::Seconds(2));
  auto later = h.LastProgress(2);
  REQUIRE(later);
  CHECK(later->other_waiting_jobs_size() == 0);
}

TEST_CASE(
    "A round of many nodes is told how it stands less often than a small one",
    "[rendezvous][unit]") {
  // Nodes keep coming, one every 100 ms, for 6 s: every change would be
  // told at once if it could. Returns how often node 1 was told.
  auto told = [&](int already, int messages_per_second) {
    RendezvousLimits limits;
    limits.progress_messages_per_second = messages_per_second;
    Harness h(1000, 1000, 1, limits);
    SessionId next = 1;
    for (; next <= already; ++next) h.Join(next, absl::StrCat("n", next));
    h.Advance(absl::Seconds(1));
    h.Clear();
    int times = 0;
    for (int i = 0; i < 60; ++i, ++next) {
      h.Join(next, absl::StrCat("n", next));
      h.Advance(absl::Milliseconds(100));
      if (h.LastProgress(1)) ++times;
      h.Clear();
    }
    return times;
  };
  // Within the rate, once a second (progress_interval).
  CHECK(told(2, 1000) == 6);
  // 40 to 100 nodes at 10 messages a second: 4 s apart, then 10.
  CHECK(told(40, 10) == 1);
  // 20 to 80: 2 s apart, then about 4.
  const int between = told(20, 10);
  CHECK(between >= 2);
  CHECK(between <= 3);
}

TEST_CASE("Group ranks follow hints then hostnames", "[rendezvous][unit]") {
  Harness h(4, 4);
  h.Join(1, "zeta");
  h.Join(2, "alpha");
  h.Join(3, "mid", 1, 1);
  h.Join(4, "last", 1, 0);
  CHECK(h.LastAssignment(4)->group_rank() == 0);
  CHECK(h.LastAssignment(3)->group_rank() == 1);
  CHECK(h.LastAssignment(2)->group_rank() == 2);
  CHECK(h.LastAssignment(1)->group_rank() == 3);
}

TEST_CASE("Global ranks are prefix sums of heterogeneous local world sizes",
          "[rendezvous][unit]") {
  Harness h(3, 3);
  h.Join(1, "a", 4);
  h.Join(2, "b", 1);
  h.Join(3, "c", 3);
  CHECK(h.LastAssignment(1)->first_global_rank() == 0);
  CHECK(h.LastAssignment(2)->first_global_rank() == 4);
  CHECK(h.LastAssignment(3)->first_global_rank() == 5);
  CHECK(h.LastAssignment(3)->world_size() == 8);
}

TEST_CASE("Master address and port come from group rank 0",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "b");
  h.Join(2, "a");
  auto a = h.LastAssignment(1);
  CHECK(a->master_addr() == "10.0.0.2");
  CHECK(a->master_port() == 20002);
}

TEST_CASE("A fixed master port overrides the candidates",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.settings().set_master_port(29500);
  h.Join(1, "a");
  CHECK(h.LastAssignment(1)->master_port() == 29500);
}

TEST_CASE("A closed session during the round loses its node at once",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Close(2);
  auto restart = h.LastRestart(1);
  REQUIRE(restart);
  CHECK(restart->reason() == RestartRequired::NODE_LOST);
  CHECK(restart->round() == 1);
  CHECK(restart->detail().find("b:1002") != std::string::npos);
  CHECK(restart->restart_count() == 0);
}

// Fails before: nodes of one machine (agents on 127.0.0.2 and 127.0.0.3)
// were all "vm:PID" in messages.
TEST_CASE("A node that gives a name is named by it, its hostname kept",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "vm");
  v1::Join join = h.MakeJoin(2, "vm");
  join.mutable_node()->set_name("127.0.0.3");
  h.SendJoin(2, join);
  h.Close(2);
  auto restart = h.LastRestart(1);
  REQUIRE(restart);
  CHECK(restart->detail().find("node 127.0.0.3:1002 was lost") !=
        std::string::npos);
  // A name longer than a hostname may be is refused, as such a hostname is.
  Harness g(1, 1);
  v1::Join long_name = g.MakeJoin(1, "vm");
  long_name.mutable_node()->set_name(std::string(256, 'n'));
  g.SendJoin(1, long_name);
  CHECK_FALSE(g.LastAssignment(1));
}

TEST_CASE("A node without heartbeats is lost after the heartbeat timeout",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  REQUIRE(h.LastAssignment(1));
  h.Silence(2);
  h.Advance(absl::Milliseconds(2500));
  CHECK_FALSE(h.Ended(2));
  // Node 2 has been silent for 3.5 s > 3 s.
  h.Advance(absl::Seconds(1));
  REQUIRE(h.Ended(2));
  CHECK(absl::IsAborted(*h.Ended(2)));
  CHECK(h.Ended(2)->message().find("without a heartbeat") != std::string::npos);
  CHECK_FALSE(h.Ended(1));
  REQUIRE(h.LastRestart(1));
  CHECK(h.LastRestart(1)->reason() == RestartRequired::NODE_LOST);
}

TEST_CASE("Silence while the service itself was stopped loses no node",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  REQUIRE(h.LastAssignment(1));
  h.Silence(2);
  h.Advance(absl::Seconds(1));
  // Stopped for a minute (Ctrl-Z on the agent that hosts it): nobody's
  // heartbeat could be heard, so nobody is lost for it.
  h.Pause(absl::Minutes(1));
  CHECK_FALSE(h.Ended(1));
  CHECK_FALSE(h.Ended(2));
  // Node 2 stays silent: 1 s before the pause and 2.5 s after it are still
  // within its 3 s; another second is not.
  h.Advance(absl::Milliseconds(1500));
  CHECK_FALSE(h.Ended(2));
  h.Advance(absl::Seconds(1));
  REQUIRE(h.Ended(2));
  CHECK(absl::IsAborted(*h.Ended(2)));
  CHECK_FALSE(h.Ended(1));
}

TEST_CASE("Ticks a little late are no pause: the timeout holds",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Silence(2);
  h.Pause(RendezvousCore::kPausedAfter);
  CHECK(h.Ended(2));
}

TEST_CASE("Heartbeats keep a node alive past the timeout",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  h.Advance(absl::Seconds(20));
  CHECK_FALSE(h.Ended(1));
}

TEST_CASE("A restart round closes as soon as every survivor rejoined",
          "[rendezvous][unit]") {
  Harness h(1, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  h.Close(3);
  h.Rejoin(1, 1);
  CHECK_FALSE(h.LastAssignment(1)->round() == 1);
  h.Rejoin(2, 1);
  auto a = h.LastAssignment(1);
  REQUIRE(a->round() == 1);
  CHECK(a->world_size() == 2);
}

TEST_CASE("Survivors keep their relative order in the next round",
          "[rendezvous][unit]") {
  Harness h(1, 3);
  h.Join(1, "c", 1, -1);
  h.Join(2, "b");
  h.Join(3, "a");
  // Ranks: a=0, b=1, c=2. Lose a; b and c keep their order.
  h.Close(3);
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  CHECK(h.LastAssignment(2)->group_rank() == 0);
  CHECK(h.LastAssignment(1)->group_rank() == 1);
}

TEST_CASE("A worker failure spends one restart and restarts every node",
          "[rendezvous][unit]") {
  Harness h(2, 2, 1);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  for (SessionId s : {1, 2}) {
    auto r = h.LastRestart(s);
    REQUIRE(r);
    CHECK(r->reason() == RestartRequired::WORKER_FAILED);
    CHECK(r->restart_count() == 1);
    CHECK(r->detail().find("exited with code 7") != std::string::npos);
  }
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  CHECK(h.LastAssignment(1)->restart_count() == 1);
}

TEST_CASE(
    "Events tell a job's life in order: joins, rounds with their reasons, "
    "the failure, the loss and the end",
    "[rendezvous][unit]") {
  Harness h(1, 2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Advance(absl::Seconds(1));
  h.Report(1, 0, v1::WorkerReport::FAILED);  // rank 3 exits 7
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  h.Close(2);  // b's agent dies while its workers run
  h.Rejoin(1, 2);
  h.Report(1, 2, v1::WorkerReport::SUCCEEDED);

  std::vector<std::string> seen;
  for (const v1::Event& e : h.events()) {
    CHECK(e.job() == "job");
    seen.push_back(absl::StrCat(
        e.event(), "@", e.round(),
        e.has_reason() && e.event() == "round_opened" ? ":" + e.reason() : ""));
  }
  CHECK(seen == std::vector<std::string>{
                    "round_opened@0:first", "node_joined@0", "node_joined@0",
                    "round_closed@0", "worker_failed@0",
                    "round_opened@1:worker_failed", "round_closed@1",
                    "node_lost@1", "round_opened@2:node_lost", "round_closed@2",
                    "job_finished@2"});
  const auto& e = h.events();
  CHECK(e[1].node() == "a:1001");
  CHECK(e[3].nodes() == 2);
  CHECK(e[3].world_size() == 2);
  CHECK(e[3].master() == "10.0.0.1:20001");
  CHECK(e[3].duration_s() == 0.0);  // max_nodes closed it at once
  CHECK(e[4].rank() == 3);
  CHECK(e[4].exit_code() == 7);
  CHECK_FALSE(e[4].has_signal());
  CHECK(e[5].restart_count() == 1);
  CHECK(e[5].max_restarts() == 2);
  CHECK(e[7].node() == "b:1002");
  CHECK(e[7].reason() == "its session closed");
  CHECK(e[8].restart_count() == 1);  // a loss spends no restart
  CHECK(e[10].duration_s() == 1.0);
}

TEST_CASE("A failure with no restart left fails the job",
          "[rendezvous][unit]") {
  Harness h(2, 2, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(2, 0, v1::WorkerReport::FAILED);
  // It waits the settle time for a node loss that would explain it.
  CHECK_FALSE(h.LastFailed(1));
  h.Advance(absl::Milliseconds(1500));
  auto f = h.LastFailed(1);
  REQUIRE(f);
  CHECK(f->reason().find("no restarts left") != std::string::npos);
  CHECK(h.core().DescribeJob("job", h.now())->phase() == v1::JobStatus::FAILED);
}

TEST_CASE(
    "A failure of a class the job does not restart for fails it at once, "
    "with restarts left",
    "[rendezvous][unit]") {
  {
    // One node: at once.
    Harness h(1, 1, 3);
    h.Join(1, "a");
    h.Report(1, 0, v1::WorkerReport::FAILED, v1::USER_ERROR);
    auto f = h.LastFailed(1);
    REQUIRE(f);
    CHECK_FALSE(h.LastRestart(1));
    CHECK(f->reason() ==
          "worker rank 3 (local 0) on a:1001 exited with code 7; not "
          "restarted: a user error (--restart_on=default)");
    CHECK(f->root_cause().failure_class() == v1::USER_ERROR);
    CHECK(h.events().back().event() == "job_failed");
    bool classed = false;
    for (const v1::Event& e : h.events()) {
      if (e.event() == "worker_failed") {
        classed = e.failure_class() == "user_error";
      }
    }
    CHECK(classed);
  }
  {
    // Two nodes: after the settle time, as for no restarts left.
    Harness h(2, 2, 3);
    h.Join(1, "a");
    h.Join(2, "b");
    h.Report(2, 0, v1::WorkerReport::FAILED, v1::USER_ERROR);
    CHECK_FALSE(h.LastFailed(1));
    h.Advance(absl::Milliseconds(1500));
    REQUIRE(h.LastFailed(1));
    CHECK_FALSE(h.LastRestart(1));
    CHECK(h.LastFailed(2)->root_cause().failure_class() == v1::USER_ERROR);
  }
  // Every other class, and an agent that names none, restarts by default.
  for (v1::FailureClass c :
       {v1::FAILURE_CLASS_UNSPECIFIED, v1::OUT_OF_MEMORY, v1::HARDWARE,
        v1::NETWORK, v1::HANG, v1::SIGNAL, v1::OTHER}) {
    Harness h(1, 1, 3);
    h.Join(1, "a");
    h.Report(1, 0, v1::WorkerReport::FAILED, c);
    CAPTURE(v1::FailureClass_Name(c));
    CHECK(h.LastRestart(1));
    CHECK_FALSE(h.LastFailed(1));
  }
  // --restart_on=all restarts a user error; --restart_on=network does not
  // restart running out of memory.
  Harness all(1, 1, 3);
  all.settings().set_restart_on(RestartOnAll());
  all.Join(1, "a");
  all.Report(1, 0, v1::WorkerReport::FAILED, v1::USER_ERROR);
  CHECK(all.LastRestart(1));
  Harness network(1, 1, 3);
  network.settings().set_restart_on(*ParseRestartOn("network"));
  network.Join(1, "a");
  network.Report(1, 0, v1::WorkerReport::FAILED, v1::OUT_OF_MEMORY);
  REQUIRE(network.LastFailed(1));
  CHECK(network.LastFailed(1)->reason().find(
            "not restarted: out of memory (--restart_on=network)") !=
        std::string::npos);
}

TEST_CASE(
    "A communication failure gives way, as root cause, to a failure of "
    "another class reported within the settle time",
    "[rendezvous][unit]") {
  Harness h(2, 2, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(2, 0, v1::WorkerReport::FAILED, v1::NETWORK);  // peer gone
  h.Report(1, 0, v1::WorkerReport::FAILED, v1::OTHER, /*rank=*/0);
  h.Advance(absl::Milliseconds(1500));
  for (SessionId s : {1, 2}) {
    auto failed = h.LastFailed(s);
    REQUIRE(failed);
    CHECK(failed->root_cause().global_rank() == 0);
    CHECK(failed->root_cause_node() == "a:1001");
  }
}

TEST_CASE(
    "Three failures in a row of attempts without progress fail the job, "
    "restarts left or not, and one with progress starts the count again",
    "[rendezvous][unit]") {
  Harness h(1, 1, 10);
  h.Join(1, "a");
  int64_t round = 0;
  auto fail = [&](bool no_progress) {
    h.Report(1, round, v1::WorkerReport::FAILED, v1::OTHER, 3, no_progress);
    if (h.LastFailed(1)) return;
    h.Rejoin(1, ++round);
  };
  fail(true);
  fail(true);
  fail(false);  // this attempt stepped
  fail(true);
  fail(true);
  CHECK_FALSE(h.LastFailed(1));
  CHECK(round == 5);
  fail(true);
  auto failed = h.LastFailed(1);
  REQUIRE(failed);
  CHECK(failed->no_progress());
  CHECK(failed->reason() ==
        "worker rank 3 (local 0) on a:1001 exited with code 7; no progress "
        "in 3 attempts in a row, so not restarted (5 of max_restarts=10 "
        "left)");
  // A job whose failures all made progress spends its restarts as before.
  Harness stepping(1, 1, 1);
  stepping.Join(1, "a");
  stepping.Report(1, 0, v1::WorkerReport::FAILED);
  stepping.Rejoin(1, 1);
  stepping.Report(1, 1, v1::WorkerReport::FAILED);
  REQUIRE(stepping.LastFailed(1));
  CHECK_FALSE(stepping.LastFailed(1)->no_progress());
}

TEST_CASE("A failed job names its root cause to every node",
          "[rendezvous][unit]") {
  Harness h(2, 2, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(2, 0, v1::WorkerReport::FAILED);  // rank 3, exit code 7
  h.Advance(absl::Seconds(2));               // no loss explains it
  for (SessionId s : {1, 2}) {
    auto failed = h.LastFailed(s);
    REQUIRE(failed);
    REQUIRE(failed->has_root_cause());
    CHECK(failed->root_cause().global_rank() == 3);
    CHECK(failed->root_cause().exit_code() == 7);
    CHECK(failed->root_cause_node() == "b:1002");
  }
  // A job that fails for no worker (the join timeout) names none.
  Harness timeout(2, 2, 0);
  timeout.Join(1, "a");
  timeout.Advance(absl::Seconds(61));
  REQUIRE(timeout.LastFailed(1));
  CHECK_FALSE(timeout.LastFailed(1)->has_root_cause());
}

TEST_CASE(
    "A hang of a rank waiting in a collective gives way, as root cause, to "
    "the hung rank outside any that reports within the settle time",
    "[rendezvous][unit]") {
  Harness h(2, 2, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.ReportHang(1, 0, 0, /*waiting=*/true);
  // The node that holds the rank they wait for reads its stacks first.
  h.Advance(absl::Seconds(5));
  CHECK_FALSE(h.LastFailed(1));
  h.ReportHang(2, 0, 2);
  h.ReportHang(1, 0, 1, /*waiting=*/true);  // a waiting one never takes it
  h.Advance(absl::Milliseconds(1400));
  CHECK_FALSE(h.LastFailed(1));
  h.Advance(absl::Milliseconds(100));
  for (SessionId s : {1, 2}) {
    auto failed = h.LastFailed(s);
    REQUIRE(failed);
    CHECK(failed->root_cause().global_rank() == 2);
    CHECK(failed->root_cause_node() == "b:1002");
    CHECK(failed->reason().find("b:1002") != std::string::npos);
  }
  // A rank that is not known to wait keeps its place.
  Harness first(2, 2, 0);
  first.Join(1, "a");
  first.Join(2, "b");
  first.ReportHang(1, 0, 0);
  first.ReportHang(2, 0, 2);
  first.Advance(absl::Seconds(2));
  REQUIRE(first.LastFailed(2));
  CHECK(first.LastFailed(2)->root_cause().global_rank() == 0);
  // A waiting rank alone fails the job once the longer wait is over.
  Harness alone(2, 2, 0);
  alone.Join(1, "a");
  alone.Join(2, "b");
  alone.ReportHang(1, 0, 0, /*waiting=*/true);
  alone.Advance(absl::Milliseconds(9900));
  CHECK_FALSE(alone.LastFailed(1));
  alone.Advance(absl::Milliseconds(100));
  REQUIRE(alone.LastFailed(1));
  CHECK(alone.LastFailed(1)->root_cause().global_rank() == 0);
}

TEST_CASE("With one node a failure with no restart left fails at once",
          "[rendezvous][unit]") {
  Harness h(1, 1, 0);
  h.Join(1, "a");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  REQUIRE(h.LastFailed(1));
}

TEST_CASE("A failure followed by a node loss is the loss and fails nothing",
          "[rendezvous][unit]") {
  Harness h(1, 3, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  // c's agent dies; its peers' workers fail before its session's end is
  // seen.
  h.Report(1, 0, v1::WorkerReport::FAILED);
  h.Advance(absl::Milliseconds(200));
  h.Close(3);
  auto r = h.LastRestart(1);
  REQUIRE(r);
  CHECK(r->reason() == RestartRequired::NODE_LOST);
  h.Advance(absl::Seconds(3));
  CHECK_FALSE(h.LastFailed(1));
}

TEST_CASE("A node loss right after a failure gives its restart back",
          "[rendezvous][unit]") {
  Harness h(1, 3, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  REQUIRE(h.LastRestart(1)->restart_count() == 1);
  h.Close(3);  // c, told to rejoin, turns out to be gone
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  auto a = h.LastAssignment(1);
  REQUIRE(a);
  CHECK(a->round() == 1);
  CHECK(a->restart_count() == 0);
  // Its agents are told why, once.
  CHECK(a->restart_refunded().find("round 0 was given back: node c:") !=
        std::string::npos);
  h.Report(1, 1, v1::WorkerReport::FAILED);
  h.Advance(absl::Seconds(2));
  h.Rejoin(1, 2);
  h.Rejoin(2, 2);
  REQUIRE(h.LastAssignment(1)->round() == 2);
  CHECK(h.LastAssignment(1)->restart_refunded().empty());
}

TEST_CASE("A node loss long after a failure keeps the restart spent",
          "[rendezvous][unit]") {
  Harness h(1, 3, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  h.Advance(absl::Seconds(2));
  h.Close(3);
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  CHECK(h.LastAssignment(1)->restart_count() == 1);
  CHECK(h.LastAssignment(1)->restart_refunded().empty());
}

TEST_CASE("A lost node spends no restart", "[rendezvous][unit]") {
  Harness h(1, 2, 0);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Close(2);
  h.Rejoin(1, 1);
  auto a = h.LastAssignment(1);
  CHECK(a->round() == 1);
  CHECK(a->restart_count() == 0);
}

TEST_CASE("All nodes succeeding finishes the job", "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  CHECK_FALSE(h.Finished(1));
  h.Report(2, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(h.Finished(1));
  CHECK(h.Finished(2));
  // The job is kept until the last session ends, then forgotten.
  h.Close(1);
  CHECK(h.core().num_jobs() == 1);
  h.Close(2);
  CHECK(h.core().num_jobs() == 0);
}

TEST_CASE("A succeeded node that leaves does not undo its success",
          "[rendezvous][unit]") {
  Harness h(2, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  h.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  // a's agent is killed (or stopped, or told to stop) after its workers
  // succeeded, while b and c still run.
  h.Close(1);
  CHECK_FALSE(h.LastRestart(2));
  auto status = h.core().DescribeJob("job", h.now());
  REQUIRE(status.ok());
  REQUIRE(status->lost_nodes_size() == 1);
  CHECK(status->lost_nodes(0).find("after its workers succeeded") !=
        std::string::npos);
  h.Report(2, 0, v1::WorkerReport::SUCCEEDED);
  CHECK_FALSE(h.Finished(2));
  h.Report(3, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(h.Finished(2));
  CHECK(h.Finished(3));
}

TEST_CASE("A silent succeeded node is lost without undoing its success",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  h.Silence(1);  // SIGSTOP of a's agent
  h.Advance(absl::Seconds(4));
  CHECK(h.Ended(1));
  CHECK_FALSE(h.LastRestart(2));
  h.Report(2, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(h.Finished(2));
}

TEST_CASE("A join while the job runs below max opens the next round",
          "[rendezvous][unit]") {
  Harness h(1, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Advance(absl::Seconds(10));
  REQUIRE(h.LastAssignment(1)->world_size() == 2);
  h.Join(3, "c");
  auto r = h.LastRestart(1);
  REQUIRE(r);
  CHECK(r->reason() == RestartRequired::NODE_WAITING);
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  auto a = h.LastAssignment(3);
  REQUIRE(a);
  CHECK(a->round() == 1);
  CHECK(a->world_size() == 3);
  CHECK(a->group_rank() == 2);  // newcomers after survivors
}

TEST_CASE("A join while the job runs at max waits for a free slot",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  CHECK_FALSE(h.LastRestart(1));
  REQUIRE(h.LastProgress(3));
  CHECK(h.LastProgress(3)->waiting_for_slot());
  h.Close(2);
  h.Rejoin(1, 1);
  auto a = h.LastAssignment(3);
  REQUIRE(a);
  CHECK(a->world_size() == 2);
}

TEST_CASE("A join to a full job of fixed size is refused at once",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "first");
  REQUIRE(h.LastAssignment(1));
  h.Join(2, "second");  // the same id started twice
  REQUIRE(h.Ended(2));
  CHECK(absl::IsResourceExhausted(*h.Ended(2)));
  CHECK(h.Ended(2)->message() ==
        "job 'job' is full: its 1 node runs (--nnodes=1) and keeps no spare "
        "nodes; give this run its own --rdzv_id, or the job --spares=K or "
        "--nnodes=MIN:MAX");
  CHECK_FALSE(h.LastRestart(1));
  CHECK_FALSE(h.Ended(1));
  // While the job collects, a node of a fixed-size job is still welcome.
  Harness collecting(2, 2);
  collecting.Join(1, "a");
  collecting.Join(2, "b");
  collecting.Close(2);
  collecting.Join(3, "replacement");
  CHECK_FALSE(collecting.Ended(3));
}

// A job of `active` nodes "a0".."a{n-1}" (sessions 1..n) at round 0,
// with `spares` spares allowed.
static void StartFixedJob(Harness& h, int active) {
  for (int i = 0; i < active; ++i) {
    h.Join(static_cast<SessionId>(i + 1), absl::StrCat("a", i));
  }
  REQUIRE(h.LastAssignment(1));
}

static const v1::NodeStatus* FindNode(const v1::JobStatus& s,
                                      const std::string& host) {
  for (const auto& n : s.nodes()) {
    if (n.node().hostname() == host) return &n;
  }
  return nullptr;
}

TEST_CASE("A spare waits without a rank and takes a lost node's slot",
          "[rendezvous][unit][spares]") {
  Harness h(3, 3);
  h.settings().set_spares(1);
  StartFixedJob(h, 3);
  for (SessionId s : {1, 2, 3}) CHECK(h.LastAssignment(s)->world_size() == 3);
  h.Join(9, "spare");
  REQUIRE_FALSE(h.Ended(9));
  CHECK_FALSE(h.LastRestart(1));  // a spare changes nothing for the job
  REQUIRE(h.LastProgress(9));
  CHECK(h.LastProgress(9)->waiting_for_slot());
  CHECK(h.LastProgress(9)->spare());
  {
    auto status = h.core().DescribeJob("job", h.now());
    REQUIRE(status.ok());
    const v1::NodeStatus* spare = FindNode(*status, "spare");
    REQUIRE(spare);
    CHECK(spare->spare());
    CHECK(spare->group_rank() == -1);
    CHECK(status->world_size() == 3);
  }
  // A second spare is one too many.
  h.Join(10, "extra");
  REQUIRE(h.Ended(10));
  CHECK(absl::IsResourceExhausted(*h.Ended(10)));
  CHECK(h.Ended(10)->message() ==
        "job 'job' is full: it has its 3 nodes (--nnodes) and 1 spare "
        "(--spares); give this run its own --rdzv_id, or the job more "
        "--spares");

  const int32_t lost_rank = h.LastAssignment(2)->group_rank();
  std::map<SessionId, v1::Assignment> before;
  for (SessionId s : {1, 3}) before[s] = *h.LastAssignment(s);
  h.Close(2);
  REQUIRE(h.LastRestart(1));
  CHECK(h.LastRestart(1)->reason() == RestartRequired::NODE_LOST);
  h.Rejoin(1, 1);
  h.Rejoin(3, 1);
  auto a = h.LastAssignment(9);
  REQUIRE(a);
  CHECK(a->round() == 1);
  CHECK(a->group_rank() == lost_rank);
  CHECK(a->world_size() == 3);
  CHECK(a->took_slot_of() == "a1:1002");
  for (SessionId s : {1, 3}) {
    auto now = h.LastAssignment(s);
    CHECK(now->round() == 1);
    CHECK(now->group_rank() == before[s].group_rank());
    CHECK(now->first_global_rank() == before[s].first_global_rank());
    CHECK(now->took_slot_of().empty());
  }
  const auto promoted = std::find_if(
      h.events().begin(), h.events().end(),
      [](const v1::Event& e) { return e.event() == "spare_promoted"; });
  REQUIRE(promoted != h.events().end());
  CHECK(promoted->node() == "spare:1009");
  CHECK(promoted->group_rank() == lost_rank);
  CHECK(promoted->detail() == "takes the slot of a1:1002");
  auto status = h.core().DescribeJob("job", h.now());
  REQUIRE(status.ok());
  CHECK(status->spares_promoted() == 1);
  REQUIRE(status->promotions_size() == 1);
  CHECK(status->promotions(0) == "spare:1009 took group rank 1 of a1:1002");
  CHECK_FALSE(FindNode(*status, "spare")->spare());
  // The lost node comes back: it is the spare now.
  h.Join(2, "a1");
  REQUIRE_FALSE(h.Ended(2));
  CHECK(h.LastProgress(2)->spare());
  CHECK_FALSE(h.LastRestart(1)->round() == 2);
}

// Fails before: a spare of another size was admitted, and promoted it
// turned a world of 2 into 3.
TEST_CASE(
    "A spare of another size is refused naming the flag, and a spare takes "
    "only a slot of its own size",
    "[rendezvous][unit][spares]") {
  Harness h(2, 2);
  h.settings().set_spares(1);
  h.Join(1, "a0", 1);
  h.Join(2, "a1", 2);
  REQUIRE(h.LastAssignment(1));
  CHECK(h.LastAssignment(1)->world_size() == 3);
  h.Join(9, "wide", 4);
  REQUIRE(h.Ended(9));
  CHECK(absl::IsFailedPrecondition(*h.Ended(9)));
  CHECK(h.Ended(9)->message() ==
        "job 'job' runs nodes of --nproc_per_node=1 or 2; a spare takes a "
        "lost node's ranks, so it needs as many workers as that node: this "
        "node has 4");
  h.Join(10, "narrow", 1);
  REQUIRE_FALSE(h.Ended(10));
  // The node of 2 is lost: the spare of 1 does not take its slot (it
  // joins the next round as any waiting node would, in a slot of its own).
  h.Close(2);
  REQUIRE(h.LastRestart(1));
  h.Rejoin(1, 1);
  if (auto a = h.LastAssignment(10)) CHECK(a->took_slot_of().empty());
  auto status = h.core().DescribeJob("job", h.now());
  REQUIRE(status.ok());
  CHECK(status->spares_promoted() == 0);
}

TEST_CASE("The spare of the lost node's segment is chosen, 20 of 20 times",
          "[rendezvous][unit][spares]") {
  for (int trial = 0; trial < 20; ++trial) {
    Harness h(2, 2);
    h.settings().set_spares(2);
    v1::Join a = h.MakeJoin(1, "a");
    a.set_segment("rack-1");
    v1::Join b = h.MakeJoin(2, "b");
    b.set_segment("rack-2");
    h.SendJoin(1, a);
    h.SendJoin(2, b);
    REQUIRE(h.LastAssignment(1));
    // Names that sort either way, so that only the segment decides.
    const bool same_first = trial % 2 == 0;
    v1::Join same = h.MakeJoin(7, same_first ? "s1" : "s9");
    same.set_segment("rack-2");
    v1::Join other = h.MakeJoin(8, absl::StrCat("s", 2 + trial % 7));
    other.set_segment("rack-1");
    if (trial % 3 == 0) {
      h.SendJoin(8, other);
      h.SendJoin(7, same);
    } else {
      h.SendJoin(7, same);
      h.SendJoin(8, other);
    }
    h.Close(2);
    h.Rejoin(1, 1);
    auto chosen = h.LastAssignment(7);
    REQUIRE(chosen);
    CHECK(chosen->group_rank() == 1);
    CHECK(chosen->took_slot_of() == "b:1002");
    CHECK_FALSE(h.LastAssignment(8));
    CHECK(h.LastProgress(8)->spare());
  }
}

TEST_CASE("Without a spare of its segment any spare takes the slot",
          "[rendezvous][unit][spares]") {
  Harness h(2, 2);
  h.settings().set_spares(1);
  v1::Join a = h.MakeJoin(1, "a");
  a.set_segment("rack-1");
  h.SendJoin(1, a);
  h.Join(2, "b");
  v1::Join spare = h.MakeJoin(7, "s");
  spare.set_segment("rack-9");
  h.SendJoin(7, spare);
  h.Close(1);
  h.Rejoin(2, 1);
  auto chosen = h.LastAssignment(7);
  REQUIRE(chosen);
  CHECK(chosen->group_rank() == 0);
  CHECK(chosen->master_addr() == "10.0.0.7");
  CHECK(h.LastAssignment(2)->group_rank() == 1);
  const auto promoted = std::find_if(
      h.events().begin(), h.events().end(),
      [](const v1::Event& e) { return e.event() == "spare_promoted"; });
  REQUIRE(promoted != h.events().end());
  CHECK(promoted->detail() ==
        "takes the slot of a:1001, no spare waits in its segment rack-1");
}

TEST_CASE("A spare that dies changes nothing, and without one the job waits",
          "[rendezvous][unit][spares]") {
  Harness h(2, 2);
  h.settings().set_spares(1);
  StartFixedJob(h, 2);
  h.Join(9, "spare");
  h.Clear();
  h.Close(9);
  CHECK_FALSE(h.LastRestart(1));
  CHECK_FALSE(h.LastRestart(2));
  CHECK(h.events().back().event() == "node_left");
  // No spare left: a loss waits below min exactly as without --spares.
  h.Close(2);
  h.Rejoin(1, 1);
  h.Advance(absl::Seconds(30));
  CHECK_FALSE(h.LastAssignment(1));
  CHECK_FALSE(h.LastFailed(1));
  h.Advance(absl::Seconds(31));
  REQUIRE(h.LastFailed(1));
}

TEST_CASE("A spare lost before its round closes passes the slot on",
          "[rendezvous][unit][spares]") {
  Harness h(3, 3);
  h.settings().set_spares(2);
  StartFixedJob(h, 3);
  h.Join(8, "s8");
  h.Join(9, "s9");
  h.Close(1);  // group rank 0: s8 takes it (by name)
  h.Close(8);  // and dies before the round closes: s9 takes it
  h.Rejoin(2, 1);
  h.Rejoin(3, 1);
  auto a = h.LastAssignment(9);
  REQUIRE(a);
  CHECK(a->group_rank() == 0);
  CHECK(a->took_slot_of() == "s8:1008");
  CHECK(h.LastAssignment(2)->group_rank() == 1);
  CHECK(h.LastAssignment(3)->group_rank() == 2);
}

TEST_CASE("A spare takes a lost node's rank hint and keeps its place",
          "[rendezvous][unit][spares]") {
  // Slurm: every node has a hint (SLURM_NODEID); the spare's sorts last.
  Harness h(3, 3, 2);
  h.settings().set_spares(1);
  h.Join(1, "n0", 1, 0);
  h.Join(2, "n1", 1, 1);
  h.Join(3, "n2", 1, 2);
  h.Join(4, "n3", 1, 3);
  REQUIRE(h.LastProgress(4)->spare());
  h.Close(2);
  h.Rejoin(1, 1);
  h.Rejoin(3, 1);
  REQUIRE(h.LastAssignment(4));
  CHECK(h.LastAssignment(4)->group_rank() == 1);
  // A later restart keeps the order: the spare holds hint 1 now.
  h.Report(3, 1, v1::WorkerReport::FAILED);
  for (SessionId s : {1, 3, 4}) h.Rejoin(s, 2);
  CHECK(h.LastAssignment(1)->group_rank() == 0);
  CHECK(h.LastAssignment(4)->group_rank() == 1);
  CHECK(h.LastAssignment(3)->group_rank() == 2);
  // The lost node's agent comes back with its hint: it waits as a spare.
  h.Join(2, "n1", 1, 1);
  REQUIRE_FALSE(h.Ended(2));
  CHECK(h.LastProgress(2)->spare());
}

TEST_CASE("Spares must be in range and the same for every node",
          "[rendezvous][unit][spares]") {
  Harness h(1, 1);
  h.settings().set_spares(-1);
  h.Join(1, "a");
  REQUIRE(h.Ended(1));
  CHECK(h.Ended(1)->message() ==
        "job settings refused: spares -1 is out of range (0..1024)");
  h.settings().set_spares(1);
  h.Join(2, "a");
  h.settings().set_spares(2);
  h.Join(3, "b");
  REQUIRE(h.Ended(3));
  CHECK(h.Ended(3)->message() ==
        "join refused: job 'job' exists with other settings: spares is 1 for "
        "the job, 2 in this join");
  v1::Join bad = h.MakeJoin(4, "c");
  bad.mutable_settings()->set_spares(1);
  bad.set_segment("rack 1");
  h.SendJoin(4, bad);
  REQUIRE(h.Ended(4));
  CHECK(h.Ended(4)->message() ==
        "segment may hold only [A-Za-z0-9._:/-], not byte 0x20 (' ')");
}

TEST_CASE("Below min after a loss the survivors wait then fail naming the lost",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Close(2);
  h.Rejoin(1, 1);
  h.Advance(absl::Seconds(30));
  CHECK_FALSE(h.LastFailed(1));
  h.Join(3, "replacement");
  REQUIRE(h.LastAssignment(3));
  CHECK(h.LastAssignment(3)->round() == 1);
}

TEST_CASE("Below min the join timeout fails the job and lists lost nodes",
          "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Close(2);
  h.Rejoin(1, 1);
  h.Advance(absl::Seconds(60));
  auto f = h.LastFailed(1);
  REQUIRE(f);
  CHECK(f->reason().find("lost: [b:1002") != std::string::npos);
}

TEST_CASE("A rejoin for the wrong round is refused with ABORTED",
          "[rendezvous][unit]") {
  Harness h(1, 2);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Close(2);
  h.Rejoin(1, 7);
  REQUIRE(h.Ended(1));
  CHECK(absl::IsAborted(*h.Ended(1)));
}

TEST_CASE("A rejoin when none was asked for is refused with ABORTED",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  h.Rejoin(1, 0);
  REQUIRE(h.Ended(1));
  CHECK(absl::IsAborted(*h.Ended(1)));
}

TEST_CASE("A report of an ended round changes nothing", "[rendezvous][unit]") {
  Harness h(2, 2, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  h.Report(2, 0, v1::WorkerReport::FAILED);  // raced with the restart
  CHECK(h.core().DescribeJob("job", h.now())->restart_count() == 1);
  CHECK_FALSE(h.Ended(2));
}

TEST_CASE("A node's in-process recovery shows in its status and an event",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a", /*workers=*/4);
  auto report = [&](int kept, double recovery_s) {
    h.ReportKept(1, 0, kept, recovery_s);
  };
  auto recovered = [&] {
    return std::count_if(
        h.events().begin(), h.events().end(),
        [](const v1::Event& e) { return e.event() == "workers_recovered"; });
  };
  report(3, 0);
  CHECK(h.core().DescribeJob("job", h.now())->nodes(0).kept_workers() == 3);
  CHECK(recovered() == 0);
  report(3, 0.25);
  auto job = h.core().DescribeJob("job", h.now());
  CHECK(job->nodes(0).recovery_s() == 0.25);
  REQUIRE(recovered() == 1);
  const v1::Event& e = h.events().back();
  CHECK(e.kept() == 3);
  CHECK(e.duration_s() == 0.25);
  CHECK(e.node() == "a:1001");
  report(3, 0.25);  // said again (a resumed session): one event
  CHECK(recovered() == 1);
  // What an agent says is kept within what it can mean.
  report(99, 0.25);
  CHECK(h.core().DescribeJob("job", h.now())->nodes(0).kept_workers() == 4);
  report(-4, 0.25);
  CHECK(h.core().DescribeJob("job", h.now())->nodes(0).kept_workers() == 0);
}

TEST_CASE("A node's absurd recovery time is not recorded",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  for (double bad : {-1.0, std::nan(""), 1e300}) {
    h.ReportKept(1, 0, 1, bad);
  }
  CHECK(h.core().DescribeJob("job", h.now())->nodes(0).recovery_s() == 0);
  CHECK(std::none_of(h.events().begin(), h.events().end(), [](const auto& e) {
    return e.event() == "workers_recovered";
  }));
}

TEST_CASE("A report for a future round ends the session",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  h.Report(1, 5, v1::WorkerReport::RUNNING);
  REQUIRE(h.Ended(1));
  CHECK(absl::IsInvalidArgument(*h.Ended(1)));
}

TEST_CASE("A join with other settings is refused naming the difference",
          "[rendezvous][unit]") {
  Harness h(2, 3);
  h.Join(1, "a");
  auto join = h.MakeJoin(2, "b");
  join.mutable_settings()->set_max_nodes(4);
  h.SendJoin(2, join);
  REQUIRE(h.Ended(2));
  CHECK(absl::IsInvalidArgument(*h.Ended(2)));
  CHECK(h.Ended(2)->message() ==
        "join refused: job 'job' exists with other settings: max_nodes is 3 "
        "for the job, 4 in this join");
}

TEST_CASE("A join to a finished job is refused", "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  h.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  h.Join(2, "b");
  REQUIRE(h.Ended(2));
  CHECK(absl::IsFailedPrecondition(*h.Ended(2)));
  CHECK(h.Ended(2)->message() ==
        "job 'job' has already finished; use a new rendezvous id for a new "
        "run");
}

TEST_CASE("Two nodes cannot hold the same rank hint", "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a", 1, 0);
  h.Join(2, "b", 1, 0);
  REQUIRE(h.Ended(2));
  CHECK(absl::IsFailedPrecondition(*h.Ended(2)));
  CHECK(h.Ended(2)->message() ==
        "node rank 0 of job 'job' is held by a:1001; each node needs its own");
}

TEST_CASE("A duplicate incarnation is refused", "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  auto join = h.MakeJoin(2, "b");
  join.mutable_node()->set_incarnation(h.MakeJoin(1, "a").node().incarnation());
  h.SendJoin(2, join);
  REQUIRE(h.Ended(2));
  CHECK(absl::IsAlreadyExists(*h.Ended(2)));
  CHECK(h.Ended(2)->message() ==
        absl::StrCat("node incarnation ", join.node().incarnation(),
                     " is already in job 'job' as a:1001"));
}

TEST_CASE("Malformed joins are refused with INVALID_ARGUMENT",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  auto j = h.MakeJoin(1, "a");
  std::string expected;
  SECTION("empty job id") {
    j.set_job_id("");
    expected = "job id must be 1..128 bytes, got 0";
  }
  SECTION("bad job id characters") {
    j.set_job_id("a b");
    expected = "job id may hold only [A-Za-z0-9._:/-], not byte 0x20 (' ')";
  }
  SECTION("no hostname") {
    j.mutable_node()->set_hostname("");
    expected = "hostname must be 1..255 bytes";
  }
  SECTION("no incarnation") {
    j.mutable_node()->set_incarnation(0);
    expected = "node incarnation must not be 0";
  }
  SECTION("no address") {
    j.set_address("");
    expected = "node address must be 1..255 bytes";
  }
  SECTION("zero workers") {
    j.set_local_world_size(0);
    expected = "local_world_size 0 must be 1..65536";
  }
  SECTION("a hint below -1") {
    j.set_node_rank_hint(-2);
    expected = "node_rank_hint -2 must be -1 (none) or 0..65535";
  }
  SECTION("min above max") {
    j.mutable_settings()->set_min_nodes(3);
    j.mutable_settings()->set_max_nodes(2);
    expected =
        "job settings refused: min_nodes 3 exceeds max_nodes 2; use MIN:MAX "
        "with MIN <= MAX";
  }
  SECTION("no port candidate") {
    j.set_master_port_candidate(0);
    expected = "master_port_candidate 0 is not a port (1..65535)";
  }
  h.SendJoin(1, j);
  REQUIRE(h.Ended(1));
  CHECK(absl::IsInvalidArgument(*h.Ended(1)));
  CHECK(h.Ended(1)->message() == expected);
  CHECK(h.core().num_jobs() == 0);
}

TEST_CASE("A first message that is not a join ends the session",
          "[rendezvous][unit]") {
  Harness h;
  h.Heartbeat(9);
  REQUIRE(h.Ended(9));
  CHECK(absl::IsInvalidArgument(*h.Ended(9)));
  CHECK(h.Ended(9)->message() ==
        "the first message of a session must be a join");
}

TEST_CASE("Store requests are fenced by round", "[rendezvous][unit]") {
  Harness h(1, 2, 1);
  h.Join(1, "a");
  h.Join(2, "b");
  v1::StoreScope scope;
  scope.set_job_id("job");
  scope.set_round(0);
  REQUIRE(h.core().Store(scope).ok());
  h.Report(1, 0, v1::WorkerReport::FAILED);
  CHECK(absl::IsAborted(h.core().Store(scope).status()));
  scope.set_round(1);
  CHECK(h.core().Store(scope).ok());
  scope.set_job_id("other");
  CHECK(absl::IsNotFound(h.core().Store(scope).status()));
}

TEST_CASE("A new round aborts the parked store waits of the old one",
          "[rendezvous][unit]") {
  Harness h(1, 2, 1);
  h.Join(1, "a");
  h.Join(2, "b");
  v1::StoreScope scope;
  scope.set_job_id("job");
  scope.set_round(0);
  std::optional<absl::Status> outcome;
  std::vector<KvStore::Fired> fired;
  REQUIRE(
      (*h.core().Store(scope))
          ->Park(
              {"k"}, h.now() + absl::Seconds(100),
              [&](absl::StatusOr<KvStore::Values> r) { outcome = r.status(); },
              &fired)
          .ok());
  h.Close(2);
  REQUIRE(outcome);
  CHECK(absl::IsAborted(*outcome));
}

TEST_CASE("Progress while collecting names pending nodes and missing ranks",
          "[rendezvous][unit]") {
  Harness h(3, 3);
  h.Join(1, "a", 1, 0);
  REQUIRE(h.LastProgress(1));
  CHECK(h.LastProgress(1)->joined() == 1);
  h.Advance(absl::Milliseconds(500));
  auto p = h.LastProgress(1);
  REQUIRE(p);
  CHECK(p->missing_node_ranks_size() == 2);
  CHECK(p->missing_node_ranks(0) == 1);
  CHECK(p->join_timeout_remaining_ms() == 59'500);
  CHECK(p->last_call_remaining_ms() == -1);
}

TEST_CASE("Status describes nodes in group rank order", "[rendezvous][unit]") {
  Harness h(2, 2);
  h.Join(1, "b", 2);
  h.Join(2, "a", 3);
  h.Silence(1);
  h.Advance(absl::Milliseconds(1500));
  auto s = h.core().DescribeJob("job", h.now());
  REQUIRE(s.ok());
  CHECK(s->phase() == v1::JobStatus::RUNNING);
  REQUIRE(s->nodes_size() == 2);
  CHECK(s->nodes(0).node().hostname() == "a");
  CHECK(s->nodes(0).group_rank() == 0);
  CHECK(s->nodes(1).first_global_rank() == 3);
  CHECK(s->nodes(1).heartbeat_age_ms() == 1500);
  CHECK(s->world_size() == 5);
}

TEST_CASE("Jobs are independent", "[rendezvous][unit]") {
  Harness h(1, 1);
  h.Join(1, "a");
  auto other = h.MakeJoin(2, "b");
  other.set_job_id("other");
  h.SendJoin(2, other);
  REQUIRE(h.LastAssignment(1));
  REQUIRE(h.LastAssignment(2));
  CHECK(h.LastAssignment(2)->job_id() == "other");
  CHECK(h.core().ListJobs(h.now()).size() == 2);
}

// What a journal would hold of `from`, restored into `to` at `to`'s now.
void Restart(Harness& from, Harness& to,
             absl::Duration grace = absl::Seconds(10)) {
  std::string bytes;
  for (const auto& record : from.core().Checkpoint()) {
    bytes += FrameRecord(record);
  }
  const JournalContents contents = ReadJournal(bytes);
  REQUIRE(contents.damage.empty());
  for (const auto& [id, job] : contents.jobs) {
    REQUIRE(to.core()
                .Restore(job.snapshot, {job.keys.begin(), job.keys.end()},
                         grace, to.now())
                .ok());
  }
}

TEST_CASE("Rounds and endings name their job as changed, successes not",
          "[rendezvous][restore][unit]") {
  Harness h(2, 2);
  h.Join(1, "a");
  CHECK(h.changed() == std::set<std::string>{"job"});  // created
  h.Clear();
  h.Join(2, "b");
  CHECK(h.changed() == std::set<std::string>{"job"});  // round closed
  h.Clear();
  h.Heartbeat(1);
  h.Report(1, 0, v1::WorkerReport::RUNNING);
  CHECK(h.changed().empty());
  h.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(h.changed().empty());  // said again on resume, if need be
  auto snapshot = h.core().SnapshotJob("job");
  REQUIRE(snapshot);
  CHECK(snapshot->phase() == v1::JobStatus::RUNNING);
  REQUIRE(snapshot->members_size() == 2);
  CHECK(snapshot->members(0).succeeded());
  CHECK_FALSE(snapshot->members(1).succeeded());
  h.Close(1);
  h.Close(2);
  CHECK_FALSE(h.core().SnapshotJob("job"));
}

TEST_CASE("A restored job takes its nodes back without a new round",
          "[rendezvous][restore][unit]") {
  Harness before(2, 2);
  before.Join(1, "a");
  before.Join(2, "b");
  const auto assignment = before.LastAssignment(2);
  REQUIRE(assignment);
  auto store = before.core().Store([] {
    v1::StoreScope scope;
    scope.set_job_id("job");
    scope.set_round(0);
    return scope;
  }());
  REQUIRE(store.ok());
  std::vector<KvStore::Fired> fired;
  REQUIRE((*store)->Set("k", "v", &fired).ok());

  Harness after(2, 2);
  Restart(before, after);
  after.Resume(11, 1, "a", 0);
  after.Resume(12, 2, "b", 0);
  REQUIRE(after.LastResumed(11));
  CHECK(after.LastResumed(12)->round() == 0);
  CHECK_FALSE(after.LastAssignment(11));
  CHECK_FALSE(after.LastRestart(11));
  CHECK_FALSE(after.Ended(11));
  auto status = after.core().DescribeJob("job", after.now());
  REQUIRE(status.ok());
  CHECK(status->phase() == v1::JobStatus::RUNNING);
  CHECK(status->num_keys() == 1);
  CHECK(status->world_size() == assignment->world_size());
  CHECK(status->master_port() == assignment->master_port());
  CHECK(status->nodes(1).group_rank() == assignment->group_rank());

  // The grace passes without harm once everyone is back.
  after.Advance(absl::Seconds(20));
  CHECK_FALSE(after.LastRestart(11));
  after.Report(11, 0, v1::WorkerReport::SUCCEEDED);
  after.Report(12, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(after.Finished(11));
  CHECK(after.Finished(12));
}

TEST_CASE("A restored node that does not resume within the grace is lost",
          "[rendezvous][restore][unit]") {
  Harness before(1, 2);
  before.Join(1, "a");
  before.Join(2, "b");
  REQUIRE(before.LastAssignment(1));
  Harness after(1, 2);
  Restart(before, after, absl::Seconds(4));
  auto restored = after.core().DescribeJob("job", after.now());
  REQUIRE(restored.ok());
  REQUIRE(restored->nodes_size() == 2);
  CHECK(restored->nodes(0).resuming());
  CHECK(restored->nodes(0).heartbeat_age_ms() == 0);
  after.Resume(11, 1, "a", 0);
  auto resumed = after.core().DescribeJob("job", after.now());
  CHECK_FALSE(resumed->nodes(0).resuming());
  CHECK(resumed->nodes(1).resuming());
  after.Advance(absl::Seconds(3));
  CHECK_FALSE(after.LastRestart(11));
  after.Advance(absl::Seconds(2));
  auto restart = after.LastRestart(11);
  REQUIRE(restart);
  CHECK(restart->reason() == RestartRequired::NODE_LOST);
  CHECK(restart->detail().find("did not resume") != std::string::npos);
  CHECK(restart->restart_count() == 0);
}

TEST_CASE("A succeeded node that resumes into a finished job is told so",
          "[rendezvous][restore][unit]") {
  Harness before(2, 2);
  before.Join(1, "a");
  before.Join(2, "b");
  before.Report(1, 0, v1::WorkerReport::SUCCEEDED);
  Harness after(2, 2);
  Restart(before, after);
  after.Resume(12, 2, "b", 0);
  after.Report(12, 0, v1::WorkerReport::SUCCEEDED);
  CHECK(after.Finished(12));
  after.Resume(11, 1, "a", 0);
  CHECK(after.LastResumed(11));
  CHECK(after.Finished(11));
}

TEST_CASE("A resume the service cannot honour ends with NOT_FOUND",
          "[rendezvous][restore][unit]") {
  Harness before(2, 2);
  before.Join(1, "a");
  before.Join(2, "b");
  Harness after(2, 2);
  Restart(before, after);

  after.Resume(11, 1, "a", 3);  // not the job's round
  after.Resume(12, 7, "z", 0);  // not a node of the job
  after.Resume(13, 1, "a", 0);
  after.Resume(14, 1, "a", 0);  // resumed already
  Harness empty(2, 2);
  empty.Resume(15, 1, "a", 0);  // no such job
  for (auto [h, s] : {std::pair{&after, 11}, std::pair{&after, 12},
                      std::pair{&after, 14}, std::pair{&empty, 15}}) {
    auto ended = h->Ended(s);
    REQUIRE(ended);
    CHECK(absl::IsNotFound(*ended));
    CHECK(ended->message().find("join afresh") != std::string::npos);
  }
  CHECK(after.LastResumed(13));
}

TEST_CASE("A collecting job comes back empty with its round and restarts",
          "[rendezvous][restore][unit]") {
  Harness before(2, 2, /*max_restarts=*/3);
  before.Join(1, "a");
  before.Join(2, "b");
  before.Report(1, 0, v1::WorkerReport::FAILED);  // round 1 collects
  REQUIRE(before.LastRestart(1));

  SECTION("its nodes join again and meet like a first round") {
    Harness after(2, 2, 3);
    Restart(before, after);
    after.Join(21, "a");
    CHECK_FALSE(after.LastAssignment(21));
    after.Join(22, "b");
    auto a = after.LastAssignment(21);
    REQUIRE(a);
    CHECK(a->round() == 1);
    CHECK(a->restart_count() == 1);
  }
  SECTION("nobody comes: forgotten after the grace") {
    Harness after(2, 2, 3);
    Restart(before, after, absl::Seconds(5));
    CHECK(after.core().num_jobs() == 1);
    after.Advance(absl::Seconds(6));
    CHECK(after.core().num_jobs() == 0);
  }
}

TEST_CASE("A job's status tells its last restart, which a restore keeps",
          "[rendezvous][restore][unit]") {
  Harness before(2, 2, /*max_restarts=*/3);
  before.Join(1, "a");
  before.Join(2, "b");
  CHECK_FALSE(
      before.core().DescribeJob("job", before.now())->has_last_restart());
  before.Report(1, 0, v1::WorkerReport::FAILED);
  auto status = before.core().DescribeJob("job", before.now());
  REQUIRE(status.ok());
  REQUIRE(status->has_last_restart());
  const RestartRequired& last = status->last_restart();
  CHECK(last.round() == 1);
  CHECK(last.reason() == RestartRequired::WORKER_FAILED);
  CHECK(last.detail() == before.LastRestart(1)->detail());
  CHECK(last.restart_count() == 1);

  Harness after(2, 2, 3);
  Restart(before, after);
  auto restored = after.core().DescribeJob("job", after.now());
  REQUIRE(restored.ok());
  CHECK(restored->last_restart().SerializeAsString() ==
        last.SerializeAsString());
}

TEST_CASE("A session that never sends its join is ended after a while",
          "[rendezvous][unit]") {
  Harness h(1, 1);
  h.core().OnSessionOpened(5, h.now());
  h.core().OnSessionOpened(6, h.now());
  h.Join(6, "a");
  CHECK(h.core().NextDeadline() <= h.now() + absl::Seconds(10));
  h.Advance(absl::Seconds(9));
  CHECK_FALSE(h.Ended(5));
  h.Advance(absl::Seconds(2));
  auto ended = h.Ended(5);
  REQUIRE(ended);
  CHECK(absl::IsDeadlineExceeded(*ended));
  CHECK(ended->message() == "no join within 10s of opening the session");
  CHECK_FALSE(h.Ended(6));
  CHECK(h.LastAssignment(6));
}

TEST_CASE("A long failure message is cut without splitting a character",
          "[rendezvous][unit]") {
  Harness h(1, 1, /*max_restarts=*/0);
  h.Join(1, "a");
  v1::AgentMessage m;
  auto* r = m.mutable_worker_report();
  r->set_round(0);
  r->set_state(v1::WorkerReport::FAILED);
  // "é" is two bytes; the second would be the 4097th.
  r->mutable_failure()->set_message(std::string(4095, 'x') + "\xC3\xA9");
  Effects fx;
  h.core().OnMessage(1, m, h.now(), &fx);
  std::string reason;
  for (const auto& [s, out] : fx.messages) {
    if (out.has_job_failed()) reason = out.job_failed().reason();
  }
  REQUIRE_FALSE(reason.empty());
  CHECK(reason.find(std::string(4095, 'x') + "; no restarts left") !=
        std::string::npos);
  // It survives the wire and the journal.
  v1::JobFailed parsed;
  v1::JobFailed sent;
  sent.set_reason(reason);
  CHECK(parsed.ParseFromString(sent.SerializeAsString()));
}

TEST_CASE("Snapshots that make no sense are refused on restore",
          "[rendezvous][restore][unit]") {
  Harness h;
  v1::JobSnapshot s;
  s.set_job_id("j");
  CHECK(absl::IsInvalidArgument(
      h.core().Restore(s, {}, absl::Seconds(1), h.now())));  // no phase
  s.set_phase(v1::JobStatus::RUNNING);
  s.add_members()->mutable_join()->set_job_id("j");  // no identity
  CHECK(absl::IsInvalidArgument(
      h.core().Restore(s, {}, absl::Seconds(1), h.now())));
  s.clear_members();
  REQUIRE(h.core().Restore(s, {}, absl::Seconds(1), h.now()).ok());
  CHECK(absl::IsAlreadyExists(
      h.core().Restore(s, {}, absl::Seconds(1), h.now())));
}

// --- hangs, learned silences, stragglers -------------------------------------

v1::ProgressReport Longest(int64_t round, const std::string& section,
                           int64_t ms) {
  v1::ProgressReport r;
  r.set_round(round);
  auto* l = r.add_longest();
  l->set_section(section);
  l->set_longest_ms(ms);
  return r;
}

TEST_CASE("A hung worker restarts the job, every node collecting evidence",
          "[rendezvous][unit]") {
  Harness h(2, 2, 1);
  h.Join(1, "a");
  h.Join(2, "b");
  REQUIRE(h.LastAssignment(2).has_value());
  h.ReportHang(2, 0, 1);
  for (SessionId s : {1, 2}) {
    auto r = h.LastRestart(s);
    REQUIRE(r.has_value());
    CHECK(r->reason() == RestartRequired::WORKER_HUNG);
    CHECK(r->collect_evidence());
    CHECK(r->restart_count() == 1);
    CHECK(r->detail().find("worker rank 1 (local 0) on b:1002 hung: no "
                           "progress for 2s") != std::string::npos);
  }
}

TEST_CASE("A hang with no restarts left fails the job as hung",
          "[rendezvous][unit]") {
  Harness h(1, 1, 0);
  h.Join(1, "a");
  h.ReportHang(1, 0, 0);
  auto failed = h.LastFailed(1);
  REQUIRE(failed.has_value());
  CHECK(failed->hung());
  CHECK(failed->reason().find("hung") != std::string::npos);
}

TEST_CASE("A worker failure does not fail the job as hung",
          "[rendezvous][unit]") {
  Harness h(1, 1, 0);
  h.Join(1, "a");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  REQUIRE(h.LastFailed(1).has_value());
  CHECK_FALSE(h.LastFailed(1)->hung());
}

TEST_CASE("The job keeps the longest silences across rounds",
          "[rendezvous][unit]") {
  Harness h(2, 2, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Clear();
  h.ReportProgress(1, Longest(0, "", 300));
  for (SessionId s : {1, 2}) {
    auto learned = h.LastLearned(s);
    REQUIRE(learned.has_value());
    REQUIRE(learned->longest_size() == 1);
    CHECK(learned->longest(0).longest_ms() == 300);
  }
  CHECK(h.changed().contains("job"));
  // Shorter, or for another round: nothing new.
  h.Clear();
  h.ReportProgress(2, Longest(0, "", 200));
  h.ReportProgress(2, Longest(5, "", 900));
  CHECK_FALSE(h.LastLearned(1).has_value());
  // A restart: the next round's assignments carry it.
  h.Report(1, 0, v1::WorkerReport::FAILED);
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  auto a = h.LastAssignment(1);
  REQUIRE(a.has_value());
  CHECK(a->round() == 1);
  REQUIRE(a->longest_size() == 1);
  CHECK(a->longest(0).longest_ms() == 300);
  auto status = h.core().DescribeJob("job", h.now());
  REQUIRE(status.ok());
  REQUIRE(status->longest_size() == 1);
  // And the journal keeps it.
  auto snapshot = h.core().SnapshotJob("job");
  REQUIRE(snapshot.has_value());
  REQUIRE(snapshot->longest_size() == 1);
  CHECK(snapshot->longest(0).longest_ms() == 300);
  RendezvousCore restored;
  REQUIRE(restored.Restore(*snapshot, {}, absl::Seconds(10), h.now()).ok());
  auto back = restored.DescribeJob("job", h.now());
  REQUIRE(back.ok());
  REQUIRE(back->longest_size() == 1);
  CHECK(back->longest(0).longest_ms() == 300);
}

TEST_CASE("A straggler is named to the node of group rank 0 only",
          "[rendezvous][unit]") {
  Harness h(2, 2, 1);
  h.Join(1, "a", 2);
  h.Join(2, "b", 2);  // ranks 2 and 3
  h.Clear();
  auto paces = [](std::initializer_list<std::pair<int, int64_t>> ranks) {
    v1::ProgressReport r;
    r.set_round(0);
    for (auto [rank, us] : ranks) {
      auto* p = r.add_paces();
      p->set_rank(rank);
      p->set_steps(5);
      p->set_mean_step_us(us);
    }
    return r;
  };
  for (int i = 0; i < 4; ++i) {
    h.ReportProgress(1, paces({{0, 100000}, {1, 100000}}));
    // A node's report of ranks that are not its own is ignored.
    h.ReportProgress(1, paces({{2, 900000}}));
    h.ReportProgress(2, paces({{2, 100000}, {3, 130000}}));
    h.Advance(absl::Seconds(2));
  }
  auto named = h.LastStraggler(1);
  REQUIRE(named.has_value());
  CHECK(named->rank() == 3);
  CHECK(named->node() == "b:1002");
  CHECK(named->ratio() == Approx(1.3));
  CHECK_FALSE(h.LastStraggler(2).has_value());
  CHECK_FALSE(h.LastRestart(1).has_value());
  auto status = h.core().DescribeJob("job", h.now());
  REQUIRE(status.ok());
  REQUIRE(status->stragglers_size() == 1);
  CHECK(status->stragglers(0).rank() == 3);
}

TEST_CASE(
    "A stop asked by one node holds every node, and the step is the largest "
    "held once all hold",
    "[rendezvous][unit]") {
  Harness h(3, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Join(3, "c");
  h.Clear();
  h.AskStop(2, 0, "SIGTERM to ctrun on b");
  for (SessionId s : {1, 2, 3}) {
    const auto stops = h.StopsSent(s);
    REQUIRE(stops.size() == 1);
    CHECK_FALSE(stops[0].decided());
    CHECK(stops[0].reason() == "SIGTERM to ctrun on b");
  }
  // A second ask (another node preempted too) changes nothing.
  h.AskStop(3, 0, "SIGTERM to ctrun on c");
  CHECK(h.StopsSent(1).size() == 1);
  h.Held(1, 0, 40);
  h.Held(2, 0, 57);
  h.Held(2, 0, 99);  // a node's second vote does not count twice
  CHECK(h.StopsSent(1).size() == 1);
  h.Held(3, 0, 12);
  for (SessionId s : {1, 2, 3}) {
    const auto stops = h.StopsSent(s);
    REQUIRE(stops.size() == 2);
    CHECK(stops[1].decided());
    CHECK(stops[1].step() == 99);
    CHECK(stops[1].round() == 0);
  }
  const auto& events = h.events();
  const auto decided = std::find_if(
      events.begin(), events.end(),
      [](const v1::Event& e) { return e.event() == "stop_decided"; });
  REQUIRE(decided != events.end());
  CHECK(decided->step() == 99);
  CHECK(std::any_of(events.begin(), events.end(), [](const v1::Event& e) {
    return e.event() == "stop_asked" && e.reason() == "SIGTERM to ctrun on b";
  }));
}

TEST_CASE(
    "A stop whose nodes do not all hold is decided when the asking node's "
    "hold window passes",
    "[rendezvous][unit]") {
  Harness h;
  h.Join(1, "a");
  h.Join(2, "b");
  h.Clear();
  h.AskStop(1, 0, "SIGUSR1 to ctrun on a", /*hold_ms=*/2000);
  h.Held(1, 0, 8);
  h.Advance(absl::Milliseconds(1500));
  CHECK(h.StopsSent(2).size() == 1);
  h.Advance(absl::Milliseconds(500));
  auto stops = h.StopsSent(2);
  REQUIRE(stops.size() == 2);
  CHECK(stops[1].decided());
  CHECK(stops[1].step() == 8);
  // Nothing heard at all: every rank stops at its next check.
  Harness none;
  none.Join(1, "a");
  none.Join(2, "b");
  none.AskStop(1, 0, "SIGTERM to ctrun on a", 1000);
  none.Advance(absl::Seconds(1));
  stops = none.StopsSent(1);
  REQUIRE(stops.size() == 2);
  CHECK(stops[1].step() == 0);
}

TEST_CASE(
    "A stop vote of another round, or before the job runs, is ignored, and "
    "a new round forgets the stop",
    "[rendezvous][unit]") {
  Harness h(2, 2, 3);
  h.Join(1, "a");
  h.AskStop(1, 0, "SIGTERM to ctrun on a");  // still collecting
  CHECK(h.StopsSent(1).empty());
  h.Join(2, "b");
  h.AskStop(1, 5, "SIGTERM to ctrun on a");
  CHECK(h.StopsSent(1).empty());
  h.AskStop(1, 0, "SIGTERM to ctrun on a");
  REQUIRE(h.StopsSent(2).size() == 1);
  h.Report(2, 0, v1::WorkerReport::FAILED);
  h.Rejoin(1, 1);
  h.Rejoin(2, 1);
  h.Clear();
  h.Held(1, 1, 3);
  h.Held(2, 1, 3);
  CHECK(h.StopsSent(1).empty());  // no stop asked in round 1
  h.AskStop(2, 1, "SIGTERM to ctrun on a");
  REQUIRE(h.StopsSent(1).size() == 1);
  CHECK(h.StopsSent(1)[0].round() == 1);
}

TEST_CASE("A coordinated stop's hold window is bounded", "[rendezvous][unit]") {
  CoordinatedStop stop;
  const absl::Time t0 = absl::UnixEpoch();
  REQUIRE(stop.Ask(0, "x", SIGTERM, absl::Hours(5), t0));
  CHECK(stop.deadline() == t0 + CoordinatedStop::kMaxHold);
  CHECK_FALSE(stop.Ask(0, "y", SIGTERM, absl::Seconds(1), t0));
  CHECK_FALSE(stop.Tick(t0 + CoordinatedStop::kMaxHold - absl::Seconds(1)));
  auto decided = stop.Tick(t0 + CoordinatedStop::kMaxHold);
  REQUIRE(decided);
  CHECK(decided->reason() == "x");
  CHECK(decided->signal() == SIGTERM);
  CHECK(stop.deadline() == absl::InfiniteFuture());
  CHECK_FALSE(stop.Held(1, 5, 1));  // decided once
  stop.NewRound();
  CHECK_FALSE(stop.asked());
  REQUIRE(stop.Ask(1, "z", SIGUSR1, absl::Seconds(-3), t0));
  CHECK(stop.deadline() == t0);
}

TEST_CASE(
    "A node that failed its health check is refused and quarantined for "
    "every job until its time is up",
    "[rendezvous][unit]") {
  Harness h;
  v1::Join sick = h.MakeJoin(1, "gpu7");
  sick.set_unhealthy("`nvidia-smi` exited 1: GPU 3 fell off the bus");
  sick.set_quarantine_ms(60'000);
  h.SendJoin(1, sick);
  REQUIRE(h.Ended(1));
  CHECK(h.Ended(1)->code() == absl::StatusCode::kFailedPrecondition);
  CHECK(h.Ended(1)->message() ==
        "node gpu7 (10.0.0.1) failed its health check: `nvidia-smi` exited "
        "1: GPU 3 fell off the bus; quarantined for 1m");
  auto quarantined = h.core().ListQuarantined(h.now());
  REQUIRE(quarantined.size() == 1);
  CHECK(quarantined[0].hostname() == "gpu7 (10.0.0.1)");
  CHECK(quarantined[0].job_id() == "job");
  CHECK(quarantined[0].remaining_ms() == 60'000);
  CHECK(
      std::any_of(h.events().begin(), h.events().end(), [](const v1::Event& e) {
        return e.event() == "node_quarantined" && e.node() == "gpu7 (10.0.0.1)";
      }));
  // A healthy join from that host, to another job, is refused meanwhile.
  h.Advance(absl::Seconds(20));
  v1::Join later = h.MakeJoin(1, "gpu7");
  later.set_job_id("other-job");
  h.SendJoin(2, later);
  REQUIRE(h.Ended(2));
  CHECK(h.Ended(2)->code() == absl::StatusCode::kFailedPrecondition);
  CHECK(h.Ended(2)->message() ==
        "node gpu7 (10.0.0.1) is quarantined for another 40s: its health "
        "check failed (`nvidia-smi` exited 1: GPU 3 fell off the bus)");
  // Another host is not.
  h.Join(3, "gpu8");
  CHECK_FALSE(h.Ended(3));
  // Once its time is up it joins.
  h.Advance(absl::Seconds(40));
  CHECK(h.core().ListQuarantined(h.now()).empty());
  h.SendJoin(4, h.MakeJoin(1, "gpu7"));
  CHECK_FALSE(h.Ended(4));
}

TEST_CASE(
    "A node that fails its health check before a rejoin is evicted and "
    "quarantined, and the job goes on without it",
    "[rendezvous][unit]") {
  Harness h(1, 2, 3);
  h.Join(1, "a");
  h.Join(2, "b");
  h.Report(1, 0, v1::WorkerReport::FAILED);
  h.Rejoin(1, 1);
  v1::AgentMessage m;
  m.mutable_rejoin()->set_round(1);
  m.mutable_rejoin()->set_master_port_candidate(30002);
  m.mutable_rejoin()->set_unhealthy("`check.sh` exited 2: disk full");
  m.mutable_rejoin()->set_quarantine_ms(1000);
  Effects fx;
  h.core().OnMessage(2, m, h.now(), &fx);
  REQUIRE(fx.finishes.size() == 1);
  CHECK(fx.finishes[0].first == 2);
  CHECK(fx.finishes[0].second.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(fx.finishes[0].second.message() ==
        "node b (10.0.0.2) failed its health check: `check.sh` exited 2: "
        "disk full; quarantined for 1s");
  CHECK(h.core().ListQuarantined(h.now()).size() == 1);
  // Quarantine zero: refused, nothing remembered.
  Harness z;
  v1::Join sick = z.MakeJoin(1, "c");
  sick.set_unhealthy("bad");
  z.SendJoin(1, sick);
  REQUIRE(z.Ended(1));
  CHECK(z.Ended(1)->message() ==
        "node c (10.0.0.1) failed its health check: bad");
  CHECK(z.core().ListQuarantined(z.now()).empty());
}

TEST_CASE(
    "A job token's failed health check quarantines its host for that job "
    "only, and can neither shorten nor crowd out a service quarantine",
    "[rendezvous][unit]") {
  Harness h;
  // A session of a job token (workers hold one) says its host is sick.
  h.core().OnSessionOpened(1, h.now(), RendezvousCore::Reach::kOneJob);
  v1::Join sick = h.MakeJoin(1, "gpu7");
  sick.set_unhealthy("made up");
  sick.set_quarantine_ms(60'000);
  h.SendJoin(1, sick);
  REQUIRE(h.Ended(1));
  auto quarantined = h.core().ListQuarantined(h.now());
  REQUIRE(quarantined.size() == 1);
  CHECK(quarantined[0].job_only());
  // Its own job refuses the host...
  h.SendJoin(2, h.MakeJoin(1, "gpu7"));
  REQUIRE(h.Ended(2));
  CHECK(h.Ended(2)->message() ==
        "node gpu7 (10.0.0.1) is quarantined for another 1m by job 'job': its "
        "health check failed (made up)");
  // ...another job does not.
  v1::Join other = h.MakeJoin(1, "gpu7");
  other.set_job_id("other-job");
  h.SendJoin(3, other);
  CHECK_FALSE(h.Ended(3));

  // A service quarantine of a host stays whole when a job token later
  // quarantines the same host briefly.
  h.SendJoin(4, [&] {
    v1::Join j = h.MakeJoin(1, "gpu8");
    j.set_unhealthy("ECC");
    j.set_quarantine_ms(600'000);
    return j;
  }());
  h.core().OnSessionOpened(5, h.now(), RendezvousCore::Reach::kOneJob);
  v1::Join brief = h.MakeJoin(1, "gpu8");
  brief.set_unhealthy("short");
  brief.set_quarantine_ms(1);
  h.SendJoin(5, brief);
  h.Advance(absl::Seconds(1));
  v1::Join again = h.MakeJoin(1, "gpu8");
  again.set_job_id("third-job");
  h.SendJoin(6, again);
  REQUIRE(h.Ended(6));
  CHECK(absl::StrContains(h.Ended(6)->message(), "(ECC)"));

  // A job token filling the table with made-up hosts pushes out its own
  // entries, never the service's.
  for (SessionId s = 100; s < 100 + 5000; ++s) {
    h.core().OnSessionOpened(s, h.now(), RendezvousCore::Reach::kOneJob);
    v1::Join j = h.MakeJoin(s, absl::StrCat("fake", s));
    j.set_unhealthy("x");
    j.set_quarantine_ms(60'000);
    h.SendJoin(s, j);
  }
  quarantined = h.core().ListQuarantined(h.now());
  CHECK(quarantined.size() <= 4096);
  CHECK(std::count_if(quarantined.begin(), quarantined.end(),
                      [](const v1::QuarantinedNode& q) {
                        return !q.job_only() &&
                               absl::StartsWith(q.hostname(), "gpu8");
                      }) == 1);
}

}  // namespace
}  // namespace ctrun
