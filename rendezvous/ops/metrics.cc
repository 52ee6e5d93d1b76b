#include "rendezvous/ops/metrics.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "rendezvous/core/failure_class.h"

namespace ctrun {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// From a millisecond to five minutes: a store wait can last that long.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300};
}

// A round closes in milliseconds (every node came back) or after its last
// call, or after minutes of waiting for nodes.
Histogram::BucketBoundaries RoundBuckets() {
  return {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900};
}

std::string CodeName(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

}  // namespace

struct RendezvousMetrics::Families {
  explicit Families(prometheus::Registry& r)
      : rounds(BuildCounter()
                   .Name("ctrund_rounds_total")
                   .Help("Rounds opened, by why: first (a new job), "
                         "worker_failed, worker_hung, node_lost, scale_up")
                   .Register(r)),
        restarts(BuildCounter()
                     .Name("ctrund_restarts_total")
                     .Help("Restarts of a job's workers (rounds after the "
                           "first), by why")
                     .Register(r)),
        events(BuildCounter()
                   .Name("ctrund_events_total")
                   .Help("Events of the event log (docs/events.md), by name")
                   .Register(r)),
        failures(BuildCounter()
                     .Name("ctrund_worker_failures_total")
                     .Help("Worker failures reported (the first of each "
                           "round's node), by class: user_error, oom, "
                           "hardware, network, hang, signal, other")
                     .Register(r)),
        jobs_ended(BuildCounter()
                       .Name("ctrund_jobs_ended_total")
                       .Help("Jobs that finished or failed, by outcome")
                       .Register(r)),
        round_seconds(
            BuildHistogram()
                .Name("ctrund_round_close_seconds")
                .Help("From a round's opening (a job's first join) to its "
                      "assignment")
                .Register(r)
                .Add({}, RoundBuckets())),
        store_ops(BuildHistogram()
                      .Name("ctrund_store_operation_seconds")
                      .Help("Store requests by kind, from arrival to answer "
                            "(waits included)")
                      .Register(r)),
        store_errors(BuildCounter()
                         .Name("ctrund_store_errors_total")
                         .Help("Store requests answered with an error, by "
                               "kind and code")
                         .Register(r)),
        log_writes(BuildHistogram()
                       .Name("ctrund_state_write_seconds")
                       .Help("Commits of the saved state (journal fsync or "
                             "etcd txn)")
                       .Register(r)
                       .Add({}, LatencyBuckets())),
        kept(BuildCounter()
                 .Name("ctrund_workers_kept_total")
                 .Help("Workers that kept their processes into a new round "
                       "(--recovery=inprocess)")
                 .Register(r)
                 .Add({})),
        recovery_seconds(
            BuildHistogram()
                .Name("ctrund_inprocess_recovery_seconds")
                .Help("In-process rounds, per node: from the failure to "
                      "every worker's process group formed again")
                .Register(r)
                .Add({}, RoundBuckets())),
        promotions(BuildCounter()
                       .Name("ctrund_spares_promoted_total")
                       .Help("Spares (--spares) given a lost node's slot")
                       .Register(r)
                       .Add({})),
        refusals(BuildCounter()
                     .Name("ctrund_refusals_total")
                     .Help("Sessions, store requests and admin calls "
                           "refused, by rpc and code")
                     .Register(r)) {}

  prometheus::Family<prometheus::Counter>& rounds;
  prometheus::Family<prometheus::Counter>& restarts;
  prometheus::Family<prometheus::Counter>& events;
  prometheus::Family<prometheus::Counter>& failures;
  prometheus::Family<prometheus::Counter>& jobs_ended;
  prometheus::Histogram& round_seconds;
  prometheus::Family<prometheus::Histogram>& store_ops;
  prometheus::Family<prometheus::Counter>& store_errors;
  prometheus::Histogram& log_writes;
  prometheus::Counter& kept;
  prometheus::Counter& promotions;
  prometheus::Histogram& recovery_seconds;
  prometheus::Family<prometheus::Counter>& refusals;
};

