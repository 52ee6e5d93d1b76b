// NCCL communicators for the job's workers.
//
// The unique id exchange works without GPUs (and is tested so): rank 0
// publishes its id under a key namespaced by run, round and communicator
// sequence number; the others wait for it and check its size.
// CreateNcclCommunicator exists when ctrun was built with CUDA and NCCL
// (ctrun::kHaveNccl).
#ifndef CTRUN_NCCL_H_
#define CTRUN_NCCL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace ctrun {

// The store key of communicator `sequence`'s unique id.
std::string NcclIdKey(const WorkerIdentity& identity, int sequence);

// On rank 0, publishes `rank0_id` and returns it; on the others, waits up to
// `timeout` for rank 0's and returns it. DATA_LOSS when what arrives is not
// `expected_size` bytes; DEADLINE_EXCEEDED when it does not arrive.
absl::StatusOr<std::string> ShareUniqueId(
    WorkerStore& store, const WorkerIdentity& identity, int sequence,
    absl::string_view rank0_id, size_t expected_size, absl::Duration timeout);

#if defined(CTRUN_WITH_NCCL)
inline constexpr bool kHaveNccl = true;

// An initialised NCCL communicator on this worker's GPU; destroys (or, if
// initialisation did not finish, aborts) the communicator on destruction.
class NcclCommunicator {
 public:
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void* comm() const { return comm_; }  // an ncclComm_t
  int device() const { return device_; }

  // Sums `count` doubles across all ranks, in place: the values go to this
  // worker's GPU, are all-reduced there by NCCL, and come back.
  absl::Status AllReduceSum(double* host_values, size_t count);

  friend absl::StatusOr<std::unique_ptr<NcclCommunicator>>
  CreateNcclCommunicator(const WorkerIdentity&, WorkerStore&, int,
                         absl::Duration);

 private:
  NcclCommunicator(void* comm, int device) : comm_(comm), device_(device) {}
  void* comm_;
  int device_;
};

// Binds this worker to GPU LOCAL_RANK (of those CUDA_VISIBLE_DEVICES shows),
// exchanges the unique id through the store and initialises a communicator
// without blocking: if it is not ready within `timeout`, or the round ends
// meanwhile (a peer failed), it is aborted and the call fails
// (DEADLINE_EXCEEDED or ABORTED). NCCL and CUDA errors carry the library's
// own text.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(
    const WorkerIdentity& identity, WorkerStore& store, int sequence = 0,
    absl::Duration timeout = absl::Seconds(120));
#else
inline constexpr bool kHaveNccl = false;
#endif

}  // namespace ctrun

#endif  // CTRUN_NCCL_H_
