// A Gloo context for the job's workers, rendezvoused through the job's
// store, over TCP on this node's address.
#ifndef CTRUN_GLOO_H_
#define CTRUN_GLOO_H_

#include <gloo/context.h>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace ctrun {

// Connects every rank to every other. All ranks must call it with the same
// `sequence` (a new number for each context in the same round).
// DEADLINE_EXCEEDED when peers do not show up within `timeout`; ABORTED
// when the round ended meanwhile; UNAVAILABLE for transport errors.
absl::StatusOr<std::shared_ptr<gloo::Context>> CreateGlooContext(
    const WorkerIdentity& identity, WorkerStore& store, int sequence = 0,
    absl::Duration timeout = absl::Seconds(60));

}  // namespace ctrun

#endif  // CTRUN_GLOO_H_