// The gauges, computed from the service at each scrape.
class RendezvousMetrics::HoldingCollector : public prometheus::Collectable {
 public:
  void Set(std::function<Holding()> holding) {
    absl::MutexLock lock(&mu_);
    holding_ = std::move(holding);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    Holding now;
    {
      absl::MutexLock lock(&mu_);
      if (!holding_) return {};
      now = holding_();
    }
    auto family = [](std::string name, std::string help,
                     const std::string& label,
                     const std::map<std::string, int>& values) {
      prometheus::MetricFamily f{
          std::move(name), std::move(help), prometheus::MetricType::Gauge, {}};
      for (const auto& [value, count] : values) {
        prometheus::ClientMetric m;
        m.label.push_back({label, value});
        m.gauge.value = count;
        f.metric.push_back(std::move(m));
      }
      return f;
    };
    std::vector<prometheus::MetricFamily> out;
    out.push_back(
        family("ctrund_jobs", "Jobs held, by phase", "phase", now.jobs));
    out.push_back(family("ctrund_nodes", "Nodes of the jobs held, by state",
                         "state", now.nodes));
    out.push_back(family("ctrund_sessions",
                         "Agent sessions: in a job, restored nodes still "
                         "resuming, open but not in a job",
                         "state", now.sessions));
    prometheus::MetricFamily bytes{"ctrund_store_bytes",
                                   "Keys plus values in the stores of all jobs",
                                   prometheus::MetricType::Gauge,
                                   {}};
    bytes.metric.emplace_back().gauge.value = now.store_bytes;
    out.push_back(std::move(bytes));
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::function<Holding()> holding_ ABSL_GUARDED_BY(mu_);
};

RendezvousMetrics::RendezvousMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<Families>(*registry_)),
      holding_(std::make_shared<HoldingCollector>()) {
  // Every reason present from the start: a rate over a counter that
  // appears with its first increment misses that increment.
  for (const char* reason :
       {"first", "worker_failed", "worker_hung", "node_lost", "scale_up"}) {
    families_->rounds.Add({{"reason", reason}});
    if (std::string_view(reason) != "first") {
      families_->restarts.Add({{"reason", reason}});
    }
  }
  for (const char* outcome : {"finished", "failed"}) {
    families_->jobs_ended.Add({{"outcome", outcome}});
  }
  for (int c = v1::FailureClass_MIN + 1; c <= v1::FailureClass_MAX; ++c) {
    families_->failures.Add(
        {{"class", FailureClassName(static_cast<v1::FailureClass>(c))}});
  }
}

RendezvousMetrics::~RendezvousMetrics() = default;

void RendezvousMetrics::Count(const v1::Event& event) {
  families_->events.Add({{"event", event.event()}}).Increment();
  if (event.event() == "round_opened") {
    families_->rounds.Add({{"reason", event.reason()}}).Increment();
    if (event.reason() != "first") {
      families_->restarts.Add({{"reason", event.reason()}}).Increment();
    }
  } else if (event.event() == "worker_failed" ||
             event.event() == "worker_hung") {
    if (event.has_failure_class()) {
      families_->failures.Add({{"class", event.failure_class()}}).Increment();
    }
  } else if (event.event() == "round_closed") {
    families_->round_seconds.Observe(event.duration_s());
  } else if (event.event() == "workers_recovered") {
    families_->kept.Increment(event.kept());
    families_->recovery_seconds.Observe(event.duration_s());
  } else if (event.event() == "spare_promoted") {
    families_->promotions.Increment();
  } else if (event.event() == "job_finished") {
    families_->jobs_ended.Add({{"outcome", "finished"}}).Increment();
  } else if (event.event() == "job_failed") {
    families_->jobs_ended.Add({{"outcome", "failed"}}).Increment();
  }
}

