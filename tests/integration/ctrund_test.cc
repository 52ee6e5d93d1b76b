// The real ctrund process on 127.0.0.1:0, driven by in-process sessions and
// by test_agent processes.
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "rendezvous/client/client.h"
#include "rendezvous/server/rendezvous_server.h"
#include "tests/support/daemon.h"
#include "tests/support/session_probe.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(20);

std::string WriteTempFile(const std::string& content) {
  char path[] = "/tmp/ctrun-test-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, content.data(), content.size()) ==
          static_cast<ssize_t>(content.size()));
  close(fd);
  return path;
}

// What a SessionStream's handlers saw.
struct Seen {
  absl::Mutex mu;
  std::vector<v1::ServerMessage> messages ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> done ABSL_GUARDED_BY(mu);
  bool redirected ABSL_GUARDED_BY(mu) = false;

  SessionStream::Handlers Handlers() {
    SessionStream::Handlers h;
    h.on_message = [this](const v1::ServerMessage& m) {
      absl::MutexLock lock(&mu);
      messages.push_back(m);
    };
    h.on_done = [this](const absl::Status& s, bool r) {
      absl::MutexLock lock(&mu);
      done = s;
      redirected = r;
    };
    return h;
  }
  std::optional<v1::Assignment> Assignment(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto assigned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      for (const auto& m : messages) {
        if (m.has_assignment()) return true;
      }
      return false;
    };
    if (!mu.AwaitWithTimeout(absl::Condition(&assigned), timeout)) {
      return std::nullopt;
    }
    for (const auto& m : messages) {
      if (m.has_assignment()) return m.assignment();
    }
    return std::nullopt;
  }
};

TEST_CASE(
    "An agent in the server's own process joins without a transport beside "
    "nodes over gRPC and its session ends as a stream's does",
    "[ctrund][integration]") {
  ServerOptions options;
  options.start_grpc_on_first_connection = true;
  auto server = RendezvousServer::Start(std::move(options));
  REQUIRE(server.ok());
  const std::string endpoint = (*server)->endpoint().ToString();
  ConnectionOptions to_self;
  to_self.endpoint = endpoint;
  to_self.local = (*server)->local();
  auto self = Connection::Open(to_self);
  REQUIRE(self.ok());

  JoinSpec spec;
  spec.job = "mixed";
  spec.host = "here";
  spec.min_nodes = 2;
  spec.max_nodes = 2;
  Seen here;
  auto session = SessionStream::Start(*self, MakeJoin(spec), here.Handlers());
  // A node over gRPC (which starts at its connection) joins the same job.
  spec.host = "there";
  ConnectionOptions to_server;
  to_server.endpoint = endpoint;
  SessionProbe there(*Connection::Open(to_server), MakeJoin(spec));
  auto remote = there.NextAssignment(kWait);
  REQUIRE(remote);
  auto local = here.Assignment(kWait);
  REQUIRE(local);
  CHECK(local->world_size() == 2);
  CHECK(remote->world_size() == 2);
  CHECK(local->round() == remote->round());
  CHECK(local->group_rank() + remote->group_rank() == 1);

  // Leaving ends the session with OK, as a half-close does.
  session->Close();
  auto left = session->WaitFor(kWait);
  REQUIRE(left);
  CHECK(left->ok());
  {
    absl::MutexLock lock(&here.mu);
    REQUIRE(here.done);
    CHECK(here.done->ok());
    CHECK_FALSE(here.redirected);
  }

  // A cancelled one ends CANCELLED; one still open when the server shuts
  // down ends UNAVAILABLE.
  spec.job = "alone";
  spec.host = "here";
  spec.min_nodes = spec.max_nodes = 1;
  Seen cancelled, open;
  auto first =
      SessionStream::Start(*self, MakeJoin(spec), cancelled.Handlers());
  REQUIRE(cancelled.Assignment(kWait));
  first->Cancel();
  auto cancel = first->WaitFor(kWait);
  REQUIRE(cancel);
  CHECK(absl::IsCancelled(*cancel));
  spec.job = "open";
  auto second = SessionStream::Start(*self, MakeJoin(spec), open.Handlers());
  REQUIRE(open.Assignment(kWait));
  (*server)->Shutdown();
  auto shut = second->WaitFor(kWait);
  REQUIRE(shut);
  CHECK(absl::IsUnavailable(*shut));
}

