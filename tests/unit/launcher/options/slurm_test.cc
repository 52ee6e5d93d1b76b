// Slurm: hostlists, and options resolved from recorded Slurm environments.
#include "launcher/options/slurm.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/options/command_line.h"
#include "launcher/options/rendezvous_plan.h"

namespace ctrun {
namespace {

using Hosts = std::vector<std::string>;

TEST_CASE("Hostlists expand ranges, padding, groups and suffixes",
          "[slurm][unit]") {
  CHECK(*ExpandHostlist("node1") == Hosts{"node1"});
  CHECK(*ExpandHostlist("node[01-04,07]") ==
        Hosts{"node01", "node02", "node03", "node04", "node07"});
  CHECK(*ExpandHostlist("gpu-[1-2]-ib") == Hosts{"gpu-1-ib", "gpu-2-ib"});
  CHECK(*ExpandHostlist("r[1-2]-n[08-09]") ==
        Hosts{"r1-n08", "r1-n09", "r2-n08", "r2-n09"});
  CHECK(*ExpandHostlist("a1,b[1-2],c") == Hosts{"a1", "b1", "b2", "c"});
  CHECK(*ExpandHostlist("n[9-11]") == Hosts{"n9", "n10", "n11"});
  CHECK(ExpandHostlist("n[0-999999]")->size() == 1000000);
  // The largest value ends its range (a fuzzer's find: this never ended).
  CHECK(*ExpandHostlist("n[18446744073709551614-18446744073709551615]") ==
        Hosts{"n18446744073709551614", "n18446744073709551615"});
  // The ranges of one bracket count together.
  CHECK_FALSE(ExpandHostlist("n[0-999999,0-1]").ok());
}

TEST_CASE("Malformed hostlists are refused with the position",
          "[slurm][unit]") {
  for (const std::string bad :
       {"node[1-2", "node1-2]", "node[]", "node[3-1]", "node[a-b]", "a,,b",
        "node[1-[2]]", "", "n[0-1000000]", "x[0-999],y[0-999]"}) {
    auto r = ExpandHostlist(bad);
    INFO(bad);
    if (bad == "x[0-999],y[0-999]") {
      CHECK(r.ok());  // 2000 hosts is fine
      continue;
    }
    REQUIRE(absl::IsInvalidArgument(r.status()));
    CHECK(r.status().message().find("at character") != std::string::npos);
  }
}

const HostFacts kCpuHost{"n1", 4, 0, "no NVIDIA device", 0, ""};

EnvMap TwoNodeStep(int node_id) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_NODELIST", "n[1-2]"}};
}

TEST_CASE("A step on N+K nodes with --spares=K runs N and keeps K spare",
          "[slurm][unit][spares]") {
  EnvMap three = TwoNodeStep(2);
  for (const char* v : {"SLURM_JOB_NUM_NODES", "SLURM_STEP_NUM_NODES"}) {
    three[v] = "3";
  }
  three["SLURM_JOB_NODELIST"] = three["SLURM_STEP_NODELIST"] = "n[1-3]";
  auto c = ParseCommandLine({"--spares=1", "t"}, three, kCpuHost);
  REQUIRE(c.ok());
  CHECK(c->options.min_nodes == 2);
  CHECK(c->options.max_nodes == 2);
  CHECK(c->options.spares == 1);
  CHECK(c->options.node_rank == 2);  // ranks after the others: a spare
  CHECK(c->options.rdzv_backend == "c10d");
  // An explicit --nnodes wins; spares that leave nothing to run are named.
  auto fixed =
      ParseCommandLine({"--nnodes=3", "--spares=1", "t"}, three, kCpuHost);
  REQUIRE(fixed.ok());
  CHECK(fixed->options.max_nodes == 3);
  auto all = ParseCommandLine({"--spares=3", "t"}, three, kCpuHost);
  REQUIRE(absl::IsInvalidArgument(all.status()));
  CHECK(all.status().message() ==
        "--spares=3: leaves none of the 3 nodes of Slurm job 4242 to run; "
        "expected 0..2");
}

TEST_CASE("A step on two nodes needs no rendezvous flags", "[slurm][unit]") {
  auto first =
      ParseCommandLine({"--nproc_per_node=2", "t"}, TwoNodeStep(0), kCpuHost);
  REQUIRE(first.ok());
  const auto& o = first->options;
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 2);
  CHECK(o.rdzv_backend == "c10d");
  CHECK(o.rdzv_endpoint == "n1:" + std::to_string(SlurmRendezvousPort("4242")));
  CHECK(o.run_id == "slurm-4242.0");
  CHECK(o.slurm_node_id == 0);
  CHECK(o.node_rank == 0);  // group ranks in Slurm's node order
  auto second =
      ParseCommandLine({"--nproc_per_node=2", "t"}, TwoNodeStep(1), kCpuHost);
  REQUIRE(second.ok());
  CHECK(second->options.slurm_node_id == 1);
  CHECK(second->options.node_rank == 1);
  CHECK(second->options.rdzv_endpoint == o.rdzv_endpoint);
  CHECK(FormatLaunchPlan(o, {"t"}).find("Slurm") != std::string::npos);

