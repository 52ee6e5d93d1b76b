#include <catch2/catch.hpp>

#include "ctrun/nccl.h"
#include "ctrun/worker.h"

namespace ctrun {
namespace {

std::map<std::string, std::string> Launched() {
  return {{"RANK", "5"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29511"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job"},
          {"ROLE_NAME", "default"},
          {"CTRUN_STORE_ENDPOINT", "127.0.0.1:4000"},
          {"CTRUN_STORE_JOB", "job"},
          {"CTRUN_STORE_ROUND", "3"},
          {"CTRUN_STORE_TOKEN", "t"},
          {"CTRUN_NODE_ADDRESS", "10.0.0.2"}};
}

TEST_CASE("Worker identity is read from the launcher's environment",
          "[worker][unit]") {
  auto id = WorkerIdentity::FromEnvironment(Launched());
  REQUIRE(id.ok());
  CHECK(id->rank == 5);
  CHECK(id->local_rank == 1);
  CHECK(id->world_size == 8);
  CHECK(id->local_world_size == 4);
  CHECK(id->group_rank == 1);
  CHECK(id->group_world_size == 2);
  CHECK(id->master_addr == "10.0.0.1");
  CHECK(id->master_port == 29511);
  CHECK(id->restart_count == 2);
  CHECK(id->max_restarts == 3);
  CHECK(id->run_id == "job");
  CHECK(id->has_store());
  CHECK(id->store_round == 3);
  CHECK(id->node_address == "10.0.0.2");
  CHECK_FALSE(id->store_munge);
  auto env = Launched();
  env["CTRUN_STORE_AUTH"] = "munge";
  env["CTRUN_MUNGE_SOCKET"] = "/run/m.sock";
  auto munge = WorkerIdentity::FromEnvironment(env);
  REQUIRE(munge.ok());
  CHECK(munge->store_munge);
  CHECK(munge->munge_socket == "/run/m.sock");
}

TEST_CASE("Outside a launch the identity says which variable is missing",
          "[worker][unit]") {
  auto id = WorkerIdentity::FromEnvironment({});
  REQUIRE(absl::IsFailedPrecondition(id.status()));
  CHECK(id.status().message().find("not started by ctrun") !=
        std::string::npos);
  CHECK(id.status().message().find("is not set") != std::string::npos);
}

TEST_CASE("Malformed or inconsistent identities are refused by name",
          "[worker][unit]") {
  for (auto [name, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"RANK", "8", "RANK=8 is not below WORLD_SIZE=8"},
           {"RANK", "x", "RANK=x is not an integer"},
           {"LOCAL_RANK", "4", "LOCAL_RANK=4"},
           {"MASTER_PORT", "0", "MASTER_PORT=0"},
           {"CTRUN_STORE_ROUND", "-1", "CTRUN_STORE_ROUND=-1"},
           {"CTRUN_STORE_AUTH", "kerberos", "CTRUN_STORE_AUTH=kerberos"}}) {
    auto env = Launched();
    env[name] = value;
    auto id = WorkerIdentity::FromEnvironment(env);
    INFO(name << "=" << value);
    REQUIRE(absl::IsInvalidArgument(id.status()));
    CHECK(id.status().message().find(says) != std::string::npos);
  }
}

TEST_CASE("A torchrun-launched worker has an identity but no store",
          "[worker][unit]") {
  auto env = Launched();
  for (const char* k : {"CTRUN_STORE_ENDPOINT", "CTRUN_STORE_JOB",
                        "CTRUN_STORE_ROUND", "CTRUN_STORE_TOKEN"}) {
    env.erase(k);
  }
  auto id = WorkerIdentity::FromEnvironment(env);
  REQUIRE(id.ok());
  CHECK_FALSE(id->has_store());
  auto store = WorkerStore::Connect(*id);
  CHECK(absl::IsFailedPrecondition(store.status()));
}

TEST_CASE("NCCL unique id keys are namespaced by run round and sequence",
          "[worker][unit]") {
  auto id = WorkerIdentity::FromEnvironment(Launched());
  CHECK(NcclIdKey(*id, 0) == "nccl-unique-id/job/3/0");
  CHECK(NcclIdKey(*id, 1) != NcclIdKey(*id, 0));
}

TEST_CASE("Each worker uses the GPU its LOCAL_RANK names", "[worker][unit]") {
  auto g = ChooseGpu(2, 4, nullptr);
  REQUIRE(g.ok());
  CHECK(g->device == 2);
  CHECK(g->note.empty());
}

TEST_CASE("A worker that sees exactly one GPU uses it as device 0",
          "[worker][unit]") {
  // A scheduler giving each process its own GPU: LOCAL_RANK 3 sees one.
  auto g = ChooseGpu(3, 1, "5");
  REQUIRE(g.ok());
  CHECK(g->device == 0);
  CHECK(g->note ==
        "LOCAL_RANK=3 sees exactly one GPU (CUDA_VISIBLE_DEVICES=5) and uses "
        "it as device 0");
}

TEST_CASE("More workers than visible GPUs name LOCAL_RANK and the devices",
          "[worker][unit]") {
  auto g = ChooseGpu(2, 2, "0,1");
  CHECK(absl::IsFailedPrecondition(g.status()));
  CHECK(g.status().message() ==
        "LOCAL_RANK=2 but only 2 GPUs are visible (CUDA_VISIBLE_DEVICES=0,1); "
        "run at most that many workers per node (--nproc_per_node=gpu)");
  auto none = ChooseGpu(0, 0, "");
  CHECK(none.status().message() ==
        "LOCAL_RANK=0 needs a GPU but none is visible (CUDA_VISIBLE_DEVICES=)");
}

}  // namespace
}  // namespace ctrun
