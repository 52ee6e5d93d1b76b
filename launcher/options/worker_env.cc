#include "launcher/options/worker_env.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ctrun/environment.h"

namespace ctrun {

EnvMap WorldVariables(const LaunchOptions& options, const v1::Assignment& a,
                      int local_rank) {
  const int rank = static_cast<int>(a.first_global_rank()) + local_rank;
  EnvMap e;
  e[env::kLocalRank] =
      options.virtual_local_rank ? "0" : absl::StrCat(local_rank);
  e[env::kRank] = absl::StrCat(rank);
  e[env::kGroupRank] = absl::StrCat(a.group_rank());
  // One role per job: role ranks are global ranks.
  e[env::kRoleRank] = absl::StrCat(rank);
  e[env::kLocalWorldSize] = absl::StrCat(options.local_world_size);
  e[env::kWorldSize] = absl::StrCat(a.world_size());
  e[env::kGroupWorldSize] = absl::StrCat(a.group_world_size());
  e[env::kRoleWorldSize] = absl::StrCat(a.world_size());
  e[env::kMasterAddr] = a.master_addr();
  e[env::kMasterPort] = absl::StrCat(a.master_port());
  e[env::kRestartCount] = absl::StrCat(a.restart_count());
  e[env::kStoreRound] = absl::StrCat(a.round());
  return e;
}

std::string WorldFileText(const LaunchOptions& options, const v1::Assignment& a,
                          int local_rank) {
  std::string text =
      absl::StrCat(kWorldRound, "=", a.round(), "\n", kWorldState, "=ready\n");
  for (const auto& [key, value] : WorldVariables(options, a, local_rank)) {
    absl::StrAppend(&text, key, "=", value, "\n");
  }
  return text;
}

std::string RoundEndingText(int64_t round) {
  return absl::StrCat(kWorldRound, "=", round, "\n", kWorldState, "=ending\n");
}

EnvMap WorkerEnvironment(const LaunchOptions& options, const v1::Assignment& a,
                         int local_rank, const EnvMap& agent_env,
                         const StoreAccess& store,
                         const std::string& node_address,
                         const std::string& error_file) {
  EnvMap e = agent_env;
  // The service's token reaches every job on a shared ctrund: workers get
  // their job's token (store.token) instead.
  e.erase(env::kRendezvousToken);
  for (auto& [key, value] : WorldVariables(options, a, local_rank)) {
    e[key] = std::move(value);
  }
  if (options.virtual_local_rank) {
    // Each worker sees one GPU, its own, as device 0 (torchrun's
    // --virtual-local-rank): the agent's list narrowed, or the index.
    std::string device = absl::StrCat(local_rank);
    if (auto it = agent_env.find(env::kCudaVisibleDevices);
        it != agent_env.end()) {
      std::vector<std::string> visible = absl::StrSplit(it->second, ',');
      if (static_cast<size_t>(local_rank) < visible.size()) {
        device = visible[static_cast<size_t>(local_rank)];
      }
    }
    e[env::kCudaVisibleDevices] = device;
  }
  e[env::kRoleName] = options.role;
  e[env::kMaxRestarts] = absl::StrCat(a.max_restarts());
  e[env::kRunId] = options.run_id;
  // PyTorch's rank 0 hosts its own TCPStore on MASTER_PORT.
  e[env::kUseAgentStore] = "False";
  e[env::kErrorFile] = error_file;
  e.try_emplace(env::kTorchNcclAsyncErrorHandling, "1");
  e.try_emplace(env::kNcclAsyncErrorHandling, "1");
  if (options.local_world_size > 1) e.try_emplace(env::kOmpNumThreads, "1");
  e[env::kStoreEndpoint] = store.endpoint;
  e[env::kStoreJob] = a.job_id();
  if (!store.token.empty()) e[env::kStoreToken] = store.token;
  if (store.munge) {
    e[env::kStoreAuth] = "munge";
    if (!store.munge->socket.empty())
      e[env::kMungeSocket] = store.munge->socket;
  }
  if (!store.tls_ca.empty()) e[env::kStoreTlsCa] = store.tls_ca;
  e[env::kNodeAddress] = node_address;
  return e;
}

void AddProgressEnvironment(const LaunchOptions& options,
                            const ProgressPaths& paths, int slot,
                            const std::string& stacks_file, EnvMap* env) {
  EnvMap& e = *env;
  e[env::kProgressFile] = paths.board;
  e[env::kProgressSlot] = absl::StrCat(slot);
  e[env::kStacksFile] = stacks_file;
  // Appended: the user's own modules (and their own `ctrun`, if any) win.
  std::string& python_path = e[env::kPythonPath];
  python_path = python_path.empty()
                    ? paths.python_dir
                    : absl::StrCat(python_path, ":", paths.python_dir);
  if (!paths.timer_fifo.empty()) e[env::kTimerFile] = paths.timer_fifo;
  if (options.hang_timeout.mode != HangTimeout::Mode::kOff) {
    // PyTorch >= 2.2 keeps a trace of its NCCL collectives and dumps it
    // when its watchdog times out; older versions ignore these.
    e.try_emplace(env::kNcclTraceBufferSize, "2000");
    e.try_emplace(env::kNcclDumpOnTimeout, "1");
    e.try_emplace(env::kNcclDebugInfoTempFile,
                  absl::StrCat(paths.run_dir, "/nccl_trace_rank_"));
  }
}

}  // namespace ctrun