  // Slurm's node id decides who hosts; Slurm's munge authenticates unless
  // the user brings a token.
  auto plan = [](LaunchOptions o, const EnvMap& env) {
    o.local_addr = "127.0.0.1";  // no route lookup for "n1"
    auto p = PlanRendezvous(o, "n1", env);
    REQUIRE(p.ok());
    return *p;
  };
  using Auth = RendezvousPlan::Auth;
  const RendezvousPlan first_plan = plan(o, TwoNodeStep(0));
  CHECK(first_plan.host);
  CHECK(first_plan.host_reason == "Slurm node id 0");
  CHECK_FALSE(first_plan.inferred);
  CHECK(first_plan.auth == Auth::kMunge);
  CHECK(FormatRendezvousPlan(o, first_plan).find("authentication: munge") !=
        std::string::npos);
  CHECK_FALSE(plan(second->options, TwoNodeStep(1)).host);
  EnvMap with_token = TwoNodeStep(1);
  with_token["CTRUN_RDZV_TOKEN"] = "secret";
  auto tokened =
      ParseCommandLine({"--nproc_per_node=2", "t"}, with_token, kCpuHost);
  REQUIRE(tokened.ok());
  CHECK(plan(tokened->options, with_token).auth == Auth::kTokenEnv);
  auto token_file = ParseCommandLine({"--rdzv_conf=token_file=/etc/tok", "t"},
                                     TwoNodeStep(1), kCpuHost);
  REQUIRE(token_file.ok());
  CHECK(plan(token_file->options, TwoNodeStep(1)).auth == Auth::kTokenFile);
  // is_host still wins over Slurm's node id.
  auto forced = ParseCommandLine({"--rdzv_conf=is_host=1", "t"}, TwoNodeStep(1),
                                 kCpuHost);
  REQUIRE(forced.ok());
  CHECK(plan(forced->options, TwoNodeStep(1)).host);
}

TEST_CASE("The munge socket comes from the environment or slurm.conf",
          "[slurm][unit]") {
  const std::string conf =
      std::filesystem::temp_directory_path() / "ctrun-slurm-conf-test";
  std::ofstream(conf) << "# AuthInfo=socket=/commented\n"
                         "ClusterName=c\n"
                         "authinfo = \"cred_expire=70,socket=/run/x.sock\"\n";
  CHECK(MungeSocketFor({{"SLURM_CONF", conf}}) == "/run/x.sock");
  CHECK(MungeSocketFor({{"SLURM_CONF", conf},
                        {"CTRUN_MUNGE_SOCKET", "/run/mine"}}) == "/run/mine");
  std::ofstream(conf) << "AuthType=auth/munge\n";
  CHECK(MungeSocketFor({{"SLURM_CONF", conf}}).empty());  // munge's default
  std::filesystem::remove(conf);
  CHECK(MungeSocketFor({{"SLURM_CONF", "/nonexistent/slurm.conf"}}).empty());
  CHECK(MungeSocketFor({{"SLURM_CONF", "/dev/zero"}}).empty());  // not a file
}