TEST_CASE("A client process killed with kill -9 is lost through its stream",
          "[ctrund][integration]") {
  Daemon daemon;
  JoinSpec spec;
  spec.job = "crash";
  spec.host = "survivor";
  spec.min_nodes = 1;
  spec.max_nodes = 2;
  // Far beyond the test's wait: a loss seen in time came from the stream.
  spec.heartbeat_timeout_ms = 120'000;
  SessionProbe survivor(daemon.Connect(), MakeJoin(spec));
  ChildProcess agent({TestAgentPath(), daemon.endpoint(), "crash", "victim",
                      "1", "2", "120000"});
  REQUIRE(agent.WaitForLine("assignment round=0", kWait));
  REQUIRE(survivor.NextAssignment(kWait));

  agent.Signal(SIGKILL);
  auto restart = survivor.NextRestart(absl::Seconds(10));
  REQUIRE(restart);
  CHECK(restart->reason() == v1::RestartRequired::NODE_LOST);
  CHECK(restart->detail().find("victim") != std::string::npos);
  CHECK(restart->detail().find("session closed") != std::string::npos);
  CHECK(restart->restart_count() == 0);

  survivor.Rejoin(restart->round());
  auto next = survivor.NextAssignment(kWait);
  REQUIRE(next);
  CHECK(next->round() == 1);
  CHECK(next->world_size() == 1);
}

TEST_CASE("A stalled client is lost after the heartbeat timeout then refused",
          "[ctrund][integration]") {
  Daemon daemon;
  JoinSpec spec;
  spec.job = "stall";
  spec.host = "survivor";
  spec.min_nodes = 1;
  spec.max_nodes = 2;
  spec.heartbeat_timeout_ms = 1500;
  SessionProbe survivor(daemon.Connect(), MakeJoin(spec),
                        absl::Milliseconds(200));
  ChildProcess agent({TestAgentPath(), daemon.endpoint(), "stall", "sleeper",
                      "1", "2", "1500"});
  REQUIRE(agent.WaitForLine("assignment round=0", kWait));
  REQUIRE(survivor.NextAssignment(kWait));

  agent.Signal(SIGSTOP);
  auto restart = survivor.NextRestart(kWait);
  agent.Signal(SIGCONT);
  REQUIRE(restart);
  CHECK(restart->reason() == v1::RestartRequired::NODE_LOST);
  CHECK(restart->detail().find("without a heartbeat") != std::string::npos);

  // The resumed agent finds its session ended as stale.
  auto ended = agent.WaitForLine("ended", kWait);
  REQUIRE(ended);
  CHECK(ended->find("code=ABORTED") != std::string::npos);
  CHECK(ended->find("declared lost") != std::string::npos);
  CHECK(agent.Wait(kWait) == 3);
}

TEST_CASE("Store requests for a stale round are refused with ABORTED",
          "[ctrund][integration]") {
  Daemon daemon;
  JoinSpec spec;
  spec.job = "fence";
  auto join = MakeJoin(spec);
  join.mutable_settings()->set_max_restarts(1);
  SessionProbe c(daemon.Connect(), join);
  REQUIRE(c.NextAssignment(kWait));
  StoreClient store(daemon.Connect(), "fence", 0);
  REQUIRE(store.Set("k", "v").ok());
  c.Report(0, v1::WorkerReport::FAILED);
  auto restart = c.NextRestart(kWait);
  REQUIRE(restart);
  auto stale = store.Get("k");
  CHECK(absl::IsAborted(stale.status()));
  CHECK(stale.status().message() ==
        "store request for round 0 of job 'fence', which is at round 1");

  c.Rejoin(99);  // not the round it was told to rejoin
  auto done = c.WaitDone(kWait);
  REQUIRE(done);
  CHECK(absl::IsAborted(*done));
}

