#include "ctrun/nccl.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#if defined(CTRUN_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
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

absl::StatusOr<GpuChoice> ChooseGpu(int local_rank, int device_count,
                                    const char* cuda_visible_devices) {
  const std::string visible =
      cuda_visible_devices == nullptr
          ? std::string()
          : absl::StrCat(" (CUDA_VISIBLE_DEVICES=", cuda_visible_devices, ")");
  if (device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("LOCAL_RANK=", local_rank,
                     " needs a GPU but none is visible", visible));
  }
  if (local_rank < device_count) return GpuChoice{local_rank, ""};
  if (device_count == 1) {
    return GpuChoice{
        0, absl::StrCat("LOCAL_RANK=", local_rank, " sees exactly one GPU",
                        visible, " and uses it as device 0")};
  }
  return absl::FailedPreconditionError(
      absl::StrCat("LOCAL_RANK=", local_rank, " but only ", device_count,
                   " GPUs are visible", visible,
                   "; run at most that many workers per node "
                   "(--nproc_per_node=gpu)"));
}

absl::Status CheckGpuNotShared(WorkerStore& store,
                               const WorkerIdentity& identity, int sequence,
                               absl::string_view gpu_id,
                               absl::Duration timeout) {
  // Same-node workers hold consecutive global ranks, LOCAL_RANK 0 first.
  auto key = [&](int rank) {
    return absl::StrCat("nccl-gpu/", identity.run_id, "/", identity.store_round,
                        "/", sequence, "/", rank);
  };
  if (auto s = store.Set(key(identity.rank), std::string(gpu_id)); !s.ok()) {
    return s;
  }
  const absl::Time deadline = absl::Now() + timeout;
  const int first = identity.rank - identity.local_rank;
  for (int peer = 0; peer < identity.local_rank; ++peer) {
    auto theirs = store.Get(key(first + peer), deadline - absl::Now());
    if (!theirs.ok()) return theirs.status();
    if (*theirs == gpu_id) {
      const char* visible = getenv("CUDA_VISIBLE_DEVICES");
      return absl::FailedPreconditionError(absl::StrCat(
          "LOCAL_RANK=", identity.local_rank, " and LOCAL_RANK=", peer,
          " would both use GPU ", gpu_id,
          visible ? absl::StrCat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : "",
          "; give each worker its own GPU, or run fewer workers per node "
          "(NCCL_MULTI_RANK_GPU_ENABLE=1 lets an NCCL that supports it "
          "share one)"));
    }
  }
  return absl::OkStatus();
}

#if defined(CTRUN_WITH_NCCL)
namespace {

// CUDA and NCCL results become statuses here, with the call and the
// library's own error text. NCCL's last error is read with or without a
// communicator: it explains failures of ncclGetUniqueId and early init too.
absl::Status CudaStatus(cudaError_t e, absl::string_view call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(e)));
}
absl::Status NcclStatus(ncclResult_t r, absl::string_view call,
                        ncclComm_t comm) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  const bool has_last = last != nullptr && *last != '\0';
  return absl::InternalError(
      absl::StrCat(call, ": ", ncclGetErrorString(r), has_last ? " (" : "",
                   has_last ? last : "", has_last ? ")" : ""));
}

#define CTRUN_CUDA(call)                                               \
  do {                                                                 \
    if (absl::Status s = CudaStatus((call), #call); !s.ok()) return s; \
  } while (0)

// Between polls: a collective of a few kilobytes ends in microseconds, so
// the first millisecond only yields; after that the wait sleeps.
void Pause(absl::Time started) {
  if (absl::Now() - started < absl::Milliseconds(1)) {
    std::this_thread::yield();
  } else {
    absl::SleepFor(absl::Microseconds(100));
  }
}

// Waits until `done` says yes (or fails), watching NCCL's asynchronous
// error, `deadline` and, every 200 ms, `still_wanted` (has the round
// ended?). `what` names the operation in errors.
template <typename Done, typename StillWanted>
absl::Status AwaitNccl(ncclComm_t comm, absl::string_view what,
                       absl::Time deadline, Done done,
                       StillWanted still_wanted) {
  const absl::Time started = absl::Now();
  // The round is asked about only in waits that last: not on every
  // collective (it is a call to the rendezvous).
  absl::Time next_check = started + absl::Milliseconds(200);
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (auto s = NcclStatus(ncclCommGetAsyncError(comm, &state),
                            "ncclCommGetAsyncError", comm);
        !s.ok()) {
      return s;
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclStatus(state, what, comm);
    }
    if (state == ncclSuccess) {
      absl::StatusOr<bool> finished = done();
      if (!finished.ok()) return finished.status();
      if (*finished) return absl::OkStatus();
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not done before the deadline"));
    }
    if (now >= next_check) {
      if (auto s = still_wanted(); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      }
      next_check = now + absl::Milliseconds(200);
    }
    Pause(started);
  }
}

// Asks the store whether the round that created the communicator still
// runs: when a peer fails, the rendezvous ends it and the store answers
// ABORTED.
absl::Status RoundStillRuns(WorkerStore& store, const std::string& key) {
  return store.Check({key}).status();
}

// For waits where NCCL's own state is all there is to watch.
absl::StatusOr<bool> NothingElse() { return true; }

}  // namespace