TEST_CASE("Signals from slurmstepd are not forwarded twice", "[slurm][unit]") {
  const std::string conf =
      std::filesystem::temp_directory_path() / "ctrun-slurm-proctrack-test";
  auto parse = [&](EnvMap env) {
    env["SLURM_CONF"] = conf;
    auto c = ParseCommandLine({"--nproc_per_node=2", "t"}, env, kCpuHost);
    REQUIRE(c.ok());
    return c->options.parent_signals_workers;
  };
  // Slurm's default process tracking (cgroup) signals the whole step.
  std::ofstream(conf) << "ClusterName=c\n";
  CHECK(parse(TwoNodeStep(0)));
  std::ofstream(conf) << "ProctrackType=proctrack/linuxproc\n";
  CHECK(parse(TwoNodeStep(0)));
  // proctrack/pgid signals only ctrun's process group: ctrun forwards.
  std::ofstream(conf) << "ProctrackType=proctrack/pgid\n";
  CHECK_FALSE(parse(TwoNodeStep(0)));
  std::filesystem::remove(conf);
  // Outside a step (the batch script, or no Slurm) ctrun always forwards.
  CHECK_FALSE(parse({}));
}

TEST_CASE("Explicit rendezvous flags win over Slurm", "[slurm][unit]") {
  auto c =
      ParseCommandLine({"--rdzv_backend=c10d", "--nnodes=2",
                        "--rdzv_endpoint=head:5000", "--rdzv_id=mine", "t"},
                       TwoNodeStep(1), kCpuHost);
  REQUIRE(c.ok());
  CHECK(c->options.rdzv_endpoint == "head:5000");
  CHECK(c->options.run_id == "mine");
  CHECK_FALSE(c->options.is_host.has_value());
  CHECK_FALSE(c->options.slurm_node_id.has_value());
  CHECK(c->options.node_rank == -1);
}

TEST_CASE("The batch step of a multi-node allocation shows the srun line",
          "[slurm][unit]") {
  EnvMap env = TwoNodeStep(0);
  env.erase("SLURM_STEP_ID");
  auto c = ParseCommandLine({"--nproc_per_node=gpu", "train.py", "--lr=1"}, env,
                            kCpuHost);
  REQUIRE(absl::IsInvalidArgument(c.status()));
  CHECK(c.status().message().find(
            "srun --ntasks-per-node=1 ctrun --nproc_per_node=gpu train.py "
            "--lr=1") != std::string::npos);
}

TEST_CASE(
    "The batch step stops a multi-node job at once with torchrun's explicit "
    "flags too, unless told the other nodes start another way",
    "[slurm][unit]") {
  EnvMap env = TwoNodeStep(0);
  env.erase("SLURM_STEP_ID");
  const std::vector<std::string> recipe = {"--nnodes=2", "--node_rank=0",
                                           "--master_addr=n1",
                                           "--master_port=29500", "train.py"};
  auto c = ParseCommandLine(recipe, env, kCpuHost);
  REQUIRE(absl::IsInvalidArgument(c.status()));
  CHECK(c.status().message() ==
        "this is the batch step of a 2-node Slurm allocation, which runs on "
        "its first node only; start one ctrun per node: srun "
        "--ntasks-per-node=1 ctrun --nnodes=2 --node_rank=0 --master_addr=n1 "
        "--master_port=29500 train.py (or, if the other nodes are started "
        "another way, add --allow_batch_step)");
  // However the node count comes.
  EnvMap pet = env;
  pet["PET_NNODES"] = "2";
  CHECK(absl::IsInvalidArgument(
      ParseCommandLine(
          {"--rdzv_backend=c10d", "--rdzv_endpoint=n1:5000", "train.py"}, pet,
          kCpuHost)
          .status()));
  // Told so, it starts; and a job that one node can run starts anyway.
  std::vector<std::string> allowed = recipe;
  allowed.insert(allowed.begin(), "--allow_batch_step");
  CHECK(ParseCommandLine(allowed, env, kCpuHost).ok());
  CHECK(ParseCommandLine({"--nnodes=1:2", "--rdzv_backend=c10d",
                          "--rdzv_endpoint=n1:5000", "train.py"},
                         env, kCpuHost)
            .ok());
  CHECK(ParseCommandLine({"--nnodes=1", "--master_addr=n1", "train.py"}, env,
                         kCpuHost)
            .ok());
}

