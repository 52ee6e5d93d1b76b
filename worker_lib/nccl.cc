#include "ctrun/nccl.h"

#include "absl/strings/str_cat.h"

#if defined(CTRUN_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/time/clock.h"
#endif

namespace ctrun {

std::string NcclIdKey(const WorkerIdentity& identity, int sequence) {
  return absl::StrCat("nccl-unique-id/", identity.run_id, "/",
                      identity.store_round, "/", sequence);
}

absl::StatusOr<std::string> ShareUniqueId(
    WorkerStore& store, const WorkerIdentity& identity, int sequence,
    absl::string_view rank0_id, size_t expected_size, absl::Duration timeout) {
  const std::string key = NcclIdKey(identity, sequence);
  if (identity.rank == 0) {
    if (rank0_id.size() != expected_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("unique id has ", rank0_id.size(), " bytes, expected ",
                       expected_size));
    }
    if (auto s = store.Set(key, std::string(rank0_id)); !s.ok()) return s;
    return std::string(rank0_id);
  }
  auto id = store.Get(key, timeout);
  if (!id.ok()) return id.status();
  if (id->size() != expected_size) {
    return absl::DataLossError(absl::StrCat(
        "unique id under '", key, "' has ", id->size(), " bytes; expected ",
        expected_size, " (ranks built against different NCCL versions?)"));
  }
  return id;
}

#if defined(CTRUN_WITH_NCCL)
namespace {

// CUDA and NCCL results become statuses here, with the call and the
// library's own error text.
absl::Status CudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(e)));
}
absl::Status NcclStatus(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::InternalError(
      absl::StrCat(call, ": ", ncclGetErrorString(r), last && *last ? " (" : "",
                   last ? last : "", last && *last ? ")" : ""));
}

#define CTRUN_CUDA(call)                                               \
  do {                                                                 \
    if (absl::Status s = CudaStatus((call), #call); !s.ok()) return s; \
  } while (0)

// Waits for a non-blocking NCCL operation on `comm`; gives up at
// `deadline` or when `still_wanted` says the round has ended.
template <typename StillWanted>
absl::Status AwaitNccl(ncclComm_t comm, absl::Time deadline,
                       StillWanted still_wanted) {
  absl::Time next_check = absl::Now();
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (auto s = NcclStatus(ncclCommGetAsyncError(comm, &state),
                            "ncclCommGetAsyncError", comm);
        !s.ok()) {
      return s;
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return NcclStatus(state, "NCCL initialisation", comm);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          "NCCL communicator not ready before the deadline");
    }
    if (now >= next_check) {
      if (auto s = still_wanted(); !s.ok()) return s;
      next_check = now + absl::Milliseconds(200);
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
}

}  // namespace

NcclCommunicator::~NcclCommunicator() {
  ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

absl::Status NcclCommunicator::AllReduceSum(double* host_values, size_t count) {
  ncclComm_t comm = static_cast<ncclComm_t>(comm_);
  const size_t bytes = count * sizeof(double);
  CTRUN_CUDA(cudaSetDevice(device_));
  void* device_buffer = nullptr;
  CTRUN_CUDA(cudaMalloc(&device_buffer, bytes));
  // Freed on every path below.
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_buffer{device_buffer};
  CTRUN_CUDA(
      cudaMemcpy(device_buffer, host_values, bytes, cudaMemcpyHostToDevice));
  if (auto s = NcclStatus(ncclAllReduce(device_buffer, device_buffer, count,
                                        ncclDouble, ncclSum, comm, nullptr),
                          "ncclAllReduce", comm);
      !s.ok()) {
    return s;
  }
  if (auto s = AwaitNccl(comm, absl::InfiniteFuture(),
                         [] { return absl::OkStatus(); });
      !s.ok()) {
    return s;
  }
  CTRUN_CUDA(cudaStreamSynchronize(nullptr));
  CTRUN_CUDA(
      cudaMemcpy(host_values, device_buffer, bytes, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(
    const WorkerIdentity& identity, WorkerStore& store, int sequence,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int devices = 0;
  CTRUN_CUDA(cudaGetDeviceCount(&devices));
  if (identity.local_rank >= devices) {
    const char* visible = getenv("CUDA_VISIBLE_DEVICES");
    return absl::FailedPreconditionError(absl::StrCat(
        "LOCAL_RANK=", identity.local_rank, " but only ", devices,
        " GPUs are visible", visible ? " (CUDA_VISIBLE_DEVICES=" : "",
        visible ? visible : "", visible ? ")" : ""));
  }
  CTRUN_CUDA(cudaSetDevice(identity.local_rank));

  ncclUniqueId uid;
  std::memset(&uid, 0, sizeof uid);
  if (identity.rank == 0) {
    if (auto s = NcclStatus(ncclGetUniqueId(&uid), "ncclGetUniqueId", nullptr);
        !s.ok()) {
      return s;
    }
  }
  auto shared = ShareUniqueId(
      store, identity, sequence,
      absl::string_view(reinterpret_cast<const char*>(&uid), sizeof uid),
      sizeof uid, deadline - absl::Now());
  if (!shared.ok()) return shared.status();
  std::memcpy(&uid, shared->data(), sizeof uid);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  if (auto s = NcclStatus(ncclCommInitRankConfig(&comm, identity.world_size,
                                                 uid, identity.rank, &config),
                          "ncclCommInitRankConfig", comm);
      !s.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    return s;
  }
  // A peer that died leaves the others waiting in init; the round then
  // moves on and the store answers ABORTED, which ends the wait early.
  const std::string key = NcclIdKey(identity, sequence);
  auto still_wanted = [&store, &key]() -> absl::Status {
    return store.Check({key}).status();
  };
  if (auto s = AwaitNccl(comm, deadline, still_wanted); !s.ok()) {
    ncclCommAbort(comm);
    return s;
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, identity.local_rank));
}
#endif  // CTRUN_WITH_NCCL

}  // namespace ctrun