TEST_CASE("Wrong or missing tokens are refused and logged",
          "[ctrund][integration]") {
  const std::string token_file = WriteTempFile("s3cret-token\n");
  Daemon daemon({"--token-file", token_file});

  AdminClient right(daemon.Connect("s3cret-token"));
  CHECK(right.ListJobs().ok());

  AdminClient wrong(daemon.Connect("guess"));
  auto refused = wrong.ListJobs();
  CHECK(absl::IsUnauthenticated(refused.status()));
  CHECK(refused.status().message() == "wrong rendezvous token");

  StoreClient anonymous(daemon.Connect(), "job", 0);
  auto missing = anonymous.Set("k", "v");
  CHECK(absl::IsUnauthenticated(missing));
  CHECK(missing.message() ==
        "missing rendezvous token (give the token file the service was "
        "started with)");

  SessionProbe intruder(daemon.Connect("guess"), MakeJoin({}));
  auto ended = intruder.WaitDone(kWait);
  REQUIRE(ended);
  CHECK(absl::IsUnauthenticated(*ended));

  // The daemon's log names each refusal, and never the secret.
  auto& d = daemon.process();
  CHECK(d.StderrContains("refused ListJobs", kWait));
  CHECK(d.StderrContains("refused Store", kWait));
  CHECK(d.StderrContains("missing rendezvous token", kWait));
  CHECK(d.StderrContains("refused Session", kWait));
  CHECK(d.Stderr().find("s3cret") == std::string::npos);
  unlink(token_file.c_str());
}

TEST_CASE("A job token reaches its own job and nothing of another",
          "[ctrund][integration]") {
  const std::string token_file = WriteTempFile("s3cret-token\n");
  Daemon daemon({"--token-file", token_file});
  ChildProcess minted({CtrundPath(), "job-token", "--token-file", token_file,
                       "--job", "alpha"});
  auto alpha_token = minted.ReadLine(kWait);
  REQUIRE(alpha_token);
  REQUIRE(minted.Wait(kWait) == 0);
  CHECK(alpha_token->rfind("job.alpha.", 0) == 0);
  CHECK(alpha_token->find("s3cret") == std::string::npos);

  const Connection admin = daemon.Connect("s3cret-token");
  const Connection alpha = daemon.Connect(*alpha_token);
  JoinSpec spec;
  spec.job = "alpha";
  SessionProbe alpha_node(alpha, MakeJoin(spec));
  REQUIRE(alpha_node.NextAssignment(kWait));
  spec.job = "beta";
  SessionProbe beta_node(admin, MakeJoin(spec));
  REQUIRE(beta_node.NextAssignment(kWait));
  REQUIRE(StoreClient(admin, "beta", 0).Set("secret", "b").ok());

  // Its own job: store and status.
  CHECK(StoreClient(alpha, "alpha", 0).Set("k", "a").ok());
  auto listed = AdminClient(alpha).ListJobs();
  REQUIRE(listed.ok());
  REQUIRE(listed->jobs_size() == 1);
  CHECK(listed->jobs(0).job_id() == "alpha");

  // Another job: no key read or written, no status, no joining it.
  StoreClient into_beta(alpha, "beta", 0);
  auto read = into_beta.Get("secret");
  CHECK(absl::IsPermissionDenied(read.status()));
  CHECK(read.status().message() ==
        "this token is for job 'alpha', not job 'beta'");
  CHECK(absl::IsPermissionDenied(into_beta.Set("secret", "x")));
  CHECK(absl::IsPermissionDenied(
      AdminClient(alpha).DescribeJob("beta").status()));
  spec.host = "intruder";
  SessionProbe intruder(alpha, MakeJoin(spec));
  auto ended = intruder.WaitDone(kWait);
  REQUIRE(ended);
  CHECK(absl::IsPermissionDenied(*ended));
  auto beta = AdminClient(admin).DescribeJob("beta");
  REQUIRE(beta.ok());
  CHECK(beta->nodes_size() == 1);  // the intruder never got in
  CHECK(*StoreClient(admin, "beta", 0).Get("secret") == "b");

  // A token for alpha made up or altered does not pass.
  std::string forged = *alpha_token;
  forged.back() = forged.back() == '0' ? '1' : '0';
  CHECK(absl::IsUnauthenticated(
      AdminClient(daemon.Connect(forged)).ListJobs().status()));
  CHECK(absl::IsUnauthenticated(
      AdminClient(daemon.Connect("job.beta." + alpha_token->substr(11)))
          .ListJobs()
          .status()));
  unlink(token_file.c_str());
}

