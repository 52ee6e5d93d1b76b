// train: data-parallel SGD with libctrun_worker, the C++ counterpart of
// examples/ddp_train.py.
//
//   ctrun --standalone --nproc_per_node=4 train [--backend auto|gloo|nccl]
//         [--steps N] [--lr X] [--checkpoint_dir D] [--checkpoint_every K]
//
// Linear regression with known true weights: each rank holds its own shard
// of synthetic data, gradients are all-reduced (Gloo on CPUs, NCCL on GPUs),
// the loss falls towards zero and every rank ends with the same parameters,
// printed as one line per rank:
//
//   final step=<n> loss=<x> params_sha256=<hex>
//
// With --checkpoint_dir, rank 0 saves step and parameters every
// --checkpoint_every steps (write to a temporary file, fsync, rename), and a
// restarted run resumes from the latest save, so a run interrupted by a
// worker failure ends with the same parameters as an uninterrupted one.
// --crash_at_step S --crash_rank R kill rank R with SIGKILL at step S of the
// first attempt (TORCHELASTIC_RESTART_COUNT=0), to show that.
#include <fcntl.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <openssl/sha.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ctrun/gloo.h"
#include "ctrun/nccl.h"
#include "ctrun/store.h"
#include "ctrun/worker.h"

namespace {

constexpr int kFeatures = 8;
constexpr int kSamplesPerRank = 512;

struct Flags {
  std::string backend = "auto";
  int steps = 200;
  double lr = 0.01;
  std::string checkpoint_dir;
  int checkpoint_every = 20;
  int crash_at_step = -1;
  int crash_rank = -1;
};

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::fprintf(stderr, "train: %s\n", message.c_str());
  std::exit(code);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Die(absl::StrCat(name, " needs a value"), 2);
    }
    auto number = [&](auto* out) {
      if (!absl::SimpleAtoi(value, out)) {
        Die(absl::StrCat(name, "=", value, " is not an integer"), 2);
      }
    };
    if (name == "--backend") {
      f.backend = value;
    } else if (name == "--steps") {
      number(&f.steps);
    } else if (name == "--lr") {
      if (!absl::SimpleAtod(value, &f.lr)) Die("--lr needs a number", 2);
    } else if (name == "--checkpoint_dir") {
      f.checkpoint_dir = value;
    } else if (name == "--checkpoint_every") {
      number(&f.checkpoint_every);
    } else if (name == "--crash_at_step") {
      number(&f.crash_at_step);
    } else if (name == "--crash_rank") {
      number(&f.crash_rank);
    } else {
      Die(absl::StrCat("unknown flag ", name,
                       "; flags: --backend --steps --lr --checkpoint_dir "
                       "--checkpoint_every"),
          2);
    }
  }
  if (f.backend != "auto" && f.backend != "gloo" && f.backend != "nccl") {
    Die("--backend must be auto, gloo or nccl", 2);
  }
  if (f.steps < 1 || f.checkpoint_every < 1) {
    Die("--steps and --checkpoint_every must be >= 1", 2);
  }
  return f;
}

// The synthetic problem: y = x . w* + b* with fixed true parameters; each
// rank's shard comes from its own seed, so data never depends on restarts.
struct Shard {
  std::vector<double> x;  // kSamplesPerRank x kFeatures
  std::vector<double> y;
};

Shard MakeShard(int rank) {
  std::mt19937_64 rng(1000 + rank);
  std::normal_distribution<double> normal(0.0, 1.0);
  Shard s;
  for (int i = 0; i < kSamplesPerRank; ++i) {
    double target = 0.25;  // true bias
    for (int j = 0; j < kFeatures; ++j) {
      const double v = normal(rng);
      s.x.push_back(v);
      target += v * (j % 2 == 0 ? 1.0 + j : -0.5 * j);  // true weights
    }
    s.y.push_back(target);
  }
  return s;
}

// Parameters: kFeatures weights then the bias.
using Params = std::vector<double>;

// Local loss (sum of squared errors) and its gradient (unnormalised).
double LossAndGradient(const Shard& s, const Params& p, Params* grad) {
  grad->assign(p.size(), 0.0);
  double loss = 0;
  for (int i = 0; i < kSamplesPerRank; ++i) {
    double pred = p[kFeatures];
    for (int j = 0; j < kFeatures; ++j) pred += p[j] * s.x[i * kFeatures + j];
    const double err = pred - s.y[i];
    loss += err * err;
    for (int j = 0; j < kFeatures; ++j) {
      (*grad)[j] += 2 * err * s.x[i * kFeatures + j];
    }
    (*grad)[kFeatures] += 2 * err;
  }
  return loss;
}

std::string Sha256Hex(const Params& p) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(p.data()),
         p.size() * sizeof(double), digest);
  std::string hex;
  for (unsigned char c : digest)
    absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return hex;
}

// Checkpoint file: the step, then the parameters, as raw bytes.
std::string CheckpointPath(const Flags& f) {
  return f.checkpoint_dir + "/train.ckpt";
}

void SaveCheckpoint(const Flags& f, int step, const Params& p) {
  const std::string path = CheckpointPath(f);
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  std::string bytes(reinterpret_cast<const char*>(&step), sizeof step);
  bytes.append(reinterpret_cast<const char*>(p.data()),
               p.size() * sizeof(double));
  if (write(fd, bytes.data(), bytes.size()) !=
          static_cast<ssize_t>(bytes.size()) ||
      fsync(fd) != 0) {
    Die(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  }
  close(fd);
  // The rename is the commit: a crash leaves the old checkpoint or the new.
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Die(absl::StrCat("cannot rename ", tmp, ": ", strerror(errno)));
  }
}

