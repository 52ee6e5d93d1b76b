#include "tests/support/session_probe.h"

#include <unistd.h>

namespace ctrun::testing {

v1::Join MakeJoin(const JoinSpec& spec) {
  static std::atomic<uint64_t> counter{1};
  v1::Join join;
  join.set_job_id(spec.job);
  join.mutable_node()->set_hostname(spec.host);
  join.mutable_node()->set_pid(getpid());
  join.mutable_node()->set_incarnation(
      spec.incarnation != 0
          ? spec.incarnation
          : (std::hash<std::string>{}(spec.host) ^ (counter++ << 20)) | 1);
  join.set_address("127.0.0.1");
  join.set_local_world_size(spec.local_world_size);
  join.set_node_rank_hint(-1);
  join.set_master_port_candidate(29500);
  auto* s = join.mutable_settings();
  s->set_min_nodes(spec.min_nodes);
  s->set_max_nodes(spec.max_nodes);
  s->set_heartbeat_timeout_ms(spec.heartbeat_timeout_ms);
  s->set_last_call_timeout_ms(spec.last_call_timeout_ms);
  return join;
}

SessionProbe::SessionProbe(const Connection& connection, const v1::Join& join,
                           absl::Duration heartbeat_every) {
  SessionStream::Handlers handlers;
  handlers.on_message = [this](const v1::ServerMessage& m) {
    absl::MutexLock lock(&mu_);
    received_.push_back(m);
  };
  stream_ = SessionStream::Start(connection, join, handlers);
  if (heartbeat_every > absl::ZeroDuration()) {
    heartbeat_ = std::thread([this, heartbeat_every] {
      while (!stop_) {
        if (stream_->WaitFor(heartbeat_every)) return;
        v1::AgentMessage m;
        m.mutable_heartbeat();
        stream_->Send(m);
      }
    });
  }
}

SessionProbe::~SessionProbe() {
  stop_ = true;
  stream_->Cancel();
  if (heartbeat_.joinable()) heartbeat_.join();
  stream_.reset();
}

std::optional<v1::ServerMessage> SessionProbe::Next(const Predicate& matches,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  // absl may evaluate a condition on other threads, so it must be pure; the
  // scan that moves the cursor runs here.
  auto unseen = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cursor_ < received_.size();
  };
  while (true) {
    while (cursor_ < received_.size()) {
      const auto& m = received_[cursor_++];
      if (matches(m)) return m;
    }
    if (!mu_.AwaitWithDeadline(absl::Condition(&unseen), deadline)) {
      return std::nullopt;
    }
  }
}

std::optional<v1::Assignment> SessionProbe::NextAssignment(
    absl::Duration timeout) {
  auto m = Next([](const auto& m) { return m.has_assignment(); }, timeout);
  if (!m) return std::nullopt;
  return m->assignment();
}

std::optional<v1::RestartRequired> SessionProbe::NextRestart(
    absl::Duration timeout) {
  auto m =
      Next([](const auto& m) { return m.has_restart_required(); }, timeout);
  if (!m) return std::nullopt;
  return m->restart_required();
}

std::optional<absl::Status> SessionProbe::WaitDone(absl::Duration timeout) {
  return stream_->WaitFor(timeout);
}

void SessionProbe::Rejoin(int64_t round) {
  v1::AgentMessage m;
  m.mutable_rejoin()->set_round(round);
  m.mutable_rejoin()->set_master_port_candidate(29501);
  stream_->Send(m);
}

void SessionProbe::Report(int64_t round, v1::WorkerReport::State state) {
  v1::AgentMessage m;
  m.mutable_worker_report()->set_round(round);
  m.mutable_worker_report()->set_state(state);
  if (state == v1::WorkerReport::FAILED) {
    m.mutable_worker_report()->mutable_failure()->set_exit_code(1);
  }
  stream_->Send(m);
}

}  // namespace ctrun::testing