NcclCommunicator::~NcclCommunicator() {
  ncclComm_t comm = static_cast<ncclComm_t>(comm_);
  cudaSetDevice(device_);
  if (broken_.ok()) {
    // Finalize flushes what is still queued; it is non-blocking, so it is
    // awaited with a bound, and a failure there aborts instead.
    const absl::Status finalized = [&]() -> absl::Status {
      if (auto s = NcclStatus(ncclCommFinalize(comm), "ncclCommFinalize", comm);
          !s.ok()) {
        return s;
      }
      return AwaitNccl(comm, "ncclCommFinalize",
                       absl::Now() + absl::Seconds(30), NothingElse,
                       [] { return absl::OkStatus(); });
    }();
    if (finalized.ok()) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  }
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (buffer_ != nullptr) cudaFree(buffer_);
}

absl::Status NcclCommunicator::Abort(absl::Status why) {
  ncclCommAbort(static_cast<ncclComm_t>(comm_));
  broken_ = absl::Status(
      why.code(),
      absl::StrCat(why.message(), " (the communicator was aborted)"));
  return broken_;
}

absl::Status NcclCommunicator::AllReduceSum(double* host_values, size_t count,
                                            absl::Duration timeout) {
  if (!broken_.ok()) return broken_;
  const absl::Time deadline = absl::Now() + timeout;
  ncclComm_t comm = static_cast<ncclComm_t>(comm_);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  const size_t bytes = count * sizeof(double);
  CTRUN_CUDA(cudaSetDevice(device_));
  if (bytes > buffer_bytes_) {
    if (buffer_ != nullptr) CTRUN_CUDA(cudaFree(buffer_));
    buffer_ = nullptr;
    buffer_bytes_ = 0;
    CTRUN_CUDA(cudaMalloc(&buffer_, bytes));
    buffer_bytes_ = bytes;
  }
  CTRUN_CUDA(cudaMemcpyAsync(buffer_, host_values, bytes,
                             cudaMemcpyHostToDevice, stream));
  if (auto s = NcclStatus(ncclAllReduce(buffer_, buffer_, count, ncclDouble,
                                        ncclSum, comm, stream),
                          "ncclAllReduce", comm);
      !s.ok()) {
    return Abort(s);
  }
  // cudaStreamSynchronize would never return if a peer died mid-collective
  // (nor would a copy back to pageable memory queued behind it): polling
  // lets NCCL's error, the round's end and the deadline abort it.
  auto stream_done = [stream]() -> absl::StatusOr<bool> {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaErrorNotReady) return false;
    if (auto s = CudaStatus(e, "cudaStreamQuery"); !s.ok()) return s;
    return true;
  };
  if (auto s = AwaitNccl(comm, "ncclAllReduce", deadline, stream_done,
                         [this] { return RoundStillRuns(store_, key_); });
      !s.ok()) {
    return Abort(s);
  }
  // The stream is idle: the copy back cannot wait on a peer.
  CTRUN_CUDA(cudaMemcpyAsync(host_values, buffer_, bytes,
                             cudaMemcpyDeviceToHost, stream));
  CTRUN_CUDA(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateNcclCommunicator(
    const WorkerIdentity& identity, WorkerStore& store, int sequence,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int devices = 0;
  CTRUN_CUDA(cudaGetDeviceCount(&devices));
  auto gpu =
      ChooseGpu(identity.local_rank, devices, getenv("CUDA_VISIBLE_DEVICES"));
  if (!gpu.ok()) return gpu.status();
  if (!gpu->note.empty()) fprintf(stderr, "ctrun: %s\n", gpu->note.c_str());
  CTRUN_CUDA(cudaSetDevice(gpu->device));

  const char* shared_ok = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  if (shared_ok == nullptr || std::string(shared_ok) != "1") {
    char bus_id[32] = {};
    CTRUN_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, gpu->device));
    if (auto s = CheckGpuNotShared(store, identity, sequence, bus_id,
                                   deadline - absl::Now());
        !s.ok()) {
      return s;
    }
  }

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
  std::string key = NcclIdKey(identity, sequence);
  if (auto s = AwaitNccl(comm, "NCCL initialisation", deadline, NothingElse,
                         [&store, &key] { return RoundStillRuns(store, key); });
      !s.ok()) {
    ncclCommAbort(comm);
    return s;
  }
  std::unique_ptr<NcclCommunicator> communicator(
      new NcclCommunicator(comm, gpu->device, store, std::move(key)));
  cudaStream_t stream = nullptr;
  CTRUN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  communicator->stream_ = stream;
  return communicator;
}
#endif  // CTRUN_WITH_NCCL

}  // namespace ctrun
