// The worker group's start, through the Spawner seam.
#include "launcher/workers/worker_group.h"

#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "launcher/workers/console.h"
#include "launcher/workers/worker_process.h"

namespace ctrun {
namespace {

// Records what each worker was started with, then starts it by exec (or
// refuses local rank `refuse_rank`).
class RecordingSpawner final : public Spawner {
 public:
  absl::StatusOr<SpawnedProcess> Spawn(const std::vector<std::string>& argv,
                                       const EnvMap& env,
                                       const SpawnOptions& options) override {
    ranks.push_back(env.at("RANK"));
    const int local_rank = std::stoi(env.at("LOCAL_RANK"));
    if (local_rank == refuse_rank) {
      return absl::FailedPreconditionError("no template to fork from");
    }
    return exec.Spawn(argv, env, options);
  }
  std::vector<std::string> ranks;
  int refuse_rank = -1;
  ExecSpawner exec;
};

// What a worker group of `ranks` local ranks needs around it: a scratch run
// folder, the consoles and an epoll set, all gone with it.
struct Setup {
  std::string dir =
      absl::StrCat(std::filesystem::temp_directory_path().string(),
                   "/ctrun-group-", getpid());
  Console out{STDOUT_FILENO}, err{STDERR_FILENO};
  WorkerGroupConfig config;
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  explicit Setup(int ranks) {
    std::filesystem::create_directories(dir);
    config.options.local_world_size = ranks;
    config.run_dir = dir;
    config.out = &out;
    config.err = &err;
  }
  ~Setup() {
    close(epoll_fd);
    std::filesystem::remove_all(dir);
  }
};

v1::Assignment Round0() {
  v1::Assignment a;
  a.set_first_global_rank(4);
  a.set_world_size(6);
  a.set_group_world_size(2);
  a.set_group_rank(1);
  a.set_master_addr("127.0.0.1");
  a.set_master_port(29500);
  a.set_job_id("job");
  return a;
}

TEST_CASE(
    "A worker group starts every worker through its spawner, and stops at "
    "the first the spawner refuses",
    "[launcher][unit]") {
  Setup setup(2);
  RecordingSpawner spawner;
  WorkerGroupConfig& config = setup.config;
  config.worker_argv = {"/bin/true"};
  config.spawner = &spawner;
  const int epoll_fd = setup.epoll_fd;
  REQUIRE(epoll_fd >= 0);
  {
    WorkerGroup group(config, epoll_fd);
    const std::vector<WorkerStart> started = group.Start(Round0());
    REQUIRE(started.size() == 2);
    CHECK(started[0].pid > 0);
    CHECK(started[1].pid > 0);
    CHECK(spawner.ranks == std::vector<std::string>{"4", "5"});
    std::vector<WorkerExit> exits;
    for (int i = 0; i < 500 && exits.size() < 2; ++i) {
      for (const WorkerExit& e : group.Reap()) exits.push_back(e);
      usleep(10'000);
    }
    REQUIRE(exits.size() == 2);
    CHECK(exits[0].exit_code == 0);
    group.Collect();
  }
  spawner.ranks.clear();
  spawner.refuse_rank = 0;
  {
    WorkerGroup group(config, epoll_fd);
    const std::vector<WorkerStart> started = group.Start(Round0());
    REQUIRE(started.size() == 1);
    CHECK(started[0].pid == -1);
    CHECK(started[0].error == "no template to fork from");
    CHECK(spawner.ranks == std::vector<std::string>{"4"});
  }
}

// Fails before: the agent took a worker's exit (SIGCHLD) before its
// stderr's last line was read, and classified a communication failure from
// what it had read so far ("other").
TEST_CASE(
    "A worker's last lines are read when it is reaped, before its output "
    "is next polled",
    "[launcher][unit]") {
  Setup setup(1);
  setup.config.worker_argv = {
      "/bin/sh", "-c",
      "echo stepping; echo 'RuntimeError: Connection reset by peer' >&2; "
      "exit 1"};
  REQUIRE(setup.epoll_fd >= 0);
  {
    WorkerGroup group(setup.config, setup.epoll_fd);
    REQUIRE(group.Start(Round0()).size() == 1);
    // Only reaping, as when the exit comes first in the agent's loop.
    std::vector<WorkerExit> exits;
    for (int i = 0; i < 500 && exits.empty(); ++i) {
      exits = group.Reap();
      usleep(10'000);
    }
    REQUIRE(exits.size() == 1);
    CHECK(exits[0].exit_code == 1);
    const std::vector<std::string> last = group.LastLines(0);
    CHECK(std::find(last.begin(), last.end(),
                    "RuntimeError: Connection reset by peer") != last.end());
    CHECK(std::find(last.begin(), last.end(), "stepping") != last.end());
    group.Collect();
  }
}

TEST_CASE(
    "A world file is written whatever a worker left at its temporary name",
    "[launcher][unit]") {
  Setup setup(2);
  setup.config.options.recovery = Recovery::kInProcess;
  const std::string agent = setup.dir + "/.ctrun";
  std::filesystem::create_directories(agent);
  // A FIFO nobody reads (an open for writing would wait for ever), and a
  // link to a file of the agent's.
  REQUIRE(mkfifo((agent + "/world_0.new").c_str(), 0600) == 0);
  const std::string victim = setup.dir + "/victim";
  std::ofstream(victim) << "untouched";
  std::filesystem::create_symlink(victim, agent + "/world_1.new");
  REQUIRE(setup.epoll_fd >= 0);
  {
    WorkerGroup group(setup.config, setup.epoll_fd);
    group.HandOver(Round0(), {0, 1});
  }
  for (int lr : {0, 1}) {
    std::ifstream in(agent + "/world_" + std::to_string(lr));
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    CHECK(text.find("CTRUN_ROUND_STATE=ready\n") != std::string::npos);
    CHECK(text.find("RANK=" + std::to_string(4 + lr) + "\n") !=
          std::string::npos);
  }
  std::ifstream in(victim);
  std::string left;
  std::getline(in, left);
  CHECK(left == "untouched");
}

}  // namespace
}  // namespace ctrun
