// What the parts of RendezvousCore share and nobody else sees: the state
// of a job and its nodes, and the small helpers every part uses. The core
// is written as several files by concern (rendezvous_core.h says which);
// this header is theirs alone.
#ifndef CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_STATE_H_
#define CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_STATE_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rendezvous/core/coordinated_stop.h"
#include "rendezvous/core/rendezvous_core.h"
#include "rendezvous/core/straggler_watch.h"

namespace ctrun {

using NodeState = v1::NodeStatus::State;

struct RendezvousCore::Node {
  SessionId session = 0;
  // Identity, address, sizes and the latest master port candidate.
  v1::Join join;
  // Changed only through Job::SetState, which keeps the counts.
  NodeState state = v1::NodeStatus::STATE_UNSPECIFIED;
  absl::Time last_seen;
  // In the running round; -1 otherwise.
  int32_t group_rank = -1;
  int32_t first_global_rank = -1;
  // The node's group rank in the round before, to keep survivors in order.
  int32_t previous_group_rank = -1;
  // A spare given a lost member's slot for the collecting round: that
  // member's group rank, which the node ranks by, and its name
  // (Assignment.took_slot_of). -1 and empty otherwise. A spare takes the
  // member's rank hint for good (join.node_rank_hint), with
  // `inherited_hint` set.
  int32_t spare_slot = -1;
  std::string took_slot_of;
  bool inherited_hint = false;
  // The round a PENDING_REJOIN node was told to rejoin.
  int64_t rejoin_round = -1;
  bool workers_running = false;
  // In-process recovery in the running round, as the node reported it.
  int32_t kept_workers = 0;
  double recovery_s = 0;

  // The group rank this node ranks by in a collecting round: its own of
  // the round before, or the slot it was given as a spare.
  int32_t SlotToKeep() const {
    return previous_group_rank >= 0 ? previous_group_rank : spare_slot;
  }
  std::string Name() const {
    const auto& node = join.node();
    return absl::StrCat(node.name().empty() ? node.hostname() : node.name(),
                        ":", node.pid());
  }
};

struct RendezvousCore::Job {
  Job(const KvStoreLimits& store_limits, StoreBudget* budget)
      : store(store_limits, budget) {}

  std::string id;
  v1::JobSettings settings;
  v1::JobStatus::Phase phase = v1::JobStatus::COLLECTING;
  int64_t round = 0;
  int32_t restart_count = 0;
  absl::Time round_opened;
  // When this service first held the job (its creation, or its restore).
  absl::Time created;
  absl::Time last_call_deadline = absl::InfiniteFuture();

  std::map<SessionId, Node> nodes;
  // Indexes of `nodes`, so that a join costs O(log n), not O(n).
  std::array<int, v1::NodeStatus::State_ARRAYSIZE> count{};
  absl::flat_hash_map<uint64_t, SessionId> by_incarnation;
  absl::flat_hash_map<int32_t, SessionId> by_hint;
  // The running round's members in group rank order.
  std::vector<SessionId> ranked;
  // Members of the running round that left after their workers succeeded:
  // their success stands (the job finishes when the rest succeed).
  std::set<SessionId> succeeded_and_left;
  int32_t world_size = 0;
  std::string master_addr;
  int32_t master_port = 0;

  KvStore store;
  std::string failure;
  std::deque<std::string> lost;
  // Spares given a lost member's slot, newest last (JobStatus.promotions).
  std::deque<std::string> promotions;
  int32_t spares_promoted = 0;

  // A worker failure with no restart left waits this long for a node loss
  // that would explain it (its peers die when a node does, often before the
  // loss reaches us); the job fails when none comes.
  struct PendingFailure {
    std::string reason;
    absl::Time deadline;
  };
  // The worker failure that fails the job (JobFailed.root_cause), and its
  // node's name.
  std::optional<v1::WorkerFailure> root_cause;
  std::string root_cause_node;
  // Keeps `failure` as the root cause, within what a message may hold.
  void SetRootCause(const std::string& node_name,
                    const v1::WorkerFailure& failure);
  std::optional<PendingFailure> pending_failure;
  // The last restart spent on a worker failure: refunded when, within the
  // settle time, a node of that round turns out to have been lost.
  int64_t failure_restart_round = -1;
  // Why a restart was given back, for the next round's assignments.
  std::string refund_reason;
  // What opened the latest round after the first (JobStatus.last_restart).
  std::optional<v1::RestartRequired> last_restart;
  absl::Time failure_restart_at = absl::InfinitePast();

  // Restored from a journal: the survivors of its collecting round are not
  // known, so the round waits for its last call like a first one.
  bool survivors_unknown = false;
  // Restored without nodes: forgotten unless one joins by then.
  absl::Time forget_at = absl::InfiniteFuture();

