// worker_probe: a worker program for tests, linked only against
// libctrun_worker, run under ctrun. One mode per behaviour; each prints
// "ok <mode> ..." lines on success, and exits non-zero with the reason on
// stderr otherwise.
//
//   worker_probe identity        prints the identity it read
//   worker_probe store           exercises the store contract
//   worker_probe nccl-id [BYTES] shares a unique id of BYTES (128) bytes;
//                                rank 0 publishes BYTES, the others expect 128
//   worker_probe gloo            all-reduces rank+1 with Gloo
//   worker_probe steps N R       N steps of 50 ms, each a heartbeat and a
//                                "step" section; rank R stops in its 11th
//                                in the first attempt (a hang)
//   worker_probe stop            steps of 2 ms x (rank + 1), each a
//                                heartbeat and a stop check; says "ready"
//                                at step 5, and the step it stops at
//   worker_probe gpu-share same|own  claims one GPU for all workers, or
//                                one each (CheckGpuNotShared)
//   worker_probe resilient N     N steps of all-reducing rank+1 (20 ms
//                                each) on a ctrun::ResilientGloo; rank 1
//                                SIGKILLs itself at step 10 of round 0;
//                                the others re-form and go on
//   worker_probe resilient-nccl N  the same on a ctrun::ResilientNccl
//                                (builds with NCCL only)
//   worker_probe nccl            all-reduces rank+1 with NCCL on the GPU
//                                LOCAL_RANK (builds with NCCL only)
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <openssl/sha.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ctrun/gloo.h"
#include "ctrun/nccl.h"
#include "ctrun/progress.h"
#include "ctrun/recovery.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "worker_probe: %s\n", why.c_str());
  return 1;
}

#define EXPECT(cond)                                           \
  do {                                                         \
    if (!(cond)) return Fail(absl::StrCat("failed: ", #cond)); \
  } while (0)

std::string Hex(const std::string& bytes) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), d);
  std::string out;
  for (int i = 0; i < 8; ++i)
    absl::StrAppend(&out, absl::Hex(d[i], absl::kZeroPad2));
  return out;
}

int Store(const ctrun::WorkerIdentity& id, ctrun::WorkerStore& store) {
  const std::string mine = absl::StrCat("rank/", id.rank);
  EXPECT(store.Set(mine, absl::StrCat("hello from ", id.rank)).ok());
  // Everyone's key arrives; a waiting get returns it.
  for (int r = 0; r < id.world_size; ++r) {
    auto v = store.Get(absl::StrCat("rank/", r), absl::Seconds(30));
    EXPECT(v.ok() && *v == absl::StrCat("hello from ", r));
  }
  auto arrived = store.Add("arrived", 1);
  EXPECT(arrived.ok() && *arrived >= 1 && *arrived <= id.world_size);
  EXPECT(store.Wait({"rank/0"}, absl::Seconds(5)).ok());
  EXPECT(*store.Check({mine}));
  auto missing = store.Get(absl::StrCat("never/", id.rank));
  EXPECT(absl::IsNotFound(missing.status()));
  auto late = store.Get("never", absl::Milliseconds(100));
  EXPECT(absl::IsDeadlineExceeded(late.status()));
  auto big = store.Set("big", std::string((1 << 20) + 1, 'x'));
  EXPECT(absl::IsInvalidArgument(big));
  std::printf("ok store rank=%d\n", id.rank);
  return 0;
}

int NcclId(const ctrun::WorkerIdentity& id, ctrun::WorkerStore& store,
           size_t rank0_bytes) {
  std::string rank0_id;
  if (id.rank == 0) {
    std::mt19937 rng(std::random_device{}());
    for (size_t i = 0; i < rank0_bytes; ++i) rank0_id.push_back(char(rng()));
  }
  auto shared =
      ctrun::ShareUniqueId(store, id, 0, rank0_id,
                           id.rank == 0 ? rank0_bytes : 128, absl::Seconds(30));
  if (!shared.ok()) return Fail(shared.status().ToString());
  std::printf("ok nccl-id rank=%d bytes=%zu digest=%s\n", id.rank,
              shared->size(), Hex(*shared).c_str());
  return 0;
}

// Claims the GPU named `gpu_id` (a stand-in for a PCI bus id).
int GpuShare(const ctrun::WorkerIdentity& id, ctrun::WorkerStore& store,
             const std::string& gpu_id) {
  if (auto s =
          ctrun::CheckGpuNotShared(store, id, 0, gpu_id, absl::Seconds(30));
      !s.ok()) {
    return Fail(s.ToString());
  }
  std::printf("ok gpu-share rank=%d gpu=%s\n", id.rank, gpu_id.c_str());
  return 0;
}

