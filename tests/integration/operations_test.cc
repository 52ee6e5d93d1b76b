// What operators watch a job by: ctrund's metrics, scraped by a real
// Prometheus (Debian's) on loopback, and the event logs of ctrund and of
// the agents, for a real job on two nodes that has a worker failure and
// then loses a node.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "rendezvous/ops/event_log.h"
#include "rendezvous/rpc/endpoint.h"
#include "tests/support/child_process.h"
#include "tests/support/daemon.h"
#include "tests/support/http_get.h"

namespace ctrun::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

int FreePort() {
  auto port = BindFreePort("127.0.0.1");
  REQUIRE(port.ok());
  return *port;
}

// A scratch directory of this test process, removed at the end.
struct ScratchDir {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      absl::StrCat("ctrun-operations-", getpid());
  ScratchDir() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path / name; }
};

// Debian's Prometheus server on 127.0.0.1, scraping `target` every second.
class Prometheus {
 public:
  Prometheus(const ScratchDir& dir, const std::string& target)
      : port_(FreePort()) {
    const std::string config = dir / "prometheus.yml";
    std::ofstream(config) << "global:\n"
                          << "  scrape_interval: 1s\n"
                          << "scrape_configs:\n"
                          << "  - job_name: ctrund\n"
                          << "    static_configs:\n"
                          << "      - targets: ['" << target << "']\n";
    process_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "/usr/bin/prometheus", "--config.file=" + config,
        "--storage.tsdb.path=" + (dir / "tsdb"),
        absl::StrCat("--web.listen-address=127.0.0.1:", port_),
        "--log.level=warn"});
  }

  // The value of the instant query `expr` (a single series), or nullopt
  // while Prometheus has none.
  std::optional<double> Query(const std::string& expr) const {
    auto body =
        HttpGet("127.0.0.1", port_, "/api/v1/query?query=" + UrlEncode(expr));
    if (!body.ok()) return std::nullopt;
    std::smatch m;
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":
    // {...},"value":[1733333333.123,"2"]}]}}
    if (!std::regex_search(
            *body, m, std::regex(R"re("value":\[[0-9.]+,"([^"]+)"\])re"))) {
      return std::nullopt;
    }
    return std::stod(m[1]);
  }

  // Waits until `expr` is `value`; the last value seen otherwise.
  std::optional<double> WaitFor(const std::string& expr, double value) const {
    std::optional<double> seen;
    for (absl::Time end = absl::Now() + kWait; absl::Now() < end;) {
      seen = Query(expr);
      if (seen == value) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    return seen;
  }

  ChildProcess& process() { return *process_; }

 private:
  int port_;
  std::unique_ptr<ChildProcess> process_;
};

std::vector<v1::Event> ReadEvents(const std::string& path) {
  std::vector<v1::Event> events;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    v1::Event e;
    INFO(line);
    REQUIRE(google::protobuf::util::JsonStringToMessage(line, &e).ok());
    events.push_back(std::move(e));
  }
  return events;
}

// "event/round" for each event of `source` (and `node`, when given), with
// ":reason" for round openings and restarts and ":exit_code" for worker
// exits and failures. Worker starts are left out: they say nothing that
// the assignment before them does not.
std::vector<std::string> Sequence(const std::vector<v1::Event>& events,
                                  const std::string& source,
                                  const std::string& node = "") {
  std::vector<std::string> out;
  for (const v1::Event& e : events) {
    if (e.source() != source || (!node.empty() && e.node() != node)) continue;
    if (e.event() == "worker_started") continue;
    std::string s = absl::StrCat(e.event(), "/", e.round());
    if (e.event() == "round_opened" || e.event() == "restart_required") {
      absl::StrAppend(&s, ":", e.reason());
    }
    if (e.event() == "worker_exited" || e.event() == "worker_failed") {
      absl::StrAppend(&s, ":", e.exit_code());
    }
    out.push_back(s);
  }
  return out;
}

TEST_CASE(
    "Prometheus scrapes ctrund's metrics and stores what a job with a "
    "failure and a node loss did, and the event logs tell it in order",
    "[operations][integration]") {
  ScratchDir dir;
  const int metrics_port = FreePort();
  const std::string daemon_log = dir / "ctrund.jsonl";
  Daemon daemon({absl::StrCat("--metrics-listen=127.0.0.1:", metrics_port),
                 "--event-log=" + daemon_log});
  Prometheus prometheus(dir, absl::StrCat("127.0.0.1:", metrics_port));
  // Up, scraping, and counting nothing yet.
  REQUIRE(prometheus.WaitFor("ctrund_rounds_total{reason=\"first\"}", 0) == 0);

  // Two nodes; rank 1 fails in the first round; then node b is killed.
  const std::string done = dir / "done";
  const std::string agents_log = dir / "agents.jsonl";
  auto node = [&](int n) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        CtrunPath(), absl::StrCat("--local_addr=127.0.0.", n), "--nnodes=1:2",
        "--nproc_per_node=1", "--max_restarts=2", "--rdzv_backend=c10d",
        "--rdzv_endpoint=" + daemon.endpoint(), "--rdzv_id=ops",
        "--rdzv_conf=last_call_timeout=3", "--event_log=" + agents_log,
        "/bin/sh", "-c",
        absl::StrCat("if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 "
                     "]; then exit 3; fi; "
                     "echo \"restart=$TORCHELASTIC_RESTART_COUNT "
                     "world=$WORLD_SIZE\"; "
                     "while [ ! -e ",
                     done, " ]; do sleep 0.05; done")});
  };
  auto a = node(2);
  auto b = node(3);
  for (auto* c : {a.get(), b.get()}) {
    INFO(c->Stderr());
    REQUIRE(c->WaitForLine("restart=1 world=2", kWait));
  }
  b->Signal(SIGKILL);
  REQUIRE(b->Wait(kWait) == 128 + SIGKILL);
  {
    INFO(a->Stderr());
    REQUIRE(a->WaitForLine("restart=1 world=1", kWait));
  }
  std::ofstream(done) << "";
  REQUIRE(a->Wait(kWait) == 0);

  // What Prometheus stored.
  REQUIRE(prometheus.WaitFor("ctrund_jobs_ended_total{outcome=\"finished\"}",
                             1) == 1);
  CHECK(prometheus.Query("ctrund_rounds_total{reason=\"first\"}") == 1);
  CHECK(prometheus.Query("ctrund_rounds_total{reason=\"worker_failed\"}") == 1);
  CHECK(prometheus.Query("ctrund_rounds_total{reason=\"node_lost\"}") == 1);
  CHECK(prometheus.Query("sum(ctrund_restarts_total)") == 2);
  CHECK(prometheus.Query("ctrund_jobs_ended_total{outcome=\"failed\"}") == 0);
  CHECK(prometheus.Query("ctrund_round_close_seconds_count") == 3);
  CHECK(prometheus.Query("ctrund_events_total{event=\"node_lost\"}") == 1);
  // The job is forgotten once its last node left: nothing is held.
  CHECK(prometheus.WaitFor("sum(ctrund_nodes)", 0) == 0);
  CHECK(prometheus.WaitFor("ctrund_jobs{phase=\"running\"}", 0) == 0);

  // ctrund's event log: the job's life, as the service saw it.
  const auto events = ReadEvents(daemon_log);
  std::vector<std::string> lost_nodes;
  for (const auto& e : events) {
    CHECK(e.job() == "ops");
    CHECK(absl::EndsWith(e.time(), "Z"));
    if (e.event() == "node_lost") lost_nodes.push_back(e.node());
  }
  CHECK(Sequence(events, "rendezvous") ==
        std::vector<std::string>{
            "round_opened/0:first", "node_joined/0", "node_joined/0",
            "round_closed/0", "worker_failed/0:3",
            "round_opened/1:worker_failed", "round_closed/1", "node_lost/1",
            "round_opened/2:node_lost", "round_closed/2", "job_finished/2",
            "node_left/2"});
  REQUIRE(lost_nodes.size() == 1);
  CHECK(absl::EndsWith(lost_nodes[0], absl::StrCat(":", b->pid())));

  // The agents share one file; each line is whole. Node a's own story:
  const auto agent_events = ReadEvents(agents_log);
  std::string a_node;
  for (const auto& e : agent_events) {
    if (absl::EndsWith(e.node(), absl::StrCat(":", a->pid())))
      a_node = e.node();
  }
  REQUIRE_FALSE(a_node.empty());
  const auto a_seq = Sequence(agent_events, "agent", a_node);
  // Its worker was rank 1, which failed, or rank 0, stopped (SIGTERM) for
  // the restart that the failure asked for.
  const bool failed_here = absl::c_linear_search(a_seq, "worker_exited/0:3");
  std::vector<std::string> expected = {"assigned/0"};
  for (const char* e :
       failed_here
           ? std::vector<const char*>{"worker_exited/0:3",
                                      "restart_required/"
                                      "1:worker_failed"}
           : std::vector<const char*>{"restart_required/1:worker_failed",
                                      "worker_exited/0:143"}) {
    expected.push_back(e);
  }
  for (const char* e :
       {"assigned/1", "restart_required/2:node_lost", "worker_exited/1:143",
        "assigned/2", "worker_exited/2:0", "job_finished/2",
        "agent_exited/2"}) {
    expected.push_back(e);
  }
  CHECK(a_seq == expected);
}

