// In-process recovery for C++ workers (ctrun --recovery=inprocess): a Gloo
// communicator formed again in each new round without leaving the process.
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
// When the agent says that the round ends (the worker's world file,
// CTRUN_WORLD_FILE), a helper thread releases a collective blocked on a
// peer that will never answer: it shuts down the process's connected TCP
// sockets (never a listening one, never the store's connection), so that
// Gloo throws at once. Reform() then takes the new world (ranks, sizes,
// master, round) into the environment and identity, opens the store in the
// new round and connects a new Gloo context. The agent keeps a worker only
// while it marks itself resilient (Create does), and restarts one that does
// not take the new world within --recovery_timeout.
#ifndef CTRUN_RECOVERY_H_
#define CTRUN_RECOVERY_H_

#include <gloo/context.h>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace ctrun {

// This worker's restart count (TORCHELASTIC_RESTART_COUNT), updated in
// place by ResilientGloo::Reform; 0 outside ctrun.
int Round();

class ResilientGloo {
 public:
  // Reads the identity, connects the store and the first Gloo context
  // (`timeout` for peers to show up, as CreateGlooContext). Outside
  // --recovery=inprocess it works as a plain context and Reform() always
  // fails with FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<ResilientGloo>> Create(
      absl::Duration timeout = absl::Seconds(60));
  ~ResilientGloo();
  ResilientGloo(const ResilientGloo&) = delete;
  ResilientGloo& operator=(const ResilientGloo&) = delete;

  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  const WorkerIdentity& identity() const { return identity_; }
  WorkerStore& store() { return *store_; }

  // After a failed collective: waits up to `grace` for the agent to say
  // that the round ended (NOT_FOUND when it does not: the failure is the
  // worker's own), then for the new round's world; takes it and forms a new
  // context. DEADLINE_EXCEEDED, UNAVAILABLE: as CreateGlooContext.
  absl::Status Reform(absl::Duration grace = absl::Seconds(2));

  class Watcher;

 private:
  ResilientGloo() = default;

  absl::Duration timeout_;
  WorkerIdentity identity_;
  std::unique_ptr<WorkerStore> store_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<Watcher> watcher_;  // null outside --recovery=inprocess
};

}  // namespace ctrun

#endif  // CTRUN_RECOVERY_H_
