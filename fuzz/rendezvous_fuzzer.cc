// The rendezvous service's handlers without gRPC: RendezvousCore fed any
// sequence of agent messages (arbitrary protobuf bytes, or joins, rejoins
// and reports built from the input so that deep states are reached),
// closed sessions and clock ticks, with store requests (arbitrary protobuf
// bytes) applied through ApplyStoreRequest, as the server does, and
// restarts: the state goes through the journal's framing (cut short at a
// random point, as a crash would) into a new core, and agents resume. Never
// a crash, a checkpoint always restores, and within a job's round no two
// nodes hold the same group rank and every node's global ranks fit in the
// world.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/store_request.h"
#include "rendezvous/durable/journal.h"

namespace {

using ctrun::Effects;
using ctrun::RendezvousCore;
namespace v1 = ctrun::v1;

constexpr int kSessions = 6;
const char* const kJobs[] = {"a", "b"};

v1::Join MakeJoin(FuzzedDataProvider& in, ctrun::SessionId session) {
  v1::Join join;
  join.set_job_id(kJobs[in.ConsumeIntegralInRange(0, 1)]);
  auto* s = join.mutable_settings();
  s->set_min_nodes(in.ConsumeIntegralInRange(0, 4));
  s->set_max_nodes(in.ConsumeIntegralInRange(0, 5));
  s->set_max_restarts(in.ConsumeIntegralInRange(-1, 3));
  s->set_join_timeout_ms(in.ConsumeIntegralInRange(-1, 60000));
  s->set_last_call_timeout_ms(in.ConsumeIntegralInRange(-1, 5000));
  s->set_heartbeat_timeout_ms(in.ConsumeIntegralInRange(-1, 10000));
  auto* node = join.mutable_node();
  node->set_hostname("node" + std::to_string(session));
  node->set_pid(static_cast<int32_t>(session));
  node->set_incarnation(in.ConsumeIntegralInRange<uint64_t>(0, 3));
  join.set_address("127.0.0.1");
  join.set_local_world_size(in.ConsumeIntegralInRange(0, 9));
  join.set_node_rank_hint(in.ConsumeIntegralInRange(-2, 5));
  join.set_master_port_candidate(in.ConsumeIntegralInRange(0, 70000));
  if (in.ConsumeBool()) {
    join.mutable_resume()->set_round(in.ConsumeIntegralInRange(-1, 6));
  }
  return join;
}

v1::AgentMessage MakeMessage(FuzzedDataProvider& in, ctrun::SessionId session) {
  v1::AgentMessage m;
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      *m.mutable_join() = MakeJoin(in, session);
      break;
    case 1:
      m.mutable_rejoin()->set_round(in.ConsumeIntegralInRange(-1, 6));
      m.mutable_rejoin()->set_master_port_candidate(
          in.ConsumeIntegralInRange(0, 70000));
      break;
    case 2:
      m.mutable_heartbeat();
      break;
    case 3: {
      auto* r = m.mutable_worker_report();
      r->set_round(in.ConsumeIntegralInRange(-1, 6));
      r->set_state(static_cast<v1::WorkerReport::State>(
          in.ConsumeIntegralInRange(0, 4)));
      r->mutable_failure()->set_exit_code(in.ConsumeIntegral<int32_t>());
      r->mutable_failure()->set_message(in.ConsumeRandomLengthString(64));
      break;
    }
    default:  // whatever the bytes parse as
      if (!m.ParseFromString(in.ConsumeRandomLengthString(512))) m.Clear();
      break;
  }
  return m;
}

v1::StoreRequest MakeStoreRequest(FuzzedDataProvider& in) {
  v1::StoreRequest r;
  if (!r.ParseFromString(in.ConsumeRandomLengthString(512))) r.Clear();
  // Aim most requests at a job that may exist, in a round it may be in.
  if (in.ConsumeBool()) {
    r.mutable_scope()->set_job_id(kJobs[in.ConsumeIntegralInRange(0, 1)]);
    r.mutable_scope()->set_round(in.ConsumeIntegralInRange(0, 4));
  }
  return r;
}

// Group ranks handed out per (job, round), to catch duplicates.
using Ranks = std::map<std::pair<std::string, int64_t>,
                       std::map<int32_t, ctrun::SessionId>>;