int Gloo(const ctrun::WorkerIdentity& id, ctrun::WorkerStore& store) {
  auto context = ctrun::CreateGlooContext(id, store);
  if (!context.ok()) return Fail(context.status().ToString());
  std::vector<double> value = {static_cast<double>(id.rank + 1)};
  gloo::AllreduceOptions opts(*context);
  opts.setOutput(value.data(), value.size());
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<double>));
  gloo::allreduce(opts);
  std::printf("ok gloo rank=%d sum=%.0f\n", id.rank, value[0]);
  return 0;
}

#if defined(CTRUN_WITH_NCCL)
int Nccl(const ctrun::WorkerIdentity& id, ctrun::WorkerStore& store) {
  auto comm = ctrun::CreateNcclCommunicator(id, store);
  if (!comm.ok()) return Fail(comm.status().ToString());
  std::vector<double> value = {static_cast<double>(id.rank + 1)};
  if (auto s = (*comm)->AllReduceSum(value.data(), value.size()); !s.ok()) {
    return Fail(s.ToString());
  }
  std::printf("ok nccl rank=%d device=%d sum=%.0f\n", id.rank,
              (*comm)->device(), value[0]);
  return 0;
}

// `resilient` on NCCL: its collectives return a status.
int ResilientNccl(int steps) {
  auto comm = ctrun::ResilientNccl::Create();
  if (!comm.ok()) return Fail(comm.status().ToString());
  int step = 0;
  for (;;) {
    ctrun::ResilientNccl& c = **comm;
    const ctrun::WorkerIdentity& id = c.identity();
    const double expected = id.world_size * (id.world_size + 1) / 2.0;
    absl::Status failed;
    std::printf("enter rank=%d pid=%d world=%d\n", id.rank,
                static_cast<int>(getpid()), id.world_size);
    std::fflush(stdout);
    while (failed.ok() && step < steps) {
      if (ctrun::Round() == 0 && step == 10 && id.rank == 1) {
        kill(getpid(), SIGKILL);
      }
      std::vector<double> value = {static_cast<double>(id.rank + 1)};
      failed = c.communicator().AllReduceSum(value.data(), value.size());
      if (failed.ok()) {
        EXPECT(value[0] == expected);
        ++step;
      }
    }
    if (failed.ok()) {
      std::printf("ok resilient-nccl rank=%d pid=%d world=%d\n", id.rank,
                  static_cast<int>(getpid()), id.world_size);
      return 0;
    }
    if (absl::Status s = c.Reform(); !s.ok()) {
      return Fail(absl::StrCat("collective failed (", failed.ToString(),
                               ") and no new round: ", s.ToString()));
    }
  }
}
#endif

