// The worker's environment: torchrun's variables, ctrun's, the progress slot.
#include "launcher/options/worker_env.h"

#include <catch2/catch.hpp>

#include "ctrun/environment.h"
#include "launcher/options/command_line.h"

namespace ctrun {
namespace {

v1::Assignment MakeAssignment() {
  v1::Assignment a;
  a.set_round(2);
  a.set_group_rank(1);
  a.set_group_world_size(3);
  a.set_first_global_rank(4);
  a.set_world_size(12);
  a.set_master_addr("10.1.1.1");
  a.set_master_port(31000);
  a.set_restart_count(1);
  a.set_max_restarts(3);
  a.set_job_id("job9");
  return a;
}

TEST_CASE("A kept worker's world file holds its new ranks, sizes and master",
          "[launcher][unit]") {
  LaunchOptions o;
  o.local_world_size = 4;
  const std::string text = WorldFileText(o, MakeAssignment(), 3);
  CHECK(text.rfind("CTRUN_ROUND=2\nCTRUN_ROUND_STATE=ready\n", 0) == 0);
  for (const char* line :
       {"\nRANK=7\n", "\nLOCAL_RANK=3\n", "\nWORLD_SIZE=12\n",
        "\nGROUP_RANK=1\n", "\nGROUP_WORLD_SIZE=3\n",
        "\nMASTER_ADDR=10.1.1.1\n", "\nMASTER_PORT=31000\n",
        "\nTORCHELASTIC_RESTART_COUNT=1\n", "\nCTRUN_STORE_ROUND=2\n"}) {
    CHECK(text.find(line) != std::string::npos);
  }
  // Exactly the variables a new process of the round would get.
  const EnvMap full = WorkerEnvironment(o, MakeAssignment(), 3, {}, {}, "", "");
  for (const auto& [key, value] : WorldVariables(o, MakeAssignment(), 3)) {
    CHECK(full.at(key) == value);
  }
  CHECK(RoundEndingText(5) == "CTRUN_ROUND=5\nCTRUN_ROUND_STATE=ending\n");
}

TEST_CASE("A virtual local rank is 0 and sees only its own GPU",
          "[launcher][unit]") {
  LaunchOptions o;
  o.local_world_size = 2;
  o.virtual_local_rank = true;
  const EnvMap agent = {{"CUDA_VISIBLE_DEVICES", "4,5"}};
  const EnvMap second =
      WorkerEnvironment(o, MakeAssignment(), 1, agent, {}, "", "");
  CHECK(second.at("LOCAL_RANK") == "0");
  CHECK(second.at("CUDA_VISIBLE_DEVICES") == "5");
  CHECK(second.at("RANK") == "5");
  CHECK(WorkerEnvironment(o, MakeAssignment(), 1, {}, {}, "", "")
            .at("CUDA_VISIBLE_DEVICES") == "1");
  CHECK(ParseCommandLine({"--virtual-local-rank", "t"}, {}, HostFacts{})
            ->options.virtual_local_rank);
}

TEST_CASE(
    "Workers get their progress slot and ctrun's module after the "
    "user's PYTHONPATH",
    "[launcher][unit]") {
  LaunchOptions o;
  const ProgressPaths paths{"/run/progress.board", "/run/python", "", "/run"};
  EnvMap e = {{"PYTHONPATH", "/home/me/lib"}};
  AddProgressEnvironment(o, paths, 3, "/run/attempt_0/3/stacks.txt", &e);
  CHECK(e["CTRUN_PROGRESS_FILE"] == "/run/progress.board");
  CHECK(e["CTRUN_PROGRESS_SLOT"] == "3");
  CHECK(e["CTRUN_STACKS_FILE"] == "/run/attempt_0/3/stacks.txt");
  CHECK(e["PYTHONPATH"] == "/home/me/lib:/run/python");
  CHECK_FALSE(e.contains("TORCHELASTIC_TIMER_FILE"));
  CHECK_FALSE(e.contains("TORCH_NCCL_TRACE_BUFFER_SIZE"));
  EnvMap bare;
  AddProgressEnvironment(o, paths, 0, "", &bare);
  CHECK(bare["PYTHONPATH"] == "/run/python");
}

TEST_CASE(
    "Watching hangs points the NCCL flight recorder at the run "
    "directory unless the user did",
    "[launcher][unit]") {
  LaunchOptions o;
  o.hang_timeout.mode = HangTimeout::Mode::kAuto;
  const ProgressPaths paths{"/run/b", "/run/python", "/run/timer.fifo", "/run"};
  EnvMap e = {{"TORCH_NCCL_TRACE_BUFFER_SIZE", "100"}};
  AddProgressEnvironment(o, paths, 0, "", &e);
  CHECK(e["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "100");
  CHECK(e["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1");
  CHECK(e["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/run/nccl_trace_rank_");
  CHECK(e["TORCHELASTIC_TIMER_FILE"] == "/run/timer.fifo");
}

TEST_CASE("Worker environment has torchrun's variables", "[launcher][unit]") {
  LaunchOptions o;
  o.local_world_size = 4;
  o.run_id = "job9";
  o.role = "trainer";
  const EnvMap agent = {{"PATH", "/usr/bin"}, {"OMP_NUM_THREADS", "8"}};
  EnvMap e = WorkerEnvironment(o, MakeAssignment(), 2, agent,
                               {"127.0.0.1:9", "tok", std::nullopt, ""},
                               "10.1.1.2", "/logs/error.json");
  CHECK(e["RANK"] == "6");
  CHECK(e["LOCAL_RANK"] == "2");
  CHECK(e["GROUP_RANK"] == "1");
  CHECK(e["ROLE_RANK"] == "6");
  CHECK(e["ROLE_NAME"] == "trainer");
  CHECK(e["LOCAL_WORLD_SIZE"] == "4");
  CHECK(e["WORLD_SIZE"] == "12");
  CHECK(e["GROUP_WORLD_SIZE"] == "3");
  CHECK(e["ROLE_WORLD_SIZE"] == "12");
  CHECK(e["MASTER_ADDR"] == "10.1.1.1");
  CHECK(e["MASTER_PORT"] == "31000");
  CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
  CHECK(e["TORCHELASTIC_MAX_RESTARTS"] == "3");
  CHECK(e["TORCHELASTIC_RUN_ID"] == "job9");
  CHECK(e["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(e["TORCHELASTIC_ERROR_FILE"] == "/logs/error.json");
  CHECK(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(e["OMP_NUM_THREADS"] == "8");  // the user's own stays
  CHECK(e["PATH"] == "/usr/bin");
  CHECK(e[env::kStoreEndpoint] == "127.0.0.1:9");
  CHECK(e[env::kStoreJob] == "job9");
  CHECK(e[env::kStoreRound] == "2");
  CHECK(e[env::kStoreToken] == "tok");
  CHECK(e[env::kNodeAddress] == "10.1.1.2");
  CHECK_FALSE(e.contains(env::kStoreAuth));
}

TEST_CASE("Workers of a munge-authenticated job are told to use munge",
          "[launcher][unit]") {
  LaunchOptions o;
  o.local_world_size = 1;
  EnvMap e = WorkerEnvironment(
      o, MakeAssignment(), 0, {},
      {"127.0.0.1:9", "", MungeAuth{"/run/m.sock", "job9"}, ""}, "", "");
  CHECK(e[env::kStoreAuth] == "munge");
  CHECK(e[env::kMungeSocket] == "/run/m.sock");
  CHECK_FALSE(e.contains(env::kStoreToken));
}

TEST_CASE("OMP_NUM_THREADS is 1 only when several workers share the node",
          "[launcher][unit]") {
  LaunchOptions o;
  o.local_world_size = 2;
  CHECK(WorkerEnvironment(o, MakeAssignment(), 0, {}, {}, "", "")
            .at("OMP_NUM_THREADS") == "1");
  o.local_world_size = 1;
  CHECK_FALSE(WorkerEnvironment(o, MakeAssignment(), 0, {}, {}, "", "")
                  .contains("OMP_NUM_THREADS"));
}

}  // namespace
}  // namespace ctrun