void Check(const Effects& effects, Ranks& ranks,
           std::map<ctrun::SessionId, std::string>& job_of) {
  for (const auto& [session, m] : effects.messages) {
    if (m.has_job_finished() || m.has_job_failed()) {
      // The job ends; its id may start over at round 0.
      const std::string job = job_of[session];
      std::erase_if(ranks, [&](const auto& r) { return r.first.first == job; });
    }
    if (!m.has_assignment()) continue;
    const auto& a = m.assignment();
    if (a.group_rank() < 0 || a.group_rank() >= a.group_world_size() ||
        a.first_global_rank() < 0 || a.first_global_rank() >= a.world_size())
      std::abort();
    job_of[session] = a.job_id();
    auto& round = ranks[{a.job_id(), a.round()}];
    auto [it, fresh] = round.emplace(a.group_rank(), session);
    if (!fresh && it->second != session) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ctrun::RendezvousLimits limits;
  limits.max_jobs = 2;
  limits.store.max_keys = 16;
  limits.store.max_waiters = 8;
  auto core = std::make_unique<RendezvousCore>(limits);
  ctrun::SessionId base = 0;  // sessions of earlier services end with them
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  std::set<ctrun::SessionId> ended;
  Ranks ranks;
  std::map<ctrun::SessionId, std::string> job_of;
  int steps = 0;
  while (in.remaining_bytes() > 0 && ++steps < 200) {
    Effects effects;
    const auto session = base + static_cast<ctrun::SessionId>(
                                    in.ConsumeIntegralInRange(1, kSessions));
    switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0:
      case 1:
        // The server delivers nothing from a session it has ended.
        if (!ended.count(session)) {
          // As off the wire: gRPC delivers only what parses (string fields
          // are valid UTF-8).
          v1::AgentMessage message;
          if (message.ParseFromString(
                  MakeMessage(in, session).SerializeAsString())) {
            core->OnMessage(session, message, now, &effects);
          }
        }
        break;
      case 2:
        core->OnSessionClosed(session, now, &effects);
        ended.insert(session);
        break;
      case 3:
        now += absl::Milliseconds(in.ConsumeIntegralInRange(0, 20000));
        core->Tick(now, &effects);
        break;
      case 4: {
        const v1::StoreRequest request = MakeStoreRequest(in);
        auto store = core->Store(request.scope());
        if (!store.ok()) break;
        v1::StoreResponse response;
        std::optional<ctrun::KvStore::WaiterId> parked;
        std::vector<ctrun::KvStore::Change> changed;
        (void)ctrun::ApplyStoreRequest(
            **store, request, now, [](v1::StoreResponse) {}, &response, &parked,
            &effects.fired, &changed);
        // Committed or rolled back, as the service does after journaling.
        if (in.ConsumeBool()) (*store)->RollbackTo(0);
        (*store)->Commit(&effects.fired);
        break;
      }
      case 5: {
        std::string journal;
        for (const auto& record : core->Checkpoint()) {
          journal += ctrun::FrameRecord(record);
        }
        const bool crashed = in.ConsumeBool();
        if (crashed) {
          journal.resize(in.ConsumeIntegralInRange<size_t>(0, journal.size()));
        }
        ctrun::JournalContents contents = ctrun::ReadJournal(journal);
        if (!crashed && !contents.damage.empty()) std::abort();
        auto& jobs = contents.jobs;
        core = std::make_unique<RendezvousCore>(limits);
        for (const auto& [id, job] : jobs) {
          const absl::Status restored = core->Restore(
              job.snapshot, {job.keys.begin(), job.keys.end()},
              absl::Milliseconds(in.ConsumeIntegralInRange(1, 20000)), now);
          // A whole checkpoint always restores; a cut one may lack keys.
          if (!restored.ok() && !crashed) std::abort();
        }
        base += 100;
        ended.clear();
        ranks.clear();
        break;
      }
    }
    Check(effects, ranks, job_of);
    for (const auto& [s, status] : effects.finishes) ended.insert(s);
    for (auto& f : effects.fired) f.callback(std::move(f.result));
    // A job that ended is forgotten, and its id may start over at round 0.
    std::set<std::string> live;
    for (const auto& job : core->ListJobs(now)) live.insert(job.job_id());
    std::erase_if(ranks,
                  [&](const auto& r) { return !live.count(r.first.first); });
    (void)core->DescribeJob(kJobs[0], now);
  }
  return 0;
}
