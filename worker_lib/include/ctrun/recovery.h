// In-process recovery for C++ workers (ctrun --recovery=inprocess):
// communicators formed again in each new round without leaving the process.
//
//   auto comm = ctrun::ResilientGloo::Create();
//   if (!comm.ok()) ...;
//   for (;;) {
//     try {
//       Train(**comm);  // collectives on (*comm)->context()
//       break;
//     } catch (const std::exception& e) {
//       // A dead peer fails the collective; a round change is not a fault.
//       if (absl::Status s = (*comm)->Reform(); !s.ok()) throw;
//     }
//   }
//
// ResilientNccl (with NCCL) is the same over an NcclCommunicator, whose
// collectives return a status instead of throwing: on an error, Reform().
//
// When the agent says that the round ends (the worker's world file,
// CTRUN_WORLD_FILE), a helper thread releases a collective blocked on a
// peer that will never answer: it shuts down the process's connected TCP
// sockets (never a listening one, never the store's connection), so that
// Gloo throws at once; an NcclCommunicator aborts itself when its round
// ends. Reform() then takes the new world (ranks, sizes, master, round) into
// the environment and identity, opens the store in the new round and forms
// a new communicator. The agent keeps a worker only while it marks itself
// resilient (Create does), and restarts one that does not take the new
// world within --recovery_timeout.
#ifndef CTRUN_RECOVERY_H_
#define CTRUN_RECOVERY_H_

#include <gloo/context.h>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/nccl.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace ctrun {

// The job's round this worker runs in (CTRUN_STORE_ROUND): 0 at the job's
// first start, one more for every restart, lost node and new node, wherever
// the worker runs (a promoted spare's included); updated in place by
// Reform() and WaitForSlot(). TORCHELASTIC_RESTART_COUNT, which counts
// failures only, outside ctrun; 0 without either.
int Round();

// On a spare node (ctrun --spares), ctrun starts the workers of a program
// that calls this before its node has a slot: they park here, without a
// rank, until the node takes a lost node's slot, and then return with the
// slot's identity (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) in the
// environment, where WorkerIdentity::FromEnvironment finds it. Call it
// before reading the identity and after the work that needs none (loading
// the model, the data). Returns at once in every other worker, and outside
// ctrun. ctrun knows that a program parks by this function's name in it.
void WaitForSlot();

// What the communicators below share: the worker's identity and store in
// the current round, and the passage to the next one.
class ResilientWorld {
 public:
  // Reads the identity and connects the store. Outside
  // --recovery=inprocess, NextRound() always fails with
  // FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<ResilientWorld>> Create();
  ~ResilientWorld();
  ResilientWorld(const ResilientWorld&) = delete;
  ResilientWorld& operator=(const ResilientWorld&) = delete;

  const WorkerIdentity& identity() const { return identity_; }
  WorkerStore& store() { return *store_; }

  // Waits up to `grace` for the agent to say that the round ended
  // (NOT_FOUND when it does not: the failure is the worker's own), then
  // for the new round's world; takes it into the environment and the
  // identity and opens the store in the new round. `drop` runs first: it
  // must release what uses the old store (the old communicator).
  absl::Status NextRound(absl::Duration grace,
                         const std::function<void()>& drop);
  // The communicator of the current round is formed (the agent's board).
  void Formed();

  class Watcher;

 private:
  ResilientWorld();

  WorkerIdentity identity_;
  std::unique_ptr<WorkerStore> store_;
  std::unique_ptr<Watcher> watcher_;  // null outside --recovery=inprocess
};

class ResilientGloo {
 public:
  // The world and its first Gloo context (`timeout` for peers to show up,
  // as CreateGlooContext).
  static absl::StatusOr<std::unique_ptr<ResilientGloo>> Create(
      absl::Duration timeout = absl::Seconds(60));

  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  const WorkerIdentity& identity() const { return world_->identity(); }
  WorkerStore& store() { return world_->store(); }

  // After a failed collective: the next round (ResilientWorld::NextRound)
  // and a new context in it. DEADLINE_EXCEEDED, UNAVAILABLE: as
  // CreateGlooContext.
  absl::Status Reform(absl::Duration grace = absl::Seconds(2));

 private:
  absl::Status Form();

  std::unique_ptr<ResilientWorld> world_;
  absl::Duration timeout_;
  std::shared_ptr<gloo::Context> context_;
};

#if defined(CTRUN_WITH_NCCL)
class ResilientNccl {
 public:
  // The world and its first NCCL communicator (CreateNcclCommunicator).
  static absl::StatusOr<std::unique_ptr<ResilientNccl>> Create(
      absl::Duration timeout = absl::Seconds(120));

  NcclCommunicator& communicator() { return *communicator_; }
  const WorkerIdentity& identity() const { return world_->identity(); }
  WorkerStore& store() { return world_->store(); }

  // After a collective returned an error: the next round and a new
  // communicator in it (the old one aborted).
  absl::Status Reform(absl::Duration grace = absl::Seconds(2));

 private:
  absl::Status Form();

  std::unique_ptr<ResilientWorld> world_;
  absl::Duration timeout_;
  std::unique_ptr<NcclCommunicator> communicator_;
};
#endif

}  // namespace ctrun

#endif  // CTRUN_RECOVERY_H_
