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

// The GPU a worker uses, of the `device_count` it sees: device LOCAL_RANK,
// or device 0 when it sees exactly one (a scheduler that gives each
// process its own GPU through CUDA_VISIBLE_DEVICES); `note` then says so.
// FAILED_PRECONDITION naming LOCAL_RANK and `cuda_visible_devices` (null:
// unset) when there is no such device.
struct GpuChoice {
  int device = 0;
  std::string note;  // empty when device == LOCAL_RANK
};
absl::StatusOr<GpuChoice> ChooseGpu(int local_rank, int device_count,
                                    const char* cuda_visible_devices);

// Publishes `gpu_id` (a PCI bus id) as this worker's GPU and fails
// (FAILED_PRECONDITION, naming both LOCAL_RANKs and the GPU) when a worker
// of a lower LOCAL_RANK on this node published the same one: two workers
// on one GPU would otherwise wait for NCCL's own refusal, or share it
// silently. Waits up to `timeout` for those peers.
absl::Status CheckGpuNotShared(WorkerStore& store,
                               const WorkerIdentity& identity, int sequence,
                               absl::string_view gpu_id,
                               absl::Duration timeout);

#if defined(CTRUN_WITH_NCCL)
inline constexpr bool kHaveNccl = true;

// An initialised NCCL communicator on this worker's GPU, with the stream
// and device buffer its collectives reuse. Destruction finalizes and
// destroys it, or aborts it when NCCL reported an error.
class NcclCommunicator {
 public:
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  void* comm() const { return comm_; }      // an ncclComm_t
  void* stream() const { return stream_; }  // a cudaStream_t
  int device() const { return device_; }

  // Sums `count` doubles across all ranks, in place: the values go to this
  // worker's GPU, are all-reduced there by NCCL, and come back. Never
  // blocks in CUDA: the stream is polled, and when NCCL reports an error,
  // the round ends (a peer failed: ABORTED) or `timeout` passes
  // (DEADLINE_EXCEEDED), the communicator is aborted and every later call
  // fails at once with that first error.
  absl::Status AllReduceSum(double* host_values, size_t count,
                            absl::Duration timeout = absl::InfiniteDuration());

  friend absl::StatusOr<std::unique_ptr<NcclCommunicator>>
  CreateNcclCommunicator(const WorkerIdentity&, WorkerStore&, int,
                         absl::Duration);

 private:
  NcclCommunicator(void* comm, int device, WorkerStore& store, std::string key)
      : comm_(comm), device_(device), store_(store), key_(std::move(key)) {}
  // Aborts the communicator and remembers why.
  absl::Status Abort(absl::Status why);

  void* comm_;
  int device_;
  WorkerStore& store_;  // asked whether the round still runs
  std::string key_;     // this communicator's unique id key
  void* stream_ = nullptr;
  void* buffer_ = nullptr;
  size_t buffer_bytes_ = 0;
  absl::Status broken_;  // set once aborted
};

// Binds this worker to its GPU (ChooseGpu), checks that no other worker on
// this node uses it (CheckGpuNotShared; not with NCCL_MULTI_RANK_GPU_ENABLE=1),
// exchanges the unique id through the store and initialises a communicator
// without blocking: if it is not ready within `timeout`, or the round ends
// meanwhile (a peer failed), it is aborted and the call fails
// (DEADLINE_EXCEEDED or ABORTED). NCCL and CUDA errors carry the library's
// own text, NCCL's last error included. `store` must outlive the
// communicator.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(
    const WorkerIdentity& identity, WorkerStore& store, int sequence = 0,
    absl::Duration timeout = absl::Seconds(120));
#else
inline constexpr bool kHaveNccl = false;
#endif

}  // namespace ctrun

#endif  // CTRUN_NCCL_H_
