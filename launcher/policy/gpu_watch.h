// GpuWatch: what this node's workers do with its GPUs, from periodic
// readings of every GPU (NVML's processes and utilisation, launcher/hw/nvml.h).
//
// It names the most common silent mis-placement once per agent: several
// ranks on one GPU while GPUs meant for the job are idle ("only GPU 0 is
// busy": set_device(LOCAL_RANK) was forgotten). And it keeps, per rank of
// the current round, the peak GPU memory and the mean utilisation of the
// GPU it runs on, for the end-of-job line.
//
// Pure: fed `now` and readings, it returns what to say. The agent owns one,
// reads NVML when NextDue() comes, and maps each GPU process to the worker
// whose process group it is in.
#ifndef CTRUN_LAUNCHER_POLICY_GPU_WATCH_H_
#define CTRUN_LAUNCHER_POLICY_GPU_WATCH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace ctrun {

// One GPU at one moment.
struct GpuReading {
  int gpu = 0;           // NVML's index
  int utilization = -1;  // percent busy over NVML's last sample; -1 unknown
  // Memory held on it by each worker (by local rank), its processes summed.
  std::map<int, uint64_t> bytes_by_local_rank;
};

struct GpuWatchConfig {
  // The GPUs this node's workers are meant to use, in LOCAL_RANK order
  // (NVML indexes); empty when unknown (no mis-placement is then named).
  std::vector<int> job_gpus;
  // Start-up is allowed this long before placement is judged.
  absl::Duration first_check = absl::Seconds(5);
  absl::Duration interval = absl::Seconds(2);  // between readings
};

// What one rank did on the GPUs, over the readings of its round.
struct RankGpuUsage {
  int gpu = -1;  // where it held the most memory at a time; -1: none seen
  uint64_t peak_bytes = 0;    // over all its GPUs, at the fullest reading
  int mean_utilization = -1;  // of `gpu`, over the readings it was there
};

class GpuWatch {
 public:
  explicit GpuWatch(GpuWatchConfig config);

  // A round's workers started at `now`; `ranks[local_rank]` is each one's
  // global rank. The usage of the previous round is forgotten.
  void Start(absl::Time now, std::vector<int> ranks);

  // When the next reading is wanted; InfiniteFuture before Start.
  absl::Time NextDue() const;

  // Takes one reading of every GPU. Returns the mis-placement warning, the
  // first time there is one (at most once per GpuWatch).
  std::optional<std::string> Observe(absl::Time now,
                                     const std::vector<GpuReading>& gpus);

  RankGpuUsage UsageOf(int local_rank) const;

 private:
  struct OnGpu {
    uint64_t peak_bytes = 0;
    int64_t utilization_sum = 0;
    int utilization_readings = 0;
  };
  struct Usage {
    uint64_t peak_bytes = 0;               // all its GPUs together
    std::map<int, uint64_t> bytes_by_gpu;  // at the latest reading
    std::map<int, OnGpu> by_gpu;           // over the round
  };
  std::optional<std::string> JudgePlacement() const;

  GpuWatchConfig config_;
  std::vector<int> ranks_;
  absl::Time started_ = absl::InfiniteFuture();
  absl::Time next_ = absl::InfiniteFuture();
  std::map<int, Usage> usage_;  // by local rank
  bool warned_ = false;
};

// The end-of-job line of one rank: what users otherwise look up by hand
// with sacct and nvidia-smi. "rank 3: wall 12.5s, peak RSS 2.1 GiB, GPU 3:
// peak memory 31.5 GiB, mean utilization 87%"; the GPU part only when the
// rank was seen on a GPU.
std::string RankUsageLine(int rank, absl::Duration wall,
                          uint64_t peak_rss_bytes, const RankGpuUsage& gpu);

// One rank's figures at the end of its job.
struct RankUsage {
  int rank = 0;
  absl::Duration wall;
  uint64_t peak_rss_bytes = 0;
  RankGpuUsage gpu;
};

// The end-of-job line of a node: a 64-rank node says one line, not 64.
// "ranks 0-3: wall 12.5s, peak RSS 2.0 GiB / 2.1 GiB / 2.3 GiB (min /
// median / max), GPU peak memory 31.0 GiB / 31.5 GiB / 32.0 GiB, mean
// utilization 87%": the longest wall; the GPU part over the ranks seen on
// a GPU. One rank: its RankUsageLine.
std::string NodeUsageLine(const std::vector<RankUsage>& ranks);

// "512 KiB", "3.4 MiB", "31.5 GiB".
std::string FormatBytes(uint64_t bytes);

// "0-3", "0,2,5-7": sorted numbers, runs joined.
std::string FormatRanges(std::vector<int> numbers);

// The GPUs a node's `local_world_size` workers are meant to use, from the
// agent's CUDA_VISIBLE_DEVICES (null: unset) and NVML's device count: the
// first `local_world_size` of those visible. Empty when the variable holds
// anything but indexes (UUIDs, MIG names): the job's GPUs are then unknown.
std::vector<int> JobGpus(const char* cuda_visible_devices, int device_count,
                         int local_world_size);

}  // namespace ctrun

#endif  // CTRUN_LAUNCHER_POLICY_GPU_WATCH_H_
