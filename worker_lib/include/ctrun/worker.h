// WorkerIdentity: who this process is in the job, from the environment
// that ctrun (or torchrun, for the torchrun variables) gave it.
#ifndef CTRUN_WORKER_H_
#define CTRUN_WORKER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace ctrun {

struct WorkerIdentity {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string role_name;
  std::string master_addr;
  int master_port = 0;

  // ctrun only: the job's store and this node's address. Empty when the
  // process was started by another launcher.
  std::string store_endpoint;
  std::string store_job;
  int64_t store_round = 0;
  std::string store_token;
  bool store_munge = false;  // authenticate with munge, not a token
  std::string munge_socket;  // empty: munge's default
  std::string store_tls_ca;
  std::string node_address;

  // Reads and checks the variables. FAILED_PRECONDITION when the process
  // was not started by a launcher ("... RANK is not set"), INVALID_ARGUMENT
  // naming the variable when a value is malformed or inconsistent (RANK
  // outside 0..WORLD_SIZE-1, ...).
  static absl::StatusOr<WorkerIdentity> FromEnvironment();
  static absl::StatusOr<WorkerIdentity> FromEnvironment(
      const std::map<std::string, std::string>& env);

  // Whether ctrun's store variables are present (worker_lib's store and
  // communicators need them).
  bool has_store() const { return !store_endpoint.empty(); }
};

}  // namespace ctrun

#endif  // CTRUN_WORKER_H_
