// The launcher's pure parts: command line, worker environment, output lines,
// failure reports, entrypoint resolution, host facts.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "ctrun/environment.h"
#include "launcher/options/command_line.h"
#include "launcher/options/host_facts.h"
#include "launcher/options/rendezvous_plan.h"
#include "launcher/options/worker_command.h"
#include "launcher/options/worker_env.h"
#include "launcher/policy/failure_report.h"
#include "launcher/workers/proc.h"
#include "launcher/workers/progress_board.h"
#include "launcher/workers/run_directory.h"
#include "launcher/workers/worker_output.h"

namespace ctrun {
namespace {

const HostFacts kHost{"thishost", 8, 2, "test", 0, ""};

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                  EnvMap env = {}, HostFacts host = kHost) {
  return ParseCommandLine(args, env, host);
}

const LaunchOptions::Setting* Find(const LaunchOptions& o,
                                   const std::string& name) {
  for (const auto& s : o.settings) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST_CASE("Flags parse in both spellings and with = or a space",
          "[launcher][unit]") {
  auto a = Parse({"--nproc_per_node=4", "--max-restarts", "3", "--nnodes", "1",
                  "--role=trainer", "train"});
  REQUIRE(a.ok());
  CHECK(a->options.local_world_size == 4);
  CHECK(a->options.max_restarts == 3);
  CHECK(a->options.role == "trainer");
  CHECK(a->options.entrypoint == "train");
  auto b = Parse({"--nproc-per-node", "4", "--max_restarts=3", "train"});
  REQUIRE(b.ok());
  CHECK(b->options.local_world_size == 4);
  CHECK(b->options.max_restarts == 3);
}

TEST_CASE("Arguments after the entrypoint go to the script untouched",
          "[launcher][unit]") {
  auto c = Parse({"--nproc_per_node=2", "train.py", "--nproc_per_node=7", "-m",
                  "--", "x"});
  REQUIRE(c.ok());
  CHECK(c->options.local_world_size == 2);
  CHECK_FALSE(c->options.module);
  CHECK(c->options.entrypoint == "train.py");
  CHECK(c->options.script_args ==
        std::vector<std::string>{"--nproc_per_node=7", "-m", "--", "x"});
}

TEST_CASE("PET_ variables override defaults and flags override them",
          "[launcher][unit]") {
  EnvMap env = {{"PET_NPROC_PER_NODE", "3"}, {"PET_MAX_RESTARTS", "2"}};
  auto c = Parse({"--max_restarts=5", "train"}, env);
  REQUIRE(c.ok());
  CHECK(c->options.local_world_size == 3);
  CHECK(c->options.max_restarts == 5);
  CHECK(Find(c->options, "nproc_per_node")->source == Source::kEnv);
  CHECK(Find(c->options, "max_restarts")->source == Source::kFlag);
  CHECK(Find(c->options, "role")->source == Source::kDefault);
}

TEST_CASE("TORCH_ELASTIC_SHUTDOWN_TIMEOUT stands in for --shutdown_timeout",
          "[launcher][unit]") {
  const EnvMap env = {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}};
  CHECK(Parse({"t"}, env)->options.shutdown_timeout == absl::Seconds(7));
  CHECK(Parse({"--shutdown_timeout=3", "t"}, env)->options.shutdown_timeout ==
        absl::Seconds(3));
  EnvMap pet = env;
  pet["PET_SHUTDOWN_TIMEOUT"] = "5";
  CHECK(Parse({"t"}, pet)->options.shutdown_timeout == absl::Seconds(5));
  CHECK(Parse({"t"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}})
            .status()
            .message() ==
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon: expected seconds >= 0");
}

TEST_CASE("A bad PET_ value is named as the variable", "[launcher][unit]") {
  auto c = Parse({"train"}, {{"PET_NNODES", "x"}});
  REQUIRE(absl::IsInvalidArgument(c.status()));
  CHECK(c.status().message().find("PET_NNODES=x") == 0);
}

TEST_CASE(
    "Bad values are one-line errors naming the flag and the accepted "
    "values",
    "[launcher][unit]") {
  struct Case {
    std::vector<std::string> args;
    std::string starts_with;
    std::string mentions;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nnodes=3:2", "t"}, "--nnodes=3:2", "MIN <= MAX"},
           {{"--nnodes=0", "t"}, "--nnodes=0", "1 <= MIN"},
           {{"--nproc_per_node=-1", "t"},
            "--nproc_per_node=-1",
            "gpu, xpu, cpu"},
           {{"--nproc_per_node=many", "t"}, "--nproc_per_node=many", "auto"},
           {{"--rdzv_conf=k", "t"}, "--rdzv_conf=k", "KEY=VALUE"},
           {{"--rdzv_conf=colour=red", "t"},
            "--rdzv_conf=colour=red",
            "known keys"},
           {{"--rdzv_conf=join_timeout=soon", "t"}, "--rdzv_conf", "seconds"},
           {{"--max_restarts=-1", "t"}, "--max_restarts=-1", "integer"},
           {{"--master_port=70000", "t"}, "--master_port=70000", "1..65535"},
           {{"--rdzv_backend=etcd", "t"}, "--rdzv_backend=etcd", "c10d"},
           {{"--rdzv_endpoint=a:b:c", "t"}, "--rdzv_endpoint", "HOST:PORT"},
           {{"--start_method=thread", "t"}, "--start_method", "spawn"},
           {{"-r", "5", "t"}, "--redirects=5", "0-3"},
           {{"--tee=0:9", "t"}, "--tee=0:9", "0-3"},
           {{"--local_ranks_filter=4", "--nproc_per_node=2", "t"},
            "--local_ranks_filter=4",
            "0..1"},
           {{"--signals_to_handle=SIGNOPE", "t"},
            "--signals_to_handle",
            "SIGNOPE"},
           {{"--shutdown_timeout=-3", "t"}, "--shutdown_timeout=-3", "seconds"},
           {{"--frobnicate", "t"}, "unknown flag '--frobnicate'", "--help"},
           {{"-x", "t"}, "unknown flag '-x'", "--help"},
           {{"--standalone=1", "t"}, "--standalone takes no value", ""},
           {{"--nproc_per_node"}, "--nproc_per_node needs a value", ""},
           {{"--nproc_per_node=2"}, "missing the program to run", "ENTRYPOINT"},
           {{"-m", "--no_python", "t"}, "-m/--module and --no_python", ""},
           {{"--standalone", "--nnodes=2", "t"},
            "--standalone runs one node",
            "--rdzv_endpoint"},
       }) {
    INFO(c.args[0]);
    auto r = Parse(c.args);
    REQUIRE(absl::IsInvalidArgument(r.status()));
    const std::string m(r.status().message());
    CHECK(m.rfind(c.starts_with, 0) == 0);
    CHECK(m.find(c.mentions) != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("nproc_per_node gpu cpu and auto follow the host",
          "[launcher][unit]") {
  CHECK(Parse({"--nproc_per_node=gpu", "t"})->options.local_world_size == 2);
  CHECK(Parse({"--nproc_per_node=cpu", "t"})->options.local_world_size == 8);
  CHECK(Parse({"--nproc_per_node=auto", "t"})->options.local_world_size == 2);
  const HostFacts no_gpu{"thishost", 4, 0, "CUDA_VISIBLE_DEVICES=", 0, ""};
  CHECK(Parse({"--nproc_per_node=auto", "t"}, {}, no_gpu)
            ->options.local_world_size == 4);
  auto gpu = Parse({"--nproc_per_node=gpu", "t"}, {}, no_gpu);
  REQUIRE(absl::IsInvalidArgument(gpu.status()));
  CHECK(gpu.status().message().find("no GPU is visible") != std::string::npos);
}

TEST_CASE("Multi-node launches need an endpoint or a static master",
          "[launcher][unit]") {
  auto missing = Parse({"--nnodes=2", "--rdzv_backend=c10d", "t"});
  REQUIRE(absl::IsInvalidArgument(missing.status()));
  CHECK(missing.status().message().find("needs --rdzv_endpoint") !=
        std::string::npos);

  auto c10d = Parse(
      {"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9", "t"});
  REQUIRE(c10d.ok());
  CHECK(c10d->options.rdzv_endpoint == "10.9.9.9:29400");
  CHECK(c10d->options.run_id == "none");  // shared by every node, as torchrun
  CHECK(c10d->options.node_rank == -1);   // c10d ignores --node_rank
  CHECK_FALSE(c10d->options.is_host.has_value());

  auto node1 = Parse({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.5",
                      "--master_port=4000", "t"});
  REQUIRE(node1.ok());
  CHECK(node1->options.rdzv_endpoint == "10.0.0.5:4001");
  CHECK(node1->options.master_port == 4000);
  CHECK(node1->options.node_rank == 1);
  CHECK(node1->options.run_id == "static-10.0.0.5:4001");
  auto node0 = Parse({"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.5",
                      "--master_port=4000", "t"});
  // Node rank 0 of a static rendezvous hosts it, whatever the addresses.
  auto hosts = [](LaunchOptions o) {
    o.local_addr = "127.0.0.1";  // no route lookup
    auto plan = PlanRendezvous(o, "node", {});
    REQUIRE(plan.ok());
    return std::pair{plan->host, plan->host_reason};
  };
  CHECK(hosts(node0->options) ==
        std::pair{true, std::string("node rank 0 of a static rendezvous")});
  CHECK(hosts(node1->options).first == false);
  CHECK_FALSE(node0->options.is_host.has_value());

  auto elastic_static = Parse({"--nnodes=2:3", "--master_addr=h", "t"});
  CHECK(absl::IsInvalidArgument(elastic_static.status()));
  auto forced = Parse({"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.5",
                       "--rdzv_conf=is_host=0", "t"});
  CHECK(hosts(forced->options) ==
        std::pair{false, std::string("--rdzv_conf is_host=0")});
  CHECK(Parse({"--rdzv_conf=is_host=maybe", "t"})
            .status()
            .message()
            .find("is_host=maybe") != std::string::npos);
  CHECK(Parse({"--master_addr=10.0.0.5", "t"})->options.local_addr ==
        "10.0.0.5");
}

TEST_CASE("Several rendezvous endpoints are ctrund replicas, never hosted",
          "[launcher][unit]") {
  auto parsed = Parse({"--nnodes=2", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=127.0.0.1:1,127.0.0.2", "t"});
  REQUIRE(parsed.ok());
  CHECK(parsed->options.rdzv_endpoint == "127.0.0.1:1,127.0.0.2:29400");
  LaunchOptions o = parsed->options;
  o.local_addr = "127.0.0.1";
  auto plan = PlanRendezvous(o, "node", {});
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->host);  // though 127.0.0.1 is this node
  CHECK(plan->host_reason == "several endpoints: ctrund replicas on etcd");
  CHECK(plan->endpoints.size() == 2);
  CHECK(plan->endpoint.ToString() == "127.0.0.1:1");

  o.is_host = true;
  auto hosted = PlanRendezvous(o, "node", {});
  REQUIRE(absl::IsInvalidArgument(hosted.status()));
  CHECK(hosted.status().message().find("an agent (--rdzv_conf is_host=1) "
                                       "hosts one endpoint only") !=
        std::string::npos);
  auto bad = Parse({"--rdzv_endpoint=127.0.0.1:1,,h", "t"});
  CHECK(bad.status().message().find("--rdzv_endpoint") != std::string::npos);
  CHECK(bad.status().message().find("empty entry") != std::string::npos);
}

TEST_CASE("Addresses are checked before anything starts", "[launcher][unit]") {
  auto malformed = Parse({"--local_addr=127.0.0.300", "t"});
  REQUIRE(absl::IsInvalidArgument(malformed.status()));
  CHECK(malformed.status().message() ==
        "--local_addr=127.0.0.300: not an IPv4 address (four numbers 0..255, "
        "e.g. 10.0.0.2)");
  CHECK(absl::IsInvalidArgument(
      Parse({"--master_addr=10.0.0.256", "t"}).status()));
  // torchrun takes an empty --local_addr as none given.
  CHECK(Parse({"--local_addr=", "t"})->options.local_addr.empty());

  // An address this machine cannot listen on is refused by the plan, naming
  // the flag that gave it. 192.0.2.1 is a documentation address (RFC 5737);
  // trying to bind it sends nothing.
  auto given = Parse({"--local_addr=192.0.2.1", "t"});
  REQUIRE(given.ok());
  auto plan = PlanRendezvous(given->options, "node", {});
  REQUIRE(absl::IsInvalidArgument(plan.status()));
  CHECK(plan.status().message() ==
        "--local_addr=192.0.2.1 is not an address of this machine (cannot "
        "bind to '192.0.2.1': Cannot assign requested address); give one of "
        "this node's addresses, or leave --local_addr out");
  auto derived = Parse({"--master_addr=192.0.2.1", "t"});
  REQUIRE(derived.ok());
  CHECK(PlanRendezvous(derived->options, "node", {})
            .status()
            .message()
            .find("--master_addr=192.0.2.1 is not an address of this "
                  "machine") != std::string::npos);
  auto local = Parse({"--local_addr=127.0.0.2", "t"});
  auto local_plan = PlanRendezvous(local->options, "node", {});
  REQUIRE(local_plan.ok());
  CHECK(local_plan->address == "127.0.0.2");
}

TEST_CASE("rdzv_conf sets the rendezvous timeouts", "[launcher][unit]") {
  auto c =
      Parse({"--rdzv_conf=join_timeout=12,heartbeat_timeout=3,"
             "keep_alive_interval=0.5",
             "t"});
  REQUIRE(c.ok());
  CHECK(c->options.join_timeout == absl::Seconds(12));
  CHECK(c->options.heartbeat_timeout == absl::Seconds(3));
  CHECK(c->options.keep_alive_interval == absl::Milliseconds(500));
  auto slow =
      Parse({"--rdzv_conf=heartbeat_timeout=1,keep_alive_interval=1", "t"});
  CHECK(absl::IsInvalidArgument(slow.status()));
}

TEST_CASE("Flags without use in ctrun are accepted and explained",
          "[launcher][unit]") {
  auto c = Parse({"--start_method=fork", "--monitor_interval=5", "t"});
  REQUIRE(c.ok());
  REQUIRE(c->options.notices.size() == 2);
  CHECK(c->options.notices[0].find("--monitor_interval=5 has no effect") !=
        std::string::npos);
  CHECK(Find(c->options, "start_method")->note.find("exec") !=
        std::string::npos);
  CHECK(Parse({"t"})->options.notices.empty());

  // torchrun's newer flags, and --rdzv_conf keys that mean nothing here.
  auto newer = Parse({"--event-log-handler=console",
                      "--rdzv_conf=timeout=900,use_libuv=1,join_timeout=9",
                      "--numa-binding=node", "t"});
  REQUIRE(newer.ok());
  CHECK(newer->options.notices ==
        std::vector<std::string>{
            "--rdzv_conf timeout=900 has no effect: join_timeout bounds the "
            "join",
            "--rdzv_conf use_libuv=1 has no effect: PyTorch's own TCPStore "
            "on MASTER_PORT is untouched",
            "--event_log_handler=console has no effect: torchelastic's event "
            "handlers are Python plugins; ctrun writes its events with "
            "--event_log FILE"});
  // --numa-binding is implemented (launcher/policy/numa_binding.h).
  CHECK(newer->options.numa_binding == NumaPolicy::kNode);
  // Their values are checked as torchrun checks them.
  CHECK(Parse({"--numa-binding=bogus", "t"}).status().message() ==
        "--numa_binding=bogus: expected node, socket, exclusive or "
        "core-complex");
}

TEST_CASE("Flags may be abbreviated as in torchrun, and typos get a suggestion",
          "[launcher][unit]") {
  auto abbreviated = Parse({"--nproc=3", "--stand", "t"});
  REQUIRE(abbreviated.ok());
  CHECK(abbreviated->options.local_world_size == 3);
  CHECK(abbreviated->options.standalone);
  CHECK(Parse({"--m=1", "t"}).status().message() ==
        "ambiguous flag '--m': it could be --max_restarts, "
        "--monitor_interval, --module, --master_addr, --master_port, "
        "--metrics_listen");
  CHECK(Parse({"--nprocs-per-node=2", "t"}).status().message() ==
        "unknown flag '--nprocs-per-node'; did you mean --nproc_per_node? see "
        "ctrun --help (script flags go after the entrypoint)");
  CHECK(Parse({"--bogus", "t"}).status().message() ==
        "unknown flag '--bogus'; see ctrun --help (script flags go after the "
        "entrypoint)");
}

TEST_CASE("Redirect and tee specs select streams per local rank",
          "[launcher][unit]") {
  auto all = ParseStreamSelection("3");
  REQUIRE(all.ok());
  CHECK(all->For(5) == 3);
  auto mixed = ParseStreamSelection("0:1,1:2");
  REQUIRE(mixed.ok());
  CHECK(mixed->For(0) == 1);
  CHECK(mixed->For(1) == 2);
  CHECK(mixed->For(2) == 0);
  CHECK_FALSE(ParseStreamSelection("0:1,x").ok());
}

TEST_CASE("ctrun status takes the launch's flags, --json, and no program",
          "[launcher][unit]") {
  auto c = Parse({"status", "--nnodes=2", "--nproc_per_node=4",
                  "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400",
                  "--rdzv_id=job42", "--json"});
  REQUIRE(c.ok());
  CHECK(c->action == CommandLine::Action::kStatus);
  CHECK(c->json);
  CHECK_FALSE(c->slurm_job);
  CHECK(c->options.rdzv_endpoint == "node0:29400");
  CHECK(c->options.run_id == "job42");
  CHECK_FALSE(Parse({"status", "--rdzv_endpoint=h:1", "--rdzv_id=j"})->json);
  // The launch's worker flags do not matter, even where they could not run.
  const HostFacts no_gpu{"login", 4, 0, "no NVIDIA device", 0, ""};
  CHECK(Parse({"status", "--nproc_per_node=gpu", "--rdzv_endpoint=h:1"}, {},
              no_gpu)
            .ok());
  CHECK_FALSE(Parse({"--nproc_per_node=gpu", "t"}, {}, no_gpu).ok());

  auto program = Parse({"status", "--rdzv_endpoint=h:1", "train.py"});
  REQUIRE(absl::IsInvalidArgument(program.status()));
  CHECK(program.status().message() ==
        "status takes flags only, got 'train.py'; to run a program "
        "named status: ctrun [FLAGS] -- status");
  CHECK(absl::IsInvalidArgument(Parse({"status", "--rdzv_id"}).status()));
  CHECK(Parse({"status", "--help"})->action ==
        CommandLine::Action::kStatusHelp);
  CHECK(StatusHelpText().find("usage: ctrun status [FLAGS] [--json]") == 0);
  CHECK(HelpText().find("ctrun status [FLAGS] [--json]") != std::string::npos);
  // Only in the first place: elsewhere `status` is a program like any other,
  // and --json after a program is the program's.
  auto launch = Parse({"--", "status", "--json"});
  REQUIRE(launch.ok());
  CHECK(launch->action == CommandLine::Action::kLaunch);
  CHECK(launch->options.entrypoint == "status");
  CHECK(launch->options.script_args == std::vector<std::string>{"--json"});
  CHECK(Parse({"--nproc_per_node=2", "status"})->options.entrypoint ==
        "status");
}

TEST_CASE("Help and version are recognised anywhere before the entrypoint",
          "[launcher][unit]") {
  CHECK(Parse({"--help"})->action == CommandLine::Action::kHelp);
  CHECK(Parse({"--nproc_per_node=2", "-h"})->action ==
        CommandLine::Action::kHelp);
  CHECK(Parse({"--version"})->action == CommandLine::Action::kVersion);
  CHECK(Parse({"train", "--help"})->action == CommandLine::Action::kLaunch);
  const std::string help = HelpText();
  CHECK(help.find("usage: ctrun") == 0);
  CHECK(help.find("--nproc_per_node N|gpu|xpu|cpu|auto") != std::string::npos);
  CHECK(help.find("-r, --redirects") != std::string::npos);
}

TEST_CASE("The run id is generated when none is given", "[launcher][unit]") {
  auto a = Parse({"t"});
  auto b = Parse({"t"});
  CHECK(a->options.run_id.rfind("ctrun-", 0) == 0);
  CHECK(a->options.run_id != b->options.run_id);
  CHECK(Find(a->options, "rdzv_id")->source == Source::kDerived);
  CHECK(Parse({"--rdzv_id=job7", "t"})->options.run_id == "job7");
}

TEST_CASE("The launch plan names every setting with its source",
          "[launcher][unit]") {
  auto c = Parse({"--nproc_per_node=2", "t"}, {{"PET_ROLE", "r"}});
  const std::string plan = FormatLaunchPlan(c->options, {"/bin/t", "a"});
  CHECK(plan.find("nproc_per_node") != std::string::npos);
  CHECK(plan.find("flag") != std::string::npos);
  CHECK(plan.find("PET_* env") != std::string::npos);
  CHECK(plan.find("workers: 2 x /bin/t a") != std::string::npos);
  CHECK(plan.find("a free port") != std::string::npos);
  CHECK(plan.find("RANK (resolved)            0..1") != std::string::npos);
  CHECK(plan.find("timeouts (resolved)        join 10m, last call 30s, "
                  "heartbeat 5s, keep-alive 1s, reconnect 1m, shutdown 30s") !=
        std::string::npos);

  // What flags only imply: gpu resolved with its source, a static job's
  // endpoint and port, this node's ranks.
  HostFacts gpus{"n", 8, 3, "CUDA_VISIBLE_DEVICES=0,1,2", 0, ""};
  auto stat =
      ParseCommandLine({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.5",
                        "--nproc_per_node=gpu", "t"},
                       {}, gpus);
  REQUIRE(stat.ok());
  const std::string s = FormatLaunchPlan(stat->options, {"t"});
  CHECK(
      s.find("nproc_per_node (resolved)  3, from CUDA_VISIBLE_DEVICES=0,1,2") !=
      std::string::npos);
  CHECK(s.find("rdzv_endpoint (resolved)   10.0.0.5:29501 "
               "(MASTER_ADDR:MASTER_PORT+1)") != std::string::npos);
  CHECK(s.find("master_port (resolved)     29500 (torchrun's default)") !=
        std::string::npos);
  CHECK(s.find("RANK (resolved)            3..5 if every node runs 3") !=
        std::string::npos);
}

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
  CHECK(Parse({"--virtual-local-rank", "t"})->options.virtual_local_rank);
}

TEST_CASE("A process's state reads as /proc shows it, and a gone one as gone",
          "[launcher][unit]") {
  CHECK(absl::StartsWith(DescribeProcessState(getpid()), "R (running)"));
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  CHECK(DescribeProcessState(child) == "gone");
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

TEST_CASE("Section names become valid UTF-8 whatever the worker wrote",
          "[launcher][unit]") {
  CHECK(SanitizeUtf8("step") == "step");
  CHECK(SanitizeUtf8("\xc3\xa9tape \xe2\x9c\x93") ==
        "\xc3\xa9tape \xe2\x9c\x93");
  // Cut in the middle of a character, stray bytes, an overlong form, a
  // surrogate.
  CHECK(SanitizeUtf8("ab\xe2\x9c") == "ab??");
  CHECK(SanitizeUtf8("\xff\x80x") == "??x");
  CHECK(SanitizeUtf8("\xc0\xafx") == "??x");
  CHECK(SanitizeUtf8("\xed\xa0\x80") == "???");
  CHECK(SanitizeUtf8("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
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

TEST_CASE("The hang flags are parsed and checked", "[launcher][unit]") {
  auto p = Parse({"--hang_timeout=auto", "--hang_warmup=60",
                  "--hang-evidence-timeout=3", "t"});
  REQUIRE(p.ok());
  CHECK(p->options.hang_timeout.mode == HangTimeout::Mode::kAuto);
  CHECK(p->options.hang_timeout.warmup == absl::Seconds(60));
  CHECK(p->options.hang_evidence_timeout == absl::Seconds(3));
  CHECK(Parse({"--hang_timeout=2.5", "t"})->options.hang_timeout.fixed ==
        absl::Milliseconds(2500));
  CHECK(Parse({"t"})->options.hang_timeout.mode == HangTimeout::Mode::kOff);
  CHECK(Parse({"--hang_timeout=soon", "t"}).status().message() ==
        "--hang_timeout=soon: expected seconds > 0, auto (learned from the "
        "job's own steps) or off");
  CHECK_FALSE(Parse({"--hang_evidence_timeout=9999", "t"}).ok());
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

// Output written by a WorkerOutput into a pipe, read back.
struct Captured {
  int fds[2];
  Captured() { REQUIRE(pipe(fds) == 0); }
  ~Captured() { close(fds[0]); }
  std::string Read() {
    close(fds[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
    return out;
  }
};

const absl::Time kT0 = absl::UnixEpoch();

TEST_CASE("Worker output is emitted in whole prefixed lines",
          "[launcher][unit]") {
  Captured console;
  {
    Console sink(console.fds[1]);
    WorkerOutput out("[h:3]: ", &sink, -1);
    out.Append("hel", kT0);
    out.Append("lo\nwor", kT0);
    out.Append("ld\n\nlast", kT0);
    out.Finish();
  }
  CHECK(console.Read() == "[h:3]: hello\n[h:3]: world\n[h:3]: \n[h:3]: last\n");
}

TEST_CASE("Worker output goes to its log file without the prefix",
          "[launcher][unit]") {
  Captured file;
  {
    WorkerOutput out("[p]: ", nullptr, dup(file.fds[1]));
    out.Append("a\nb\n", kT0);
  }
  CHECK(file.Read() == "a\nb\n");
}

// A file that the test reads back; removed at the end.
struct ScratchFile {
  std::string path;
  int fd = -1;
  ScratchFile() {
    char name[] = "/tmp/ctrun-unit-out-XXXXXX";
    fd = mkstemp(name);
    REQUIRE(fd >= 0);
    path = name;
  }
  ~ScratchFile() {
    close(fd);
    unlink(path.c_str());
  }
  std::string Read() const {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
};

TEST_CASE("A line without its newline is shown once the worker is quiet",
          "[launcher][unit]") {
  ScratchFile console;
  const absl::Duration wait = WorkerOutput::kPartialAfter;
  {
    Console sink(console.fd);
    WorkerOutput a("[a]: ", &sink, -1), b("[b]: ", &sink, -1);
    a.Append("Password: ", kT0);
    CHECK(a.PartialDue() == kT0 + wait);
    a.ShowPartial(kT0 + wait / 2);  // not quiet long enough yet
    a.ShowPartial(kT0 + wait);      // "[a]: Password: " shown, line open
    CHECK(a.PartialDue() == absl::InfiniteFuture());
    a.Append("secret\n", kT0 + wait);  // the same line goes on
    // A progress bar, and another worker's line in between.
    a.Append("\r 10%", kT0 + 2 * wait);
    a.ShowPartial(kT0 + 3 * wait);
    b.Append("b's line\n", kT0 + 3 * wait);
    a.Append("\r 20%\n", kT0 + 4 * wait);
    // A stream that ends in the middle of a line.
    b.Append("bye", kT0 + 4 * wait);
    b.ShowPartial(kT0 + 5 * wait);
    b.Finish();
    REQUIRE(sink.Flush(absl::Seconds(5)));
  }
  CHECK(console.Read() ==
        "[a]: Password: secret\n"
        "[a]: \r 10%\n"
        "[b]: b's line\n"
        "[a]: \r 20%\n"
        "[b]: bye\n");
}

TEST_CASE("Duplicate filters get matching lines, shown or not",
          "[launcher][unit]") {
  ScratchFile filtered;
  DuplicateFilter duplicate{{"loss", "acc"}, filtered.fd};
  {
    WorkerOutput hidden("[h]: ", nullptr, -1, &duplicate);
    hidden.Append("step 1\nloss 0.5\nacc", kT0);
    // Not shown anywhere, so nothing waits to be shown in part.
    CHECK(hidden.PartialDue() == absl::InfiniteFuture());
    hidden.Finish();
  }
  CHECK(filtered.Read() == "[h]: loss 0.5\n[h]: acc\n");
}

TEST_CASE("Long lines stay whole up to the bound, and log files stay verbatim",
          "[launcher][unit]") {
  const std::string whole(WorkerOutput::kMaxLine, 'w');
  const std::string longer(WorkerOutput::kMaxLine + 10, 'x');
  ScratchFile console, file;
  {
    Console sink(console.fd, 8 << 20);
    WorkerOutput out("[p]: ", &sink, dup(file.fd));
    // Delivered in odd pieces, as pipes do.
    const std::string all = whole + "\n" + longer + "\nend";
    for (size_t i = 0; i < all.size(); i += 4093) {
      out.Append(absl::string_view(all).substr(i, 4093), kT0);
    }
    out.Finish();
    REQUIRE(sink.Flush(absl::Seconds(10)));
  }
  CHECK(file.Read() == whole + "\n" + longer + "\nend");
  CHECK(console.Read() ==
        "[p]: " + whole + "\n[p]: " + longer.substr(0, WorkerOutput::kMaxLine) +
            " [ctrun: cut at 1 MiB; the whole line is in the log file]\n"
            "[p]: end\n");
}

TEST_CASE("Line prefix templates expand known names", "[launcher][unit]") {
  CHECK(ExpandTemplate("[${host}:${rank}]: ",
                       {{"host", "n1"}, {"rank", "7"}}) == "[n1:7]: ");
  CHECK(ExpandTemplate("${role_name}${local_rank}|${nope}|${",
                       {{"role_name", "default"}, {"local_rank", "0"}}) ==
        "default0|${nope}|${");
}

std::string TempFile(const std::string& content) {
  char path[] = "/tmp/ctrun-unit-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(write(fd, content.data(), content.size()) ==
          static_cast<ssize_t>(content.size()));
  close(fd);
  return path;
}

TEST_CASE("Error files in torch's record format are read", "[launcher][unit]") {
  const std::string path = TempFile(
      R"({"message": {"message": "ValueError: bad", "extraInfo": )"
      R"({"py_callstack": "Traceback (most recent call last):\n  x\n", )"
      R"("timestamp": "1700000000"}}})");
  auto c = ReadErrorFile(path);
  REQUIRE(c.ok());
  CHECK(c->message == "ValueError: bad");
  CHECK(c->traceback == "Traceback (most recent call last):\n  x");
  unlink(path.c_str());
  CHECK(absl::IsNotFound(ReadErrorFile("/nonexistent/error.json").status()));
  const std::string junk = TempFile("not json");
  CHECK(absl::IsInvalidArgument(ReadErrorFile(junk).status()));
  unlink(junk.c_str());
}

TEST_CASE("The failure summary shows the root cause first with its signal",
          "[launcher][unit]") {
  WorkerFailureRecord root{absl::Now(), "node-a",       3,  1,    0, SIGSEGV,
                           4242,        "/nonexistent", "", false};
  WorkerFailureRecord later{absl::Now(), "node-a",       0,  0,    1, 0,
                            4240,        "/nonexistent", "", false};
  CHECK(root.ExitCode() == 128 + SIGSEGV);
  CHECK(later.ExitCode() == 1);
  const std::string s = FormatFailureSummary("train.py", {root, later});
  CHECK(s.find("train.py FAILED") != std::string::npos);
  const size_t root_at = s.find("Root Cause");
  REQUIRE(root_at != std::string::npos);
  CHECK(s.find("rank       : 3 (local_rank: 1)", root_at) != std::string::npos);
  CHECK(s.find("SIGSEGV", root_at) != std::string::npos);
  CHECK(s.find("pid: 4242") != std::string::npos);
  CHECK(s.find("rank       : 0 (local_rank: 0)") < root_at);
}

TEST_CASE("Python is the one torch's environment would use",
          "[launcher][unit]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-python-" + std::to_string(getpid()));
  auto executable = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
  };
  const std::string venv_python = dir + "/venv/bin/python3";
  const std::string env_python = dir + "/env/bin/python3.12";
  executable(venv_python, "#!/bin/sh\n");
  executable(env_python, "#!/bin/sh\n");
  executable(dir + "/bin/torchrun", "#!" + env_python + "\nimport sys\n");
  executable(dir + "/bin/python3", "#!/bin/sh\n");
  const std::string path = dir + "/bin:/usr/bin:/bin";

  // PYTHON_EXEC > the active virtualenv > torchrun's own interpreter > PATH.
  CHECK(FindPython({{"PATH", path},
                    {"VIRTUAL_ENV", dir + "/venv"},
                    {"PYTHON_EXEC", "/bin/sh"}})
            .path == "/bin/sh");
  const PythonChoice venv =
      FindPython({{"PATH", path}, {"VIRTUAL_ENV", dir + "/venv"}});
  CHECK(venv.path == venv_python);
  CHECK(venv.source == "VIRTUAL_ENV");
  const PythonChoice torchrun = FindPython({{"PATH", path}});
  CHECK(torchrun.path == env_python);
  CHECK(torchrun.source == "the #! line of " + dir + "/bin/torchrun");
  std::filesystem::remove(dir + "/bin/torchrun");
  // (this machine's own torchrun, if any, is off this PATH)
  CHECK(FindPython({{"PATH", dir + "/bin"}}).path == dir + "/bin/python3");
  CHECK(FindPython({{"PATH", dir + "/none"}}).path.empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("Entrypoints resolve like torchrun's", "[launcher][unit]") {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("ctrun-cmd-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/train.py";
  std::ofstream(script) << "print(1)\n";
  const std::string program = dir + "/run.sh";
  std::ofstream(program) << "#!/bin/sh\n";
  chmod(program.c_str(), 0755);
  const std::string plain = dir + "/data.txt";
  std::ofstream(plain) << "x\n";
  const EnvMap env = {{"PATH", dir + ":/usr/bin:/bin"},
                      {"PYTHON_EXEC", "/bin/sh"}};  // stands in for python

  LaunchOptions o;
  o.entrypoint = script;
  o.script_args = {"--lr", "1"};
  CHECK(*ResolveWorkerCommand(o, env) ==
        std::vector<std::string>{"/bin/sh", "-u", script, "--lr", "1"});
  o.module = true;
  o.entrypoint = "pkg.train";
  CHECK(*ResolveWorkerCommand(o, env) ==
        std::vector<std::string>{"/bin/sh", "-u", "-m", "pkg.train", "--lr",
                                 "1"});
  o.module = false;
  o.entrypoint = "run.sh";  // found in PATH
  CHECK((*ResolveWorkerCommand(o, env))[0] == program);
  o.no_python = true;
  o.entrypoint = program;
  CHECK((*ResolveWorkerCommand(o, env))[0] == program);

  o.no_python = false;
  o.entrypoint = dir + "/missing.py";
  auto missing = ResolveWorkerCommand(o, env);
  CHECK(missing.status().message().find("not found") != std::string::npos);
  o.entrypoint = "no-such-program";
  auto not_in_path = ResolveWorkerCommand(o, env);
  CHECK(not_in_path.status().message().find("not found in PATH") !=
        std::string::npos);
  o.entrypoint = plain;
  auto not_exec = ResolveWorkerCommand(o, env);
  CHECK(not_exec.status().message().find("not an executable") !=
        std::string::npos);
  o.entrypoint = script;
  auto no_python = ResolveWorkerCommand(o, {{"PATH", "/nonexistent"}});
  CHECK(no_python.status().message().find("python3") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPUs are counted from CUDA_VISIBLE_DEVICES or the driver",
          "[launcher][unit]") {
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "0,1,3"}}).gpu_count == 3);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", ""}}).gpu_count == 0);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "-1"}}).gpu_count == 0);
  CHECK(DetectHostFacts({{"CUDA_VISIBLE_DEVICES", "0,-1,2"}}).gpu_count == 1);
  const std::string root = std::filesystem::temp_directory_path() /
                           ("ctrun-gpus-" + std::to_string(getpid()));
  std::filesystem::create_directories(root + "/proc/driver/nvidia/gpus/a");
  std::filesystem::create_directories(root + "/proc/driver/nvidia/gpus/b");
  CHECK(DetectHostFacts({}, root).gpu_count == 2);
  std::filesystem::remove_all(root);
  CHECK(DetectHostFacts({}).cpu_count >= 1);
}

TEST_CASE("Intel GPUs are counted from ZE_AFFINITY_MASK or the render nodes",
          "[launcher][unit]") {
  CHECK(DetectHostFacts({{"ZE_AFFINITY_MASK", "0,1.0,2"}}).xpu_count == 3);
  CHECK(DetectHostFacts({{"ZE_AFFINITY_MASK", ""}}).xpu_count == 0);
  const std::string root = std::filesystem::temp_directory_path() /
                           ("ctrun-xpus-" + std::to_string(getpid()));
  for (auto [node, vendor] :
       {std::pair{"renderD128", "0x8086"}, std::pair{"renderD129", "0x8086"},
        std::pair{"renderD130", "0x10de"}}) {
    const std::string dir =
        absl::StrCat(root, "/sys/class/drm/", node, "/device");
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/vendor") << vendor << "\n";
  }
  std::filesystem::create_directories(root + "/sys/class/drm/card0");
  const HostFacts facts = DetectHostFacts({}, root);
  CHECK(facts.xpu_count == 2);
  CHECK(facts.xpu_source == "Intel render nodes in /sys/class/drm");
  std::filesystem::remove_all(root);
}

TEST_CASE("nproc_per_node=xpu starts one worker per Intel GPU",
          "[launcher][unit]") {
  HostFacts host = kHost;
  host.xpu_count = 2;
  host.xpu_source = "ZE_AFFINITY_MASK=0,1";
  auto c = Parse({"--nproc_per_node=xpu", "train.py"}, {}, host);
  REQUIRE(c.ok());
  CHECK(c->options.local_world_size == 2);
  auto none = Parse({"--nproc_per_node=xpu", "train.py"}, {}, kHost);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message().find("no Intel GPU (XPU) is visible") !=
        std::string::npos);
}

}  // namespace
}  // namespace ctrun

namespace ctrun {
namespace {

TEST_CASE("A job id is one folder name under the log dir, whatever it holds",
          "[launcher][unit]") {
  CHECK(RunFolderName("job-7") == "job-7");
  CHECK(RunFolderName("../x") == ".._x");
  CHECK(RunFolderName("a/b/c") == "a_b_c");
  CHECK(RunFolderName("/") == "_");
  CHECK(RunFolderName("") == "job");
  CHECK(RunFolderName(std::string(300, 'x')).size() == 200);
  // ".." alone gets mkdtemp's suffix: ".._XXXXXX" is a plain name.
  CHECK(RunFolderName("..") == "..");
}

}  // namespace
}  // namespace ctrun