// Step 0 and `p` untouched when there is no checkpoint.
int LoadCheckpoint(const Flags& f, Params* p) {
  std::ifstream in(CheckpointPath(f), std::ios::binary);
  if (!in) return 0;
  int step = 0;
  in.read(reinterpret_cast<char*>(&step), sizeof step);
  in.read(reinterpret_cast<char*>(p->data()), p->size() * sizeof(double));
  if (!in) Die(absl::StrCat(CheckpointPath(f), " is truncated"));
  return step;
}

// Sums `values` over all ranks in place.
class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual void SumAll(std::vector<double>* values) = 0;
  virtual void BroadcastFromRank0(std::vector<double>* values) = 0;
};

#if defined(CTRUN_WITH_NCCL)
class NcclReducer final : public Reducer {
 public:
  explicit NcclReducer(std::unique_ptr<ctrun::NcclCommunicator> comm, int rank)
      : comm_(std::move(comm)), rank_(rank) {}
  void SumAll(std::vector<double>* values) override {
    if (auto s = comm_->AllReduceSum(values->data(), values->size()); !s.ok()) {
      Die(s.ToString());
    }
  }
  void BroadcastFromRank0(std::vector<double>* values) override {
    // A sum where only rank 0 contributes is rank 0's values.
    if (rank_ != 0) std::fill(values->begin(), values->end(), 0.0);
    SumAll(values);
  }

 private:
  std::unique_ptr<ctrun::NcclCommunicator> comm_;
  int rank_;
};
#endif

class GlooReducer final : public Reducer {
 public:
  explicit GlooReducer(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)) {}
  void SumAll(std::vector<double>* values) override {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values->data(), values->size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<double>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  }
  void BroadcastFromRank0(std::vector<double>* values) override {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(values->data(), values->size());
    opts.setRoot(0);
    opts.setTag(tag_++);
    gloo::broadcast(opts);
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  auto identity = ctrun::WorkerIdentity::FromEnvironment();
  if (!identity.ok()) Die(std::string(identity.status().message()), 2);
  const auto& id = *identity;
  auto store = ctrun::WorkerStore::Connect(id);
  if (!store.ok()) Die(std::string(store.status().message()), 2);

  std::string backend = flags.backend;
  if (backend == "auto") {
    const char* visible = getenv("CUDA_VISIBLE_DEVICES");
    const bool gpus =
        ctrun::kHaveNccl &&
        (visible ? (*visible != '\0' && std::string(visible) != "-1")
                 : access("/proc/driver/nvidia/gpus", F_OK) == 0);
    backend = gpus ? "nccl" : "gloo";
  }
  std::unique_ptr<Reducer> reducer;
  if (backend == "nccl") {
#if defined(CTRUN_WITH_NCCL)
    auto comm = ctrun::CreateNcclCommunicator(id, **store);
    if (!comm.ok()) {
      Die(absl::StrCat("rank ", id.rank, ": ", comm.status().ToString()));
    }
    reducer = std::make_unique<NcclReducer>(std::move(*comm), id.rank);
#else
    Die("--backend=nccl: this build of ctrun has no NCCL (CUDA and NCCL were "
        "not found when it was built)",
        2);
#endif
  } else {
    auto context = ctrun::CreateGlooContext(id, **store);
    if (!context.ok()) {
      Die(absl::StrCat("rank ", id.rank, ": ", context.status().ToString()));
    }
    reducer = std::make_unique<GlooReducer>(*context);
  }

  const Shard shard = MakeShard(id.rank);
  Params params(kFeatures + 1, 0.0);
  int start = 0;
  if (!flags.checkpoint_dir.empty()) {
    // Rank 0 reads, everyone gets its copy: all ranks resume identically.
    std::vector<double> state(params.size() + 1, 0.0);
    if (id.rank == 0) {
      start = LoadCheckpoint(flags, &params);
      state[0] = start;
      std::copy(params.begin(), params.end(), state.begin() + 1);
    }
    reducer->BroadcastFromRank0(&state);
    start = static_cast<int>(state[0]);
    std::copy(state.begin() + 1, state.end(), params.begin());
    if (id.rank == 0 && start > 0) {
      std::printf("resuming from step %d (restart %d)\n", start,
                  id.restart_count);
    }
  }

  const double samples = static_cast<double>(kSamplesPerRank) * id.world_size;
  Params grad;
  for (int step = start + 1; step <= flags.steps; ++step) {
    if (step == flags.crash_at_step && id.rank == flags.crash_rank &&
        id.restart_count == 0) {
      std::fflush(stdout);
      raise(SIGKILL);
    }
    std::vector<double> reduced(params.size() + 1);
    const double local_loss = LossAndGradient(shard, params, &grad);
    std::copy(grad.begin(), grad.end(), reduced.begin());
    reduced.back() = local_loss;
    reducer->SumAll(&reduced);
    for (size_t j = 0; j < params.size(); ++j) {
      params[j] -= flags.lr * reduced[j] / samples;
    }
    if (id.rank == 0 && (step == 1 || step % 50 == 0)) {
      std::printf("step %d loss %.6f\n", step, reduced.back() / samples);
      std::fflush(stdout);
    }
    if (!flags.checkpoint_dir.empty() && id.rank == 0 &&
        step % flags.checkpoint_every == 0) {
      SaveCheckpoint(flags, step, params);
    }
  }
  // The loss of the final parameters, over all shards.
  std::vector<double> total = {LossAndGradient(shard, params, &grad)};
  reducer->SumAll(&total);
  std::printf("final step=%d loss=%.6f params_sha256=%s\n", flags.steps,
              total[0] / samples, Sha256Hex(params).c_str());
  return 0;
}
