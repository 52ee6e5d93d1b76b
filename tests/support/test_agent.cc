// test_agent: a minimal agent process for integration tests. It joins a
// job, heartbeats, rejoins when told to, and prints one line per event on
// stdout:
//   assignment round=R group_rank=G first_rank=F world=W
//   restart round=R reason=NAME detail=...
//   finished | failed reason=...
//   ended code=CODE message=...
// It exits 0 when the session ended OK, 3 otherwise.
//
// usage: test_agent ENDPOINT JOB HOST MIN MAX HEARTBEAT_TIMEOUT_MS [TOKEN]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rendezvous/client/client.h"

using namespace ctrun;

namespace {

absl::Mutex mu;
SessionStream* stream ABSL_GUARDED_BY(mu) = nullptr;

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr,
                 "usage: test_agent ENDPOINT JOB HOST MIN MAX HB_MS [TOKEN]\n");
    return 2;
  }
  ConnectionOptions options;
  options.endpoint = argv[1];
  if (argc > 7) options.token = argv[7];
  auto connection = Connection::Open(options);
  if (!connection.ok()) {
    std::fprintf(stderr, "%s\n", connection.status().ToString().c_str());
    return 2;
  }
  v1::Join join;
  join.set_job_id(argv[2]);
  join.mutable_node()->set_hostname(argv[3]);
  join.mutable_node()->set_pid(getpid());
  join.mutable_node()->set_incarnation(std::random_device{}() | 1);
  join.set_address("127.0.0.1");
  join.set_local_world_size(1);
  join.set_node_rank_hint(-1);
  join.set_master_port_candidate(29500);
  join.mutable_settings()->set_min_nodes(std::atoi(argv[4]));
  join.mutable_settings()->set_max_nodes(std::atoi(argv[5]));
  join.mutable_settings()->set_heartbeat_timeout_ms(std::atoll(argv[6]));

  SessionStream::Handlers handlers;
  handlers.on_message = [](const v1::ServerMessage& m) {
    if (m.has_assignment()) {
      const auto& a = m.assignment();
      Print("assignment round=" + std::to_string(a.round()) +
            " group_rank=" + std::to_string(a.group_rank()) +
            " first_rank=" + std::to_string(a.first_global_rank()) +
            " world=" + std::to_string(a.world_size()));
    } else if (m.has_restart_required()) {
      const auto& r = m.restart_required();
      Print("restart round=" + std::to_string(r.round()) +
            " reason=" + v1::RestartRequired::Reason_Name(r.reason()) +
            " detail=" + r.detail());
      v1::AgentMessage rejoin;
      rejoin.mutable_rejoin()->set_round(r.round());
      rejoin.mutable_rejoin()->set_master_port_candidate(29501);
      absl::MutexLock lock(&mu);
      if (stream) stream->Send(rejoin);
    } else if (m.has_job_finished()) {
      Print("finished");
    } else if (m.has_job_failed()) {
      Print("failed reason=" + m.job_failed().reason());
    }
  };
  handlers.on_done = [](const absl::Status& s, bool) {
    Print("ended code=" + absl::StatusCodeToString(s.code()) +
          " message=" + std::string(s.message()));
  };
  auto session = SessionStream::Start(*connection, join, handlers);
  {
    absl::MutexLock lock(&mu);
    stream = session.get();
  }
  const auto interval = absl::Milliseconds(std::atoll(argv[6]) / 4 + 1);
  while (true) {
    if (auto done = session->WaitFor(interval)) {
      absl::MutexLock lock(&mu);
      stream = nullptr;
      return done->ok() ? 0 : 3;
    }
    v1::AgentMessage heartbeat;
    heartbeat.mutable_heartbeat();
    session->Send(heartbeat);
  }
}
