#include "rendezvous/ops/metrics.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rendezvous/core/failure_class.h"

namespace ctrun {

namespace {

// From a millisecond to five minutes: a store wait can last that long.
const std::vector<double>& LatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,     1,      2.5,   5,      10,    30,   60,    300};
  return *buckets;
}

// A round closes in milliseconds (every node came back) or after its last
// call, or after minutes of waiting for nodes.
const std::vector<double>& RoundBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900};
  return *buckets;
}

std::string CodeName(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

// The shortest text that reads back as `value`, as the exposition format
// writes numbers ("1", "0.25", "+Inf").
std::string Number(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  // Plain decimals ("0.0005", not "5e-04") where they stay short.
  const double size = std::fabs(value);
  const auto format = size == 0 || (size >= 1e-6 && size < 1e15)
                          ? std::chars_format::fixed
                          : std::chars_format::general;
  char buffer[64];
  const auto end =
      std::to_chars(buffer, buffer + sizeof buffer, value, format).ptr;
  return std::string(buffer, end);
}

// A label value in the exposition format: backslash, quote and newline
// escaped. Help texts escape backslash and newline only.
std::string Escaped(absl::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string LabelText(const Labels& labels, absl::string_view extra_name = {},
                      absl::string_view extra_value = {}) {
  std::string out;
  auto add = [&out](absl::string_view name, absl::string_view value) {
    absl::StrAppend(&out, out.empty() ? "{" : ",", name, "=\"",
                    Escaped(value, true), "\"");
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (!extra_name.empty()) add(extra_name, extra_value);
  if (!out.empty()) out += "}";
  return out;
}

// One metric family (a name, its help and type) and its series by label
// set. Not thread-safe: RendezvousMetrics locks around it.
class Family {
 public:
  enum class Type { kCounter, kHistogram };
  // Adds itself to `shown`, the families rendered, in that order.
  Family(std::vector<const Family*>* shown, std::string name, std::string help,
         Type type, const std::vector<double>* buckets = nullptr)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        buckets_(buckets) {
    shown->push_back(this);
  }
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // A counter's series is shown from its creation, at zero.
  void Create(const Labels& labels) { series_.try_emplace(labels, Series()); }
  void Increment(const Labels& labels, double by = 1) {
    series_[labels].sum += by;
  }
  void Observe(const Labels& labels, double value) {
    Series& s = series_[labels];
    if (s.counts.empty()) s.counts.assign(buckets_->size(), 0);
    // Each bucket counts what is at most its bound; the exposition sums
    // them (buckets are cumulative there).
    const auto at = std::lower_bound(buckets_->begin(), buckets_->end(), value);
    if (at != buckets_->end()) ++s.counts[at - buckets_->begin()];
    s.sum += value;
    ++s.count;
  }

  void Render(std::string& out) const {
    absl::StrAppend(&out, "# HELP ", name_, " ", Escaped(help_, false), "\n",
                    "# TYPE ", name_, " ",
                    type_ == Type::kCounter ? "counter" : "histogram", "\n");
    for (const auto& [labels, s] : series_) {
      if (type_ == Type::kCounter) {
        absl::StrAppend(&out, name_, LabelText(labels), " ", Number(s.sum),
                        "\n");
        continue;
      }
      uint64_t below = 0;
      for (size_t b = 0; b < buckets_->size(); ++b) {
        below += s.counts.empty() ? 0 : s.counts[b];
        absl::StrAppend(&out, name_, "_bucket",
                        LabelText(labels, "le", Number((*buckets_)[b])), " ",
                        below, "\n");
      }
      absl::StrAppend(&out, name_, "_bucket", LabelText(labels, "le", "+Inf"),
                      " ", s.count, "\n", name_, "_sum", LabelText(labels), " ",
                      Number(s.sum), "\n", name_, "_count", LabelText(labels),
                      " ", s.count, "\n");
    }
  }

 private:
  struct Series {
    double sum = 0;                // a counter's value; a histogram's sum
    uint64_t count = 0;            // a histogram's observations
    std::vector<uint64_t> counts;  // per bucket, not cumulative
  };
  const std::string name_, help_;
  const Type type_;
  const std::vector<double>* const buckets_;
  std::map<Labels, Series> series_;
};

void RenderGauges(absl::string_view name, absl::string_view help,
                  const std::string& label,
                  const std::map<std::string, int>& values, std::string& out) {
  absl::StrAppend(&out, "# HELP ", name, " ", Escaped(help, false), "\n",
                  "# TYPE ", name, " gauge\n");
  for (const auto& [value, count] : values) {
    absl::StrAppend(&out, name, LabelText({{label, value}}), " ", count, "\n");
  }
}

}  // namespace

struct RendezvousMetrics::Families {
  using Type = Family::Type;
  // Every family below, in the order they are declared and shown.
  std::vector<const Family*> all;
  Family rounds{&all, "ctrund_rounds_total",
                "Rounds opened, by why: first (a new job), worker_failed, "
                "worker_hung, node_lost, scale_up",
                Type::kCounter};
  Family restarts{&all, "ctrund_restarts_total",
                  "Restarts of a job's workers (rounds after the first), by "
                  "why",
                  Type::kCounter};
  Family events{&all, "ctrund_events_total",
                "Events of the event log (docs/events.md), by name",
                Type::kCounter};
  Family failures{&all, "ctrund_worker_failures_total",
                  "Worker failures reported (the first of each round's "
                  "node), by class: user_error, oom, hardware, network, "
                  "hang, signal, other",
                  Type::kCounter};
  Family jobs_ended{&all, "ctrund_jobs_ended_total",
                    "Jobs that finished or failed, by outcome", Type::kCounter};
  Family round_seconds{&all, "ctrund_round_close_seconds",
                       "From a round's opening (a job's first join) to its "
                       "assignment",
                       Type::kHistogram, &RoundBuckets()};
  Family store_ops{&all, "ctrund_store_operation_seconds",
                   "Store requests by kind, from arrival to answer (waits "
                   "included)",
                   Type::kHistogram, &LatencyBuckets()};
  Family store_errors{&all, "ctrund_store_errors_total",
                      "Store requests answered with an error, by kind and "
                      "code",
                      Type::kCounter};
  Family log_writes{&all, "ctrund_state_write_seconds",
                    "Commits of the saved state (journal fsync or etcd txn)",
                    Type::kHistogram, &LatencyBuckets()};
  Family kept{&all, "ctrund_workers_kept_total",
              "Workers that kept their processes into a new round "
              "(--recovery=inprocess)",
              Type::kCounter};
  Family recovery_seconds{&all, "ctrund_inprocess_recovery_seconds",
                          "In-process rounds, per node: from the failure to "
                          "every worker's process group formed again",
                          Type::kHistogram, &RoundBuckets()};
  Family promotions{&all, "ctrund_spares_promoted_total",
                    "Spares (--spares) given a lost node's slot",
                    Type::kCounter};
  Family refusals{&all, "ctrund_refusals_total",
                  "Sessions, store requests and admin calls refused, by rpc "
                  "and code",
                  Type::kCounter};
};

RendezvousMetrics::RendezvousMetrics()
    : families_(std::make_unique<Families>()) {
  // Every reason present from the start: a rate over a counter that
  // appears with its first increment misses that increment.
  for (const char* reason :
       {"first", "worker_failed", "worker_hung", "node_lost", "scale_up"}) {
    families_->rounds.Create({{"reason", reason}});
    if (std::string_view(reason) != "first") {
      families_->restarts.Create({{"reason", reason}});
    }
  }
  for (const char* outcome : {"finished", "failed"}) {
    families_->jobs_ended.Create({{"outcome", outcome}});
  }
  for (int c = v1::FailureClass_MIN + 1; c <= v1::FailureClass_MAX; ++c) {
    families_->failures.Create(
        {{"class", FailureClassName(static_cast<v1::FailureClass>(c))}});
  }
  families_->round_seconds.Create({});
  families_->log_writes.Create({});
  families_->kept.Create({});
  families_->recovery_seconds.Create({});
  families_->promotions.Create({});
}

RendezvousMetrics::~RendezvousMetrics() = default;

void RendezvousMetrics::Count(const v1::Event& event) {
  absl::MutexLock lock(&mu_);
  families_->events.Increment({{"event", event.event()}});
  if (event.event() == "round_opened") {
    families_->rounds.Increment({{"reason", event.reason()}});
    if (event.reason() != "first") {
      families_->restarts.Increment({{"reason", event.reason()}});
    }
  } else if (event.event() == "worker_failed" ||
             event.event() == "worker_hung") {
    if (event.has_failure_class()) {
      families_->failures.Increment({{"class", event.failure_class()}});
    }
  } else if (event.event() == "round_closed") {
    families_->round_seconds.Observe({}, event.duration_s());
  } else if (event.event() == "workers_recovered") {
    families_->kept.Increment({}, event.kept());
    families_->recovery_seconds.Observe({}, event.duration_s());
  } else if (event.event() == "spare_promoted") {
    families_->promotions.Increment({});
  } else if (event.event() == "job_finished") {
    families_->jobs_ended.Increment({{"outcome", "finished"}});
  } else if (event.event() == "job_failed") {
    families_->jobs_ended.Increment({{"outcome", "failed"}});
  }
}

void RendezvousMetrics::StoreOperation(std::string_view kind,
                                       absl::Duration latency,
                                       absl::StatusCode code) {
  const std::string k(kind);
  absl::MutexLock lock(&mu_);
  families_->store_ops.Observe({{"kind", k}}, absl::ToDoubleSeconds(latency));
  if (code != absl::StatusCode::kOk) {
    families_->store_errors.Increment({{"kind", k}, {"code", CodeName(code)}});
  }
}

void RendezvousMetrics::LogWrite(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  families_->log_writes.Observe({}, absl::ToDoubleSeconds(latency));
}

void RendezvousMetrics::Refusal(std::string_view rpc, absl::StatusCode code) {
  absl::MutexLock lock(&mu_);
  families_->refusals.Increment(
      {{"rpc", std::string(rpc)}, {"code", CodeName(code)}});
}

void RendezvousMetrics::SetHolding(std::function<Holding()> holding) {
  absl::MutexLock lock(&holding_mu_);
  holding_ = std::move(holding);
}

std::string RendezvousMetrics::Render() const {
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    for (const Family* family : families_->all) family->Render(out);
  }
  // The gauges, computed from the service now (outside mu_: the service
  // holds its own lock while it counts).
  Holding now;
  {
    absl::MutexLock lock(&holding_mu_);
    if (!holding_) return out;
    now = holding_();
  }
  RenderGauges("ctrund_jobs", "Jobs held, by phase", "phase", now.jobs, out);
  RenderGauges("ctrund_nodes", "Nodes of the jobs held, by state", "state",
               now.nodes, out);
  RenderGauges("ctrund_sessions",
               "Agent sessions: in a job, restored nodes still resuming, open "
               "but not in a job",
               "state", now.sessions, out);
  absl::StrAppend(&out,
                  "# HELP ctrund_store_bytes Keys plus values in the stores "
                  "of all jobs\n# TYPE ctrund_store_bytes gauge\n"
                  "ctrund_store_bytes ",
                  Number(now.store_bytes), "\n");
  return out;
}

std::string RenderMetrics(const RendezvousMetrics& metrics) {
  return metrics.Render();
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
      if (accept_again_at_ != absl::InfiniteFuture()) ResumeAccepting();
    }
  }

  int NextTimeoutMs() const {
    absl::Time first = accept_again_at_;
    for (const auto& [fd, c] : connections_)
      first = std::min(first, c.deadline);
    if (first == absl::InfiniteFuture()) return -1;
    const int64_t ms = absl::ToInt64Milliseconds(first - absl::Now()) + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
  }

  void Accept() {
    for (;;) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
          // The connection stays queued and the listener readable (the
          // set is level-triggered): out of the set until a little later,
          // or this thread would spin.
          epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
          accept_again_at_ = absl::Now() + MetricsEndpoint::kAcceptAgainAfter;
        }
        return;  // EAGAIN: all taken
      }
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

  // Puts the listener back in the set once its pause is over.
  void ResumeAccepting() {
    if (accept_again_at_ > absl::Now()) return;
    accept_again_at_ = absl::InfiniteFuture();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
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
  // While out of descriptors: when the listener goes back in the set.
  absl::Time accept_again_at_ = absl::InfiniteFuture();
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
