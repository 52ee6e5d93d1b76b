// The command line: flags, PET_ variables, the launch plan.
#include "launcher/options/command_line.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "launcher/options/host_facts.h"
#include "launcher/options/rendezvous_plan.h"
#include "rendezvous/core/failure_class.h"

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

TEST_CASE(
    "The flag --restart_on names the failure classes that restart, all but "
    "user_error by default",
    "[launcher][unit]") {
  auto plain = Parse({"train"});
  REQUIRE(plain.ok());
  CHECK(plain->options.restart_on == RestartOnDefault());
  auto all = Parse({"--restart_on=all", "train"});
  REQUIRE(all.ok());
  CHECK(all->options.restart_on == RestartOnAll());
  auto some = Parse({"--restart-on", "oom,hang", "train"});
  REQUIRE(some.ok());
  CHECK(FormatRestartOn(some->options.restart_on) == "oom,hang");
  auto bad = Parse({"--restart_on=user-error", "train"});
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message() ==
        "--restart_on=user-error: 'user-error' is not a failure class; use a "
        "comma-separated list of all, default, user_error, oom, hardware, "
        "network, hang, signal, other");
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

TEST_CASE(
    "Flag -v asks for every rank's usage line, and the default is one a node",
    "[launcher][unit]") {
  CHECK_FALSE(Parse({"t"})->options.verbose);
  CHECK(Parse({"-v", "t"})->options.verbose);
  CHECK(Parse({"--verbose", "t"})->options.verbose);
  // After the entrypoint it is the script's.
  auto c = Parse({"t", "-v"});
  CHECK_FALSE(c->options.verbose);
  CHECK(c->options.script_args == std::vector<std::string>{"-v"});
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

TEST_CASE("In-process recovery is opt-in, by flag or PET_RECOVERY",
          "[launcher][unit]") {
  CHECK(Parse({"t"})->options.recovery == Recovery::kRestart);
  auto c = Parse({"--recovery=inprocess", "--recovery-timeout=4", "t"});
  REQUIRE(c.ok());
  CHECK(c->options.recovery == Recovery::kInProcess);
  CHECK(c->options.recovery_timeout == absl::Seconds(4));
  CHECK(Parse({"t"}, {{"PET_RECOVERY", "inprocess"}})->options.recovery ==
        Recovery::kInProcess);
}

TEST_CASE("Spares and segments, by flag or PET_, need a rendezvous",
          "[launcher][unit][spares]") {
  auto c =
      Parse({"--nnodes=2", "--rdzv_endpoint=127.0.0.1:29400",
             "--rdzv_backend=c10d", "--spares=1", "--segment=rack-2", "t"});
  REQUIRE(c.ok());
  CHECK(c->options.spares == 1);
  CHECK(c->options.segment == "rack-2");
  CHECK(Find(c->options, "spares")->value == "1");
  auto pet = Parse({"--nnodes=2", "--rdzv_endpoint=127.0.0.1:29400",
                    "--rdzv_backend=c10d", "t"},
                   {{"PET_SPARES", "2"}, {"PET_SEGMENT", "nvl0"}});
  REQUIRE(pet.ok());
  CHECK(pet->options.spares == 2);
  CHECK(pet->options.segment == "nvl0");
  auto static_spares = Parse({"--nnodes=2", "--spares=1", "t"});
  REQUIRE(absl::IsInvalidArgument(static_spares.status()));
  CHECK(static_spares.status().message() ==
        "--spares=1: a static rendezvous fixes every node's rank and keeps "
        "no spares; use --rdzv_backend=c10d");
  auto bad = Parse({"--segment=rack 1", "t"});
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message() ==
        "--segment=rack 1: segment may hold only [A-Za-z0-9._:/-], not byte "
        "0x20 (' ')");
  auto many = Parse({"--spares=5000", "t"});
  REQUIRE(absl::IsInvalidArgument(many.status()));
  CHECK(many.status().message().find("--spares=5000") == 0);
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
           {{"--recovery=fast", "t"},
            "--recovery=fast",
            "restart or inprocess"},
           {{"--recovery_timeout=-1", "t"}, "--recovery_timeout=-1", ">= 0"},
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

  // Without --local_addr, node 0 advertises --master_addr as given when it
  // names this node (loopback here), and says why when it does not.
  auto loopback = Parse({"--nnodes=2", "--node_rank=0",
                         "--master_addr=127.0.0.2", "--master_port=4000", "t"});
  REQUIRE(loopback.ok());
  auto as_given = PlanRendezvous(loopback->options, "node", {});
  REQUIRE(as_given.ok());
  CHECK(as_given->address == "127.0.0.2");
  CHECK(as_given->notice.empty());
  auto named = Parse({"--nnodes=2", "--node_rank=0", "--master_addr=node",
                      "--master_port=4000", "t"});
  REQUIRE(named.ok());
  CHECK(PlanRendezvous(named->options, "node", {})->address == "node");

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

TEST_CASE("A node is named by the --local_addr given, else by its hostname",
          "[options][unit]") {
  auto given = Parse({"--nnodes=2", "--rdzv_endpoint=127.0.0.1:29400",
                      "--local_addr=127.0.0.3", "t"});
  REQUIRE(given.ok());
  auto plan = PlanRendezvous(given->options, "vm", {});
  REQUIRE(plan.ok());
  CHECK(plan->name == "127.0.0.3");
  // One derived from a single node's --master_addr names nothing new.
  auto derived = Parse({"--master_addr=127.0.0.1", "t"});
  REQUIRE(derived.ok());
  REQUIRE(derived->options.local_addr == "127.0.0.1");
  plan = PlanRendezvous(derived->options, "vm", {});
  REQUIRE(plan.ok());
  CHECK(plan->name == "vm");
  auto standalone = Parse({"--standalone", "t"});
  REQUIRE(standalone.ok());
  CHECK(PlanRendezvous(standalone->options, "vm", {})->name == "vm");
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

// Fails before: nothing said that the first failure would end the job.
TEST_CASE(
    "In-process recovery with torchrun's restart budget of 0 says what a "
    "failure will do",
    "[launcher][unit]") {
  auto zero = Parse({"--recovery=inprocess", "t"});
  REQUIRE(zero.ok());
  REQUIRE(zero->options.notices.size() == 1);
  CHECK(zero->options.notices[0] ==
        "--recovery=inprocess with --max_restarts=0 (the default): a "
        "worker's failure ends the job; only lost and new nodes are "
        "recovered in process. Give --max_restarts=N to recover N failures");
  CHECK(Parse({"--recovery=inprocess", "--max_restarts=2", "t"})
            ->options.notices.empty());
  // --dry_run says it too.
  CHECK(FormatLaunchPlan(zero->options, {"t"})
            .find("  note: --recovery=inprocess with --max_restarts=0") !=
        std::string::npos);
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
        "--min_progress_seconds, --monitor_interval, --module, "
        "--master_addr, --master_port, "
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
  // What a torchrun user needs first: Slurm's part and the exit codes.
  CHECK(help.find("Inside Slurm (an srun step of an allocation), flags left "
                  "unset come from Slurm") != std::string::npos);
  CHECK(help.find("Exit status: the first failed worker's own") !=
        std::string::npos);
  CHECK(help.find("124 when\nthe job failed because a worker hung") !=
        std::string::npos);
  for (absl::string_view line :
       absl::StrSplit(help.substr(help.find("Inside Slurm")), '\n')) {
    CHECK(line.size() <= 80);
  }
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