TEST_CASE(
    "ctrun hosting the rendezvous serves its metrics and writes both "
    "its events and the rendezvous's",
    "[operations][integration]") {
  ScratchDir dir;
  const std::string log = dir / "events.jsonl";
  const int port = FreePort();
  ChildProcess c({CtrunPath(), "--standalone", "--nproc_per_node=2",
                  absl::StrCat("--metrics_listen=", port), "--event_log=" + log,
                  "/bin/sh", "-c", "echo up; sleep 30"});
  REQUIRE(c.WaitForLine("up", kWait));
  REQUIRE(c.WaitForLine("up", kWait));
  auto metrics = HttpGet("127.0.0.1", port, "/metrics");
  INFO(c.Stderr());
  REQUIRE(metrics.ok());
  CHECK(absl::StrContains(*metrics, "ctrund_jobs{phase=\"running\"} 1"));
  CHECK(absl::StrContains(*metrics, "ctrund_nodes{state=\"active\"} 1"));
  CHECK(absl::StrContains(*metrics, "ctrund_rounds_total{reason=\"first\"} 1"));
  c.Signal(SIGTERM);
  REQUIRE(c.Wait(kWait) == 128 + SIGTERM);
  std::map<std::string, int> by_source;
  for (const v1::Event& e : ReadEvents(log)) ++by_source[e.source()];
  CHECK(by_source["rendezvous"] >= 3);  // opened, joined, closed
  CHECK(by_source["agent"] >= 4);       // assigned, 2 started, exited
  // Nothing listens once ctrun is gone.
  CHECK_FALSE(HttpGet("127.0.0.1", port, "/metrics").ok());
}

// Malformed values are rows of docs/errors.md (errors_test.cc).
TEST_CASE("A metrics address in use is said in one line and nothing runs",
          "[operations][integration]") {
  Daemon other;
  const std::string port =
      other.endpoint().substr(other.endpoint().rfind(':') + 1);
  ChildProcess c({CtrundPath(), "--listen=127.0.0.1:0",
                  "--metrics-listen=127.0.0.1:" + port});
  CHECK(c.Wait(kWait) == 1);
  CHECK(c.Stderr() ==
        "ctrund: --metrics-listen: cannot serve metrics on "
        "127.0.0.1:" +
            port + " (address in use)\n");
}

}  // namespace
}  // namespace ctrun::testing
