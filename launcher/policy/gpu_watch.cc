#include "launcher/policy/gpu_watch.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/policy/job_recap.h"

namespace ctrun {

GpuWatch::GpuWatch(GpuWatchConfig config) : config_(std::move(config)) {}

void GpuWatch::Start(absl::Time now, std::vector<int> ranks) {
  ranks_ = std::move(ranks);
  started_ = now;
  // The first reading comes early enough that a short job still gets its
  // end-of-job figures; placement waits for `first_check` regardless.
  next_ = now + std::min(config_.interval, config_.first_check);
  usage_.clear();
}

absl::Time GpuWatch::NextDue() const { return next_; }

std::optional<std::string> GpuWatch::Observe(
    absl::Time now, const std::vector<GpuReading>& gpus) {
  next_ = now + config_.interval;
  for (auto& [lr, usage] : usage_) usage.bytes_by_gpu.clear();
  std::map<int, uint64_t> total_by_rank;
  for (const GpuReading& g : gpus) {
    for (const auto& [lr, bytes] : g.bytes_by_local_rank) {
      if (lr < 0 || lr >= static_cast<int>(ranks_.size()) || bytes == 0) {
        continue;
      }
      Usage& usage = usage_[lr];
      usage.bytes_by_gpu[g.gpu] = bytes;
      total_by_rank[lr] += bytes;
      OnGpu& on = usage.by_gpu[g.gpu];
      on.peak_bytes = std::max(on.peak_bytes, bytes);
      if (g.utilization >= 0) {
        on.utilization_sum += g.utilization;
        ++on.utilization_readings;
      }
    }
  }
  for (const auto& [lr, total] : total_by_rank) {
    usage_[lr].peak_bytes = std::max(usage_[lr].peak_bytes, total);
  }
  if (warned_ || now < started_ + config_.first_check) return std::nullopt;
  std::optional<std::string> warning = JudgePlacement();
  warned_ = warning.has_value();
  return warning;
}

std::optional<std::string> GpuWatch::JudgePlacement() const {
  // Each rank's GPU is where it holds the most memory: a rank that touched
  // GPU 0 before set_device still runs on its own.
  std::map<int, std::vector<int>> ranks_by_gpu;
  for (const auto& [lr, usage] : usage_) {
    if (usage.bytes_by_gpu.empty()) continue;
    const auto main = std::max_element(
        usage.bytes_by_gpu.begin(), usage.bytes_by_gpu.end(),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    ranks_by_gpu[main->first].push_back(ranks_[lr]);
  }
  std::vector<int> idle;
  for (int gpu : config_.job_gpus) {
    if (!ranks_by_gpu.contains(gpu)) idle.push_back(gpu);
  }
  std::vector<std::string> crowded;
  for (const auto& [gpu, ranks] : ranks_by_gpu) {
    if (ranks.size() < 2) continue;
    crowded.push_back(
        absl::StrCat("ranks ", FormatRanges(ranks),
                     crowded.empty() ? " all run on GPU " : " on GPU ", gpu));
  }
  // Ranks that must share (more workers than GPUs) are not a mistake.
  if (crowded.empty() || idle.empty()) return std::nullopt;
  return absl::StrCat(
      absl::StrJoin(crowded, ", "), "; ", idle.size() == 1 ? "GPU " : "GPUs ",
      FormatRanges(idle), idle.size() == 1 ? " is" : " are",
      " idle \xE2\x80\x94 call torch.cuda.set_device(LOCAL_RANK)"
      " before any CUDA work");
}

RankGpuUsage GpuWatch::UsageOf(int local_rank) const {
  RankGpuUsage out;
  const auto it = usage_.find(local_rank);
  if (it == usage_.end()) return out;
  out.peak_bytes = it->second.peak_bytes;
  uint64_t most = 0;
  for (const auto& [gpu, on] : it->second.by_gpu) {
    if (on.peak_bytes <= most) continue;
    most = on.peak_bytes;
    out.gpu = gpu;
    out.mean_utilization =
        on.utilization_readings == 0
            ? -1
            : static_cast<int>(on.utilization_sum / on.utilization_readings);
  }
  return out;
}

namespace {

// "2.0 GiB / 2.1 GiB / 2.3 GiB": the least, the median, the most.
std::string Spread(std::vector<uint64_t> bytes) {
  std::sort(bytes.begin(), bytes.end());
  return absl::StrCat(FormatBytes(bytes.front()), " / ",
                      FormatBytes(bytes[bytes.size() / 2]), " / ",
                      FormatBytes(bytes.back()));
}

}  // namespace

std::string RankUsageLine(int rank, absl::Duration wall,
                          uint64_t peak_rss_bytes, const RankGpuUsage& gpu) {
  std::string line = absl::StrCat("rank ", rank, ": wall ", FormatWall(wall),
                                  ", peak RSS ", FormatBytes(peak_rss_bytes));
  if (gpu.gpu >= 0) {
    absl::StrAppend(&line, ", GPU ", gpu.gpu, ": peak memory ",
                    FormatBytes(gpu.peak_bytes));
    if (gpu.mean_utilization >= 0) {
      absl::StrAppend(&line, ", mean utilization ", gpu.mean_utilization, "%");
    }
  }
  return line;
}

std::string NodeUsageLine(const std::vector<RankUsage>& ranks) {
  if (ranks.empty()) return "";
  if (ranks.size() == 1) {
    const RankUsage& r = ranks.front();
    return RankUsageLine(r.rank, r.wall, r.peak_rss_bytes, r.gpu);
  }
  std::vector<int> numbers;
  std::vector<uint64_t> rss, gpu_bytes;
  absl::Duration wall;
  int utilization_sum = 0, utilization_readings = 0;
  for (const RankUsage& r : ranks) {
    numbers.push_back(r.rank);
    rss.push_back(r.peak_rss_bytes);
    wall = std::max(wall, r.wall);
    if (r.gpu.gpu < 0) continue;
    gpu_bytes.push_back(r.gpu.peak_bytes);
    if (r.gpu.mean_utilization >= 0) {
      utilization_sum += r.gpu.mean_utilization;
      ++utilization_readings;
    }
  }
  std::string line =
      absl::StrCat("ranks ", FormatRanges(numbers), ": wall ", FormatWall(wall),
                   ", peak RSS ", Spread(rss), " (min / median / max)");
  if (!gpu_bytes.empty()) {
    absl::StrAppend(&line, ", GPU peak memory ", Spread(gpu_bytes));
    if (utilization_readings > 0) {
      absl::StrAppend(&line, ", mean utilization ",
                      utilization_sum / utilization_readings, "%");
    }
  }
  return line;
}

std::string FormatBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return absl::StrCat(unit == 0 ? absl::StrCat(static_cast<int64_t>(value))
                                : absl::StrFormat("%.1f", value),
                      " ", kUnits[unit]);
}

std::string FormatRanges(std::vector<int> numbers) {
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < numbers.size();) {
    size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(numbers[i])
                           : absl::StrCat(numbers[i], "-", numbers[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::vector<int> JobGpus(const char* cuda_visible_devices, int device_count,
                         int local_world_size) {
  std::vector<int> visible;
  if (cuda_visible_devices == nullptr) {
    for (int i = 0; i < device_count; ++i) visible.push_back(i);
  } else {
    // CUDA stops at the first entry that is not a valid device.
    for (absl::string_view entry :
         absl::StrSplit(cuda_visible_devices, ',', absl::SkipWhitespace())) {
      int index = -1;
      if (!absl::SimpleAtoi(entry, &index)) return {};
      if (index < 0 || index >= device_count) break;
      visible.push_back(index);
    }
  }
  if (static_cast<int>(visible.size()) > local_world_size) {
    visible.resize(std::max(local_world_size, 0));
  }
  return visible;
}

}  // namespace ctrun