TEST_CASE("ctrun status in any step of an allocation finds its rendezvous",
          "[slurm][unit]") {
  EnvMap batch = TwoNodeStep(0);
  batch.erase("SLURM_STEP_ID");
  auto in_batch = ParseCommandLine({"status"}, batch, kCpuHost);
  REQUIRE(in_batch.ok());
  CHECK(in_batch->action == CommandLine::Action::kStatus);
  CHECK(in_batch->slurm_job);
  CHECK(in_batch->options.rdzv_endpoint ==
        "n1:" + std::to_string(SlurmRendezvousPort("4242")));
  // Another step (srun --overlap ctrun status) cannot know the training
  // step's run id either.
  EnvMap other_step = TwoNodeStep(1);
  other_step["SLURM_STEP_ID"] = "3";
  auto in_step = ParseCommandLine({"status"}, other_step, kCpuHost);
  REQUIRE(in_step.ok());
  CHECK(in_step->slurm_job);
  CHECK(in_step->options.rdzv_endpoint == in_batch->options.rdzv_endpoint);
  // A run id given names the job.
  auto named =
      ParseCommandLine({"status", "--rdzv_id=slurm-4242.0"}, batch, kCpuHost);
  REQUIRE(named.ok());
  CHECK_FALSE(named->slurm_job);
  CHECK(named->options.run_id == "slurm-4242.0");
}

TEST_CASE("A one-node allocation runs like a standalone launch",
          "[slurm][unit]") {
  EnvMap env = {{"SLURM_JOB_ID", "77"},
                {"SLURM_JOB_NUM_NODES", "1"},
                {"SLURM_NODEID", "0"},
                {"SLURM_JOB_NODELIST", "n1"},
                {"SLURM_GPUS_ON_NODE", "2"}};
  auto c = ParseCommandLine({"--nproc_per_node=gpu", "t"}, env, kCpuHost);
  REQUIRE(c.ok());
  CHECK(c->options.max_nodes == 1);
  CHECK(c->options.rdzv_endpoint.empty());
  CHECK(c->options.run_id == "slurm-77");
  CHECK(c->options.local_world_size == 2);  // from SLURM_GPUS_ON_NODE
}

TEST_CASE("Inconsistent Slurm environments are refused by name",
          "[slurm][unit]") {
  EnvMap missing = TwoNodeStep(0);
  missing.erase("SLURM_NODEID");
  auto a = ParseCommandLine({"t"}, missing, kCpuHost);
  REQUIRE(absl::IsInvalidArgument(a.status()));
  CHECK(a.status().message().find("SLURM_NODEID is not set") !=
        std::string::npos);

  EnvMap short_list = TwoNodeStep(0);
  short_list["SLURM_STEP_NODELIST"] = "n1";
  auto b = ParseCommandLine({"t"}, short_list, kCpuHost);
  REQUIRE(absl::IsInvalidArgument(b.status()));
  CHECK(b.status().message().find("names 1 nodes") != std::string::npos);

  EnvMap bad_list = TwoNodeStep(0);
  bad_list["SLURM_STEP_NODELIST"] = "n[1-";
  CHECK(absl::IsInvalidArgument(
      ParseCommandLine({"t"}, bad_list, kCpuHost).status()));
}

TEST_CASE("Slurm ports are derived from the job id below the ephemeral range",
          "[slurm][unit]") {
  CHECK(SlurmRendezvousPort("4242") == SlurmRendezvousPort("4242"));
  CHECK(SlurmRendezvousPort("4242") != SlurmRendezvousPort("4243"));
  for (const char* id : {"1", "999999", "12345_7", "abc"}) {
    const int port = SlurmRendezvousPort(id);
    CHECK(port >= 20000);
    CHECK(port < 32000);
  }
}

}  // namespace
}  // namespace ctrun