int Steps(const ctrun::WorkerIdentity& id, int steps, int hang_rank) {
  EXPECT(ctrun::ProgressReported());
  // The first attempt, where `hang_rank` hangs, runs until the hang's
  // restart ends it: a rank that finished first would leave no evidence,
  // however slow the machine.
  for (int step = 0; step < steps || id.restart_count == 0; ++step) {
    ctrun::Heartbeat();
    ctrun::Section s("step");
    if (id.rank == hang_rank && id.restart_count == 0 && step == 10) {
      std::printf("rank %d hangs\n", id.rank);
      std::fflush(stdout);
      absl::SleepFor(absl::Hours(1));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::printf("ok steps rank=%d restart=%d\n", id.rank, id.restart_count);
  return 0;
}

// Steps at the rank's own pace until the job's coordinated stop.
int Stop(const ctrun::WorkerIdentity& id) {
  EXPECT(ctrun::ProgressReported());
  EXPECT(!ctrun::ShouldStop());
  EXPECT(ctrun::Preempted().empty());
  for (int64_t step = 1;; ++step) {
    absl::SleepFor(absl::Milliseconds(2 * (id.rank + 1)));
    ctrun::Heartbeat();
    if (step == 5) {
      std::printf("ready rank=%d\n", id.rank);
      std::fflush(stdout);
    }
    if (ctrun::ShouldStop()) {
      std::printf("ok stop rank=%d step=%lld why=%s\n", id.rank,
                  static_cast<long long>(step), ctrun::Preempted().c_str());
      return 0;
    }
  }
}

}  // namespace

// Resumes at the furthest step any rank reached; every step's sum is
// checked against the world's.
int Resilient(int steps) {
  auto comm = ctrun::ResilientGloo::Create();
  if (!comm.ok()) return Fail(comm.status().ToString());
  int step = 0;
  for (;;) {
    try {
      ctrun::ResilientGloo& c = **comm;
      const ctrun::WorkerIdentity& id = c.identity();
      std::vector<double> furthest = {static_cast<double>(step)};
      gloo::AllreduceOptions agree(c.context());
      agree.setOutput(furthest.data(), furthest.size());
      agree.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::max<double>));
      gloo::allreduce(agree);
      step = static_cast<int>(furthest[0]);
      std::printf("enter rank=%d pid=%d world=%d step=%d\n", id.rank,
                  static_cast<int>(getpid()), id.world_size, step);
      std::fflush(stdout);
      const double expected = id.world_size * (id.world_size + 1) / 2.0;
      double sum = 0;
      while (step < steps) {
        if (ctrun::Round() == 0 && step == 10 && id.rank == 1) {
          kill(getpid(), SIGKILL);
        }
        std::vector<double> value = {static_cast<double>(id.rank + 1)};
        gloo::AllreduceOptions opts(c.context());
        opts.setOutput(value.data(), value.size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(
                &gloo::sum<double>));
        gloo::allreduce(opts);
        sum = value[0];
        EXPECT(sum == expected);
        ++step;
        absl::SleepFor(absl::Milliseconds(20));
      }
      std::printf("ok resilient rank=%d pid=%d world=%d sum=%.0f\n", id.rank,
                  static_cast<int>(getpid()), id.world_size, sum);
      return 0;
    } catch (const std::exception& e) {
      if (absl::Status s = (*comm)->Reform(); !s.ok()) {
        return Fail(absl::StrCat("collective failed (", e.what(),
                                 ") and no new round: ", s.ToString()));
      }
    }
  }
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "park" && argc == 3) {
    // A spare's worker: parked without a rank until its node has a slot.
    const char* spare = std::getenv("CTRUN_SPARE");
    if (spare != nullptr && std::string(spare) == "1") {
      std::printf("parked pid=%d rank=%s\n", getpid(),
                  std::getenv("RANK") == nullptr ? "none" : "set");
      std::fflush(stdout);
    }
    ctrun::WaitForSlot();
  }
  auto id = ctrun::WorkerIdentity::FromEnvironment();
  if (!id.ok()) {
    std::fprintf(stderr, "worker_probe: %s\n", id.status().ToString().c_str());
    return 2;
  }
  if (mode == "identity") {
    std::printf(
        "ok identity rank=%d local=%d world=%d round=%lld job=%s "
        "node=%s\n",
        id->rank, id->local_rank, id->world_size,
        static_cast<long long>(id->store_round), id->store_job.c_str(),
        id->node_address.c_str());
    return 0;
  }
  if (mode == "resilient" && argc == 3) return Resilient(std::atoi(argv[2]));
  if (mode == "park" && argc == 3) {
    std::printf("slot rank=%d world=%d pid=%d\n", id->rank, id->world_size,
                getpid());
    std::fflush(stdout);
    absl::SleepFor(absl::Seconds(std::atoi(argv[2])));
    return 0;
  }
  if (mode == "stop") return Stop(*id);
  if (mode == "steps" && argc == 4) {
    return Steps(*id, std::atoi(argv[2]), std::atoi(argv[3]));
  }
  auto store = ctrun::WorkerStore::Connect(*id);
  if (!store.ok()) return Fail(store.status().ToString());
  if (mode == "store") return Store(*id, **store);
  if (mode == "nccl-id") {
    return NcclId(*id, **store, argc > 2 ? std::atoi(argv[2]) : 128);
  }
  if (mode == "gloo") return Gloo(*id, **store);
  if (mode == "gpu-share" && argc == 3) {
    // "same": every worker claims one GPU; "own": each its LOCAL_RANK's.
    const std::string gpu = std::string(argv[2]) == "same"
                                ? "0000:3b:00.0"
                                : absl::StrCat("gpu-", id->local_rank);
    return GpuShare(*id, **store, gpu);
  }
#if defined(CTRUN_WITH_NCCL)
  if (mode == "nccl") return Nccl(*id, **store);
  if (mode == "resilient-nccl" && argc == 3) {
    store->reset();  // ResilientNccl keeps its own
    return ResilientNccl(std::atoi(argv[2]));
  }
#endif
  return Fail(
      "usage: worker_probe identity|store|nccl-id [BYTES]|gloo|"
      "gpu-share same|own|park SECONDS");
}