void RendezvousMetrics::StoreOperation(std::string_view kind,
                                       absl::Duration latency,
                                       absl::StatusCode code) {
  const std::string k(kind);
  families_->store_ops.Add({{"kind", k}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(latency));
  if (code != absl::StatusCode::kOk) {
    families_->store_errors.Add({{"kind", k}, {"code", CodeName(code)}})
        .Increment();
  }
}

void RendezvousMetrics::LogWrite(absl::Duration latency) {
  families_->log_writes.Observe(absl::ToDoubleSeconds(latency));
}

void RendezvousMetrics::Refusal(std::string_view rpc, absl::StatusCode code) {
  families_->refusals.Add({{"rpc", std::string(rpc)}, {"code", CodeName(code)}})
      .Increment();
}

void RendezvousMetrics::SetHolding(std::function<Holding()> holding) {
  holding_->Set(std::move(holding));
}

std::vector<std::weak_ptr<prometheus::Collectable>>
RendezvousMetrics::Collectables() const {
  return {registry_, holding_};
}

std::string RenderMetrics(const RendezvousMetrics& metrics) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& weak : metrics.Collectables()) {
    if (auto c = weak.lock()) {
      std::vector<prometheus::MetricFamily> more = c->Collect();
      std::move(more.begin(), more.end(), std::back_inserter(families));
    }
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

class MetricsEndpoint::Server {
 public:
  Server(const RendezvousMetrics& metrics, int listen_fd, int epoll_fd,
         int wake_fd)
      : metrics_(metrics),
        listen_fd_(listen_fd),
        epoll_fd_(epoll_fd),
        wake_fd_(wake_fd) {
    thread_ = std::thread([this] { Serve(); });
  }
  ~Server() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
    thread_.join();
    for (auto& [fd, c] : connections_) close(fd);
    for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) close(fd);
  }

 private:
  struct Connection {
    absl::Time deadline;
    std::string in;
    std::string out;  // the answer, once the request is in
    size_t sent = 0;
  };

  void Serve() {
    epoll_event events[64];
    for (;;) {
      const int n = epoll_wait(epoll_fd_, events, 64, NextTimeoutMs());
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd_) return;
        if (fd == listen_fd_) {
          Accept();
        } else {
          Handle(fd);
        }
      }
      Expire();
    }
  }

  int NextTimeoutMs() const {
    if (connections_.empty()) return -1;
    absl::Time first = absl::InfiniteFuture();
    for (const auto& [fd, c] : connections_)
      first = std::min(first, c.deadline);
    const int64_t ms = absl::ToInt64Milliseconds(first - absl::Now()) + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
  }

  void Accept() {
    for (;;) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: try later
      if (connections_.size() >= static_cast<size_t>(kMaxConnections)) {
        CloseOldest();
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      connections_[fd] = Connection{absl::Now() + kRequestTimeout, {}, {}, 0};
    }
  }

  void Handle(int fd) {
    auto it = connections_.find(fd);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    if (c.out.empty()) {
      char buffer[2048];
      for (;;) {
        const ssize_t n = read(fd, buffer, sizeof buffer);
        if (n > 0) {
          c.in.append(buffer, static_cast<size_t>(n));
          if (c.in.size() > kMaxRequestBytes) return Close(fd);
          continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) return Close(fd);
        if (errno == EAGAIN) break;
      }
      if (c.in.find("\r\n\r\n") == std::string::npos &&
          c.in.find("\n\n") == std::string::npos) {
        return;  // more to come
      }
      c.out = Answer(c.in);
      epoll_event ev{};
      ev.events = EPOLLOUT;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
    }
    while (c.sent < c.out.size()) {
      const ssize_t n =
          send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EAGAIN) {
        return;  // the rest when the socket takes it
      } else if (!(n < 0 && errno == EINTR)) {
        break;
      }
    }
    Close(fd);
  }

  std::string Answer(const std::string& request) const {
    // "GET /metrics HTTP/1.1"; a query string is ignored.
    const std::string line = request.substr(0, request.find_first_of("\r\n"));
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    const bool get =
        words.size() == 3 && (words[0] == "GET" || words[0] == "HEAD");
    const std::string path =
        words.size() >= 2 ? words[1].substr(0, words[1].find('?')) : "";
    std::string status = "200 OK", type = "text/plain; version=0.0.4", body;
    if (!get) {
      status = "405 Method Not Allowed";
      type = "text/plain";
      body = "only GET /metrics is served here\n";
    } else if (path != "/metrics") {
      status = "404 Not Found";
      type = "text/plain";
      body = "the metrics are at /metrics\n";
    } else {
      body = RenderMetrics(metrics_);
    }
    std::string answer = absl::StrCat(
        "HTTP/1.1 ", status, "\r\nContent-Type: ", type,
        "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
    if (words.empty() || words[0] != "HEAD") answer += body;
    return answer;
  }

  void Expire() {
    const absl::Time now = absl::Now();
    std::vector<int> late;
    for (const auto& [fd, c] : connections_) {
      if (c.deadline <= now) late.push_back(fd);
    }
    for (int fd : late) Close(fd);
  }

  void CloseOldest() {
    auto oldest = connections_.begin();
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if (it->second.deadline < oldest->second.deadline) oldest = it;
    }
    if (oldest != connections_.end()) Close(oldest->first);
  }

  void Close(int fd) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    connections_.erase(fd);
  }

  const RendezvousMetrics& metrics_;
  const int listen_fd_, epoll_fd_, wake_fd_;
  // Owned by the thread while it runs.
  std::map<int, Connection> connections_;
  std::thread thread_;
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Server> server, Endpoint bound)
    : server_(std::move(server)), bound_(std::move(bound)) {}

MetricsEndpoint::~MetricsEndpoint() = default;

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const Endpoint& listen, const RendezvousMetrics& metrics) {
  const auto unavailable = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen.ToString(), " (", why, ")"));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(listen.port);
  if (getaddrinfo(listen.host.empty() ? nullptr : listen.host.c_str(),
                  port.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return unavailable("not an address of this machine");
  }
  const int fd = socket(found->ai_family,
                        found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int yes = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  const bool bound = fd >= 0 &&
                     bind(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(fd, 256) == 0;
  const int error = errno;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) close(fd);
    return unavailable(error == EADDRINUSE
                           ? "address in use"
                           : absl::StrCat(strerror(error),
                                          "; not an address of this machine?"));
  }
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  Endpoint actual = listen;
  actual.port = ntohs(address.ss_family == AF_INET6
                          ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                          : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd < 0 || wake_fd < 0) {
    for (int f : {fd, epoll_fd, wake_fd}) {
      if (f >= 0) close(f);
    }
    return unavailable(strerror(errno));
  }
  for (int f : {fd, wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = f;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, f, &ev);
  }
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(
      std::make_unique<Server>(metrics, fd, epoll_fd, wake_fd),
      std::move(actual)));
}

}  // namespace ctrun