  // The longest silences its agents reported, by section (--hang_timeout
  // =auto): kept across rounds, so that a restarted job does not relearn.
  std::map<std::string, int64_t> longest_ms;
  StragglerWatch stragglers;
  // The running round's coordinated stop (a preemption), if one was asked.
  CoordinatedStop stop;
  // A hung worker's failure (with pending_failure): the job fails as hung.
  bool failure_hung = false;
  // Worker failures in a row whose attempt made no progress, and whether
  // that failed the job.
  int no_progress_failures = 0;
  bool failure_no_progress = false;

  void FillLongest(
      google::protobuf::RepeatedPtrField<v1::LearnedInterval>* out) const {
    for (const auto& [section, ms] : longest_ms) {
      auto* l = out->Add();
      l->set_section(section);
      l->set_longest_ms(ms);
    }
  }

  bool progress_due = false;
  absl::Time next_progress = absl::InfinitePast();
  // A lower bound on the earliest lease expiry among the nodes.
  absl::Time lease_check = absl::InfiniteFuture();

  absl::Duration heartbeat_timeout() const {
    return absl::Milliseconds(settings.heartbeat_timeout_ms());
  }
  absl::Time join_deadline() const {
    return round_opened + absl::Milliseconds(settings.join_timeout_ms());
  }
  int CountIn(NodeState state) const { return count[state]; }

  Node& AddNode(SessionId session, const v1::Join& join) {
    Node& node = nodes[session];
    node.session = session;
    node.join = join;
    ++count[node.state];
    by_incarnation[join.node().incarnation()] = session;
    if (join.node_rank_hint() >= 0) by_hint[join.node_rank_hint()] = session;
    return node;
  }
  Node TakeNode(SessionId session) {
    auto it = nodes.find(session);
    Node node = std::move(it->second);
    nodes.erase(it);
    --count[node.state];
    by_incarnation.erase(node.join.node().incarnation());
    by_hint.erase(node.join.node_rank_hint());
    return node;
  }
  // Moves a node to another session id (a detached node resuming).
  void Rekey(SessionId from, SessionId to) {
    Node node = TakeNode(from);
    const NodeState state = node.state;
    node.state = v1::NodeStatus::STATE_UNSPECIFIED;
    node.session = to;
    Node& moved = AddNode(to, node.join);
    moved = std::move(node);
    SetState(moved, state);
    std::replace(ranked.begin(), ranked.end(), from, to);
  }
  // `node` ranks by `hint` from now on (a spare taking a lost member's).
  void SetHint(Node& node, int32_t hint) {
    if (auto it = by_hint.find(node.join.node_rank_hint());
        it != by_hint.end() && it->second == node.session) {
      by_hint.erase(it);
    }
    node.join.set_node_rank_hint(hint);
    if (hint >= 0) by_hint[hint] = node.session;
  }
  void SetState(Node& node, NodeState state) {
    --count[node.state];
    ++count[state];
    node.state = state;
  }
};

namespace core_internal {

inline constexpr size_t kMaxLostShown = 32;
inline constexpr int kMaxNamesInProgress = 16;
inline constexpr int kMaxOtherJobsInProgress = 4;
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr int32_t kMaxLocalWorldSize = 65536;
inline constexpr size_t kMaxFailureMessageBytes = 4096;
// Worker failures in a row, each of an attempt that made no progress, that
// fail a job whatever restarts it has left.
inline constexpr int kNoProgressFailures = 3;
// Sections a job learns at most, and the longest name.
inline constexpr size_t kMaxLearnedSections = 64;
inline constexpr size_t kMaxSectionBytes = 63;

// OK, or INVALID_ARGUMENT naming the first field of `join` out of bounds.
absl::Status ValidateJoin(const v1::Join& join, bool port_fixed);

v1::ServerMessage RestartMessage(int64_t round,
                                 v1::RestartRequired::Reason reason,
                                 const std::string& detail,
                                 int32_t restart_count);

// A new event of `job` in `round` among `effects`, for the caller to fill.
v1::Event& AddEvent(const std::string& job, int64_t round, const char* what,
                    Effects* effects);

// At most `max` bytes of `text`, not cutting a UTF-8 character in two:
// every string field of a message must stay valid UTF-8, or its receiver
// cannot parse it.
absl::string_view Utf8Prefix(absl::string_view text, size_t max);

// "worker rank R (local L) on NODE exited with code C: message".
std::string DescribeFailure(const std::string& node_name,
                            const v1::WorkerFailure& f);

}  // namespace core_internal
}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_CORE_RENDEZVOUS_CORE_STATE_H_