TEST_CASE("ctrund serves TLS to clients that trust its certificate",
          "[ctrund][integration]") {
  char dir_template[] = "/tmp/ctrun-tls-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  MakeSelfSignedCert("127.0.0.1", cert, key);
  Daemon daemon({"--tls-cert", cert, "--tls-key", key});

  ConnectionOptions trusted;
  trusted.endpoint = daemon.endpoint();
  trusted.tls_ca_file = cert;
  auto connection = Connection::Open(trusted);
  REQUIRE(connection.ok());
  AdminClient tls(*connection);
  CHECK(tls.ListJobs().ok());

  AdminClient plaintext(daemon.Connect());
  CHECK(absl::IsUnavailable(plaintext.ListJobs().status()));

  ConnectionOptions missing_ca = trusted;
  missing_ca.tls_ca_file = dir + "/nope.pem";
  CHECK(absl::IsInvalidArgument(Connection::Open(missing_ca).status()));
  unlink(cert.c_str());
  unlink(key.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("Oversized values are refused by the store and by the transport",
          "[ctrund][integration]") {
  Daemon daemon;
  SessionProbe node(daemon.Connect(), MakeJoin({}));
  REQUIRE(node.NextAssignment(kWait));
  StoreClient store(daemon.Connect(), "job", 0);

  auto over_limit = store.Set("big", std::string((1 << 20) + 1, 'x'));
  CHECK(absl::IsInvalidArgument(over_limit));
  CHECK(over_limit.message().find("limit is 1048576") != std::string::npos);

  auto huge = store.Set("huge", std::string(8 << 20, 'x'));
  CHECK(absl::IsResourceExhausted(huge));

  CHECK(store.Set("fits", std::string(1 << 20, 'x')).ok());
  CHECK(*store.NumKeys() == 1);
}

TEST_CASE("A waiting get is woken by set and times out otherwise",
          "[ctrund][integration]") {
  Daemon daemon;
  SessionProbe node(daemon.Connect(), MakeJoin({}));
  REQUIRE(node.NextAssignment(kWait));
  StoreClient waiter(daemon.Connect("", true), "job", 0);
  StoreClient setter(daemon.Connect("", true), "job", 0);

  absl::StatusOr<std::string> got;
  std::thread t([&] { got = waiter.Get("id", absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(100));
  REQUIRE(setter.Set("id", "nccl-unique-id").ok());
  t.join();
  REQUIRE(got.ok());
  CHECK(*got == "nccl-unique-id");

  auto missing = waiter.Get("never", absl::Milliseconds(200));
  CHECK(absl::IsDeadlineExceeded(missing.status()));

  CHECK(absl::IsNotFound(waiter.Get("never").status()));
  CHECK(waiter.Wait({"id"}, absl::Milliseconds(100)).ok());
  auto many = waiter.MultiGet({"id", "later"}, absl::Milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(many.status()));
}

TEST_CASE("Store operations work end to end", "[ctrund][integration]") {
  Daemon daemon;
  SessionProbe node(daemon.Connect(), MakeJoin({}));
  REQUIRE(node.NextAssignment(kWait));
  StoreClient store(daemon.Connect(), "job", 0);
  CHECK(*store.Add("counter", 2) == 2);
  CHECK(*store.Add("counter", 3) == 5);
  auto cas = store.CompareSet("leader", "", "rank0");
  REQUIRE(cas.ok());
  CHECK(cas->swapped);
  CHECK_FALSE(store.CompareSet("leader", "", "rank1")->swapped);
  REQUIRE(store.MultiSet({{"a", "1"}, {"b", "2"}}).ok());
  CHECK(*store.MultiGet({"b", "a"}) == std::vector<std::string>{"2", "1"});
  CHECK(*store.Check({"a", "b"}));
  CHECK(*store.Delete("a"));
  CHECK_FALSE(*store.Check({"a", "b"}));
  CHECK(*store.NumKeys() == 3);
  CHECK(absl::IsNotFound(
      StoreClient(daemon.Connect(), "no-such-job", 0).Set("k", "v")));
}

// Sends `bytes` as the one message of a stream to `method`, half-closes,
// and returns how the service ended the stream.
grpc::Status SendRaw(const Connection& connection, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub stub(connection.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, method, &queue);
  auto step = [&queue](auto&& start) {
    start(reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(queue.Next(&tag, &ok));
    return ok;
  };
  step([&](void* tag) { call->StartCall(tag); });
  grpc::Slice slice(bytes);
  grpc::ByteBuffer message(&slice, 1);
  step([&](void* tag) { call->Write(message, tag); });
  step([&](void* tag) { call->WritesDone(tag); });
  grpc::Status status;
  step([&](void* tag) { call->Finish(&status, tag); });
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

TEST_CASE(
    "A stream whose first message does not parse is refused with "
    "INVALID_ARGUMENT",
    "[ctrund][integration]") {
  Daemon daemon;
  // Field 0x1fffffff with wire type 7: no protobuf message parses it.
  const std::string garbage = "\xff\xff\xff\xff\xff";
  for (const char* method :
       {"/ctrun.v1.Rendezvous/Session", "/ctrun.v1.Store/Pipe"}) {
    INFO(method);
    const grpc::Status status = SendRaw(daemon.Connect(), method, garbage);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(status.error_message().find("does not parse") != std::string::npos);
  }
  // A well-formed join still opens a session.
  SessionProbe probe(daemon.Connect(), MakeJoin(JoinSpec{}));
  CHECK(probe.NextAssignment(absl::Seconds(10)));
}

TEST_CASE("ctrund status shows jobs nodes and ranks", "[ctrund][integration]") {
  Daemon daemon;
  JoinSpec spec;
  spec.job = "visible";
  spec.host = "node-a";
  spec.local_world_size = 4;
  SessionProbe node(daemon.Connect(), MakeJoin(spec));
  REQUIRE(node.NextAssignment(kWait));

  ChildProcess table({CtrundPath(), "status", "--endpoint", daemon.endpoint()});
  std::string out;
  while (auto line = table.ReadLine(kWait)) out += *line + "\n";
  CHECK(table.Wait(kWait) == 0);
  CHECK(out.find("job visible  running  round 0") != std::string::npos);
  CHECK(out.find("node-a") != std::string::npos);
  CHECK(out.find("0-3") != std::string::npos);

  ChildProcess json({CtrundPath(), "status", "--endpoint", daemon.endpoint(),
                     "--json", "--job", "visible"});
  out.clear();
  while (auto line = json.ReadLine(kWait)) out += *line + "\n";
  CHECK(json.Wait(kWait) == 0);
  CHECK(out.find("\"job_id\": \"visible\"") != std::string::npos);
  // 64-bit integers are numbers, like every other number.
  CHECK(out.find("\"round\": 0,") != std::string::npos);
  CHECK(std::regex_search(out, std::regex("\"heartbeat_age_ms\": [0-9]+")));
  CHECK(std::regex_search(out, std::regex("\"num_keys\": [0-9]+")));
  CHECK_FALSE(std::regex_search(out, std::regex("\": \"[0-9]+\"")));

  ChildProcess missing({CtrundPath(), "status", "--endpoint", daemon.endpoint(),
                        "--job", "nope"});
  CHECK(missing.Wait(kWait) == 1);
  CHECK(missing.Stderr().find("NOT_FOUND") != std::string::npos);
}

TEST_CASE("ctrund status shows what the job learned and its stragglers",
          "[ctrund][integration]") {
  Daemon daemon;
  JoinSpec spec;
  spec.job = "paced";
  spec.host = "node-a";
  spec.local_world_size = 4;
  SessionProbe node(daemon.Connect(), MakeJoin(spec));
  REQUIRE(node.NextAssignment(kWait));
  // What an agent reports of its ranks: rank 3 is 40% slower, report after
  // report, and the longest silence in 'step' was 1.25 s.
  for (int report = 0; report < 4; ++report) {
    v1::AgentMessage m;
    auto* r = m.mutable_progress_report();
    r->set_round(0);
    auto* l = r->add_longest();
    l->set_section("step");
    l->set_longest_ms(1250);
    for (int rank = 0; rank < 4; ++rank) {
      auto* p = r->add_paces();
      p->set_rank(rank);
      p->set_steps(8);
      p->set_mean_step_us(rank == 3 ? 140000 : 100000);
    }
    node.stream().Send(m);
  }
  auto named = node.Next(
      [](const v1::ServerMessage& m) { return m.has_straggler(); }, kWait);
  REQUIRE(named.has_value());
  CHECK(named->straggler().rank() == 3);

  ChildProcess table({CtrundPath(), "status", "--endpoint", daemon.endpoint()});
  std::string out;
  while (auto line = table.ReadLine(kWait)) out += *line + "\n";
  INFO(out);
  CHECK(table.Wait(kWait) == 0);
  CHECK(out.find("longest silence in 'step': 1.25s (--hang_timeout=auto)") !=
        std::string::npos);
  CHECK(std::regex_search(
      out, std::regex("straggler: rank 3 on node-a:[0-9]+, 1.4x the median "
                      "step \\(2[0-9] steps\\)")));
}

TEST_CASE("ctrund stops cleanly on SIGTERM with sessions open",
          "[ctrund][integration]") {
  Daemon daemon;
  SessionProbe node(daemon.Connect(), MakeJoin({}));
  REQUIRE(node.NextAssignment(kWait));
  daemon.process().Signal(SIGTERM);
  CHECK(daemon.process().Wait(kWait) == 0);
  auto done = node.WaitDone(kWait);
  REQUIRE(done);
  CHECK_FALSE(done->ok());
}

TEST_CASE("ctrund refuses bad flags with one line and exit code 2",
          "[ctrund][integration]") {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--listen", "nohostport:"}, "--listen"},
           {{"--listen", "1.2.3.4:99999"}, "not 0..65535"},
           {{"--token-file", "/nonexistent/token"}, "--token-file"},
           {{"--tls-cert", "/x.pem"}, "--tls-cert and --tls-key"},
           {{"--no-such-flag"}, "no-such-flag"},
           {{"--log-level", "loud"}, "--log-level"}}) {
    std::vector<std::string> argv = {CtrundPath()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    ChildProcess p(argv);
    INFO(c.args[0]);
    CHECK(p.Wait(kWait) == 2);
    const std::string err = p.Stderr();
    CHECK(err.find(c.says) != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
}

TEST_CASE("A second ctrund on a port in use fails with one line",
          "[ctrund][integration]") {
  Daemon first;
  ChildProcess second({CtrundPath(), "--listen", first.endpoint()});
  CHECK(second.Wait(kWait) == 1);
  const std::string err = second.Stderr();
  CHECK(err.find("cannot listen on " + first.endpoint()) != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

TEST_CASE("ctrund without a token refuses to listen beyond loopback",
          "[ctrund][integration]") {
  ChildProcess p({CtrundPath(), "--listen", "0.0.0.0:0"});
  CHECK(p.Wait(kWait) == 1);
  CHECK(p.Stderr().find("token is required") != std::string::npos);
}

}  // namespace
}  // namespace ctrun::testing
