#include "ctrun/worker.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ctrun/environment.h"

extern char** environ;

namespace ctrun {
namespace {

using Env = std::map<std::string, std::string>;

absl::StatusOr<int64_t> Number(const Env& env, const char* name, int64_t lo,
                               int64_t hi) {
  auto it = env.find(name);
  if (it == env.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this process was not started by ctrun (or torchrun): ", name,
        " is not set; run it as `ctrun --nproc_per_node=N PROGRAM`"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "=", it->second, " is not an integer in ", lo, "..", hi));
  }
  return value;
}

std::string Text(const Env& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

}  // namespace

absl::StatusOr<WorkerIdentity> WorkerIdentity::FromEnvironment() {
  Env env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos)
      env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return FromEnvironment(env);
}

absl::StatusOr<WorkerIdentity> WorkerIdentity::FromEnvironment(const Env& env) {
  WorkerIdentity id;
  constexpr int64_t kMax = 1 << 24;
  struct Field {
    const char* name;
    int* out;
    int64_t lo;
  };
  for (const Field& f : {Field{env::kWorldSize, &id.world_size, 1},
                         Field{env::kRank, &id.rank, 0},
                         Field{env::kLocalWorldSize, &id.local_world_size, 1},
                         Field{env::kLocalRank, &id.local_rank, 0},
                         Field{env::kGroupRank, &id.group_rank, 0},
                         Field{env::kGroupWorldSize, &id.group_world_size, 1},
                         Field{env::kMasterPort, &id.master_port, 1}}) {
    auto v =
        Number(env, f.name, f.lo, f.name == env::kMasterPort ? 65535 : kMax);
    if (!v.ok()) return v.status();
    *f.out = static_cast<int>(*v);
  }
  if (id.rank >= id.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RANK=", id.rank, " is not below WORLD_SIZE=", id.world_size));
  }
  if (id.local_rank >= id.local_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("LOCAL_RANK=", id.local_rank,
                     " is not below LOCAL_WORLD_SIZE=", id.local_world_size));
  }
  if (id.group_rank >= id.group_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GROUP_RANK=", id.group_rank,
                     " is not below GROUP_WORLD_SIZE=", id.group_world_size));
  }
  id.master_addr = Text(env, env::kMasterAddr);
  if (id.master_addr.empty()) {
    return absl::FailedPreconditionError(
        "this process was not started by ctrun (or torchrun): MASTER_ADDR "
        "is not set");
  }
  id.restart_count = 0;
  if (env.contains(env::kRestartCount)) {
    auto v = Number(env, env::kRestartCount, 0, kMax);
    if (!v.ok()) return v.status();
    id.restart_count = static_cast<int>(*v);
  }
  if (env.contains(env::kMaxRestarts)) {
    auto v = Number(env, env::kMaxRestarts, 0, kMax);
    if (!v.ok()) return v.status();
    id.max_restarts = static_cast<int>(*v);
  }
  id.run_id = Text(env, env::kRunId);
  id.role_name = Text(env, env::kRoleName);
  id.store_endpoint = Text(env, env::kStoreEndpoint);
  if (!id.store_endpoint.empty()) {
    id.store_job = Text(env, env::kStoreJob);
    auto round = Number(env, env::kStoreRound, 0, int64_t{1} << 62);
    if (!round.ok()) return round.status();
    id.store_round = *round;
    if (id.store_job.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          env::kStoreEndpoint, " is set but ", env::kStoreJob, " is not"));
    }
  }
  id.store_token = Text(env, env::kStoreToken);
  const std::string auth = Text(env, env::kStoreAuth);
  if (!auth.empty() && auth != "munge") {
    return absl::InvalidArgumentError(absl::StrCat(
        env::kStoreAuth, "=", auth, " is not 'munge', the only one known"));
  }
  id.store_munge = auth == "munge";
  id.munge_socket = Text(env, env::kMungeSocket);
  id.store_tls_ca = Text(env, env::kStoreTlsCa);
  id.node_address = Text(env, env::kNodeAddress);
  if (id.node_address.empty()) id.node_address = "127.0.0.1";
  return id;
}

}  // namespace ctrun
