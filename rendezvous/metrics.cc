#include "rendezvous/metrics.h"

#include <exception>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

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
        refusals(BuildCounter()
                     .Name("ctrund_refusals_total")
                     .Help("Sessions, store requests and admin calls "
                           "refused, by rpc and code")
                     .Register(r)) {}

  prometheus::Family<prometheus::Counter>& rounds;
  prometheus::Family<prometheus::Counter>& restarts;
  prometheus::Family<prometheus::Counter>& events;
  prometheus::Family<prometheus::Counter>& jobs_ended;
  prometheus::Histogram& round_seconds;
  prometheus::Family<prometheus::Histogram>& store_ops;
  prometheus::Family<prometheus::Counter>& store_errors;
  prometheus::Histogram& log_writes;
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
}

RendezvousMetrics::~RendezvousMetrics() = default;

void RendezvousMetrics::Count(const v1::Event& event) {
  families_->events.Add({{"event", event.event()}}).Increment();
  if (event.event() == "round_opened") {
    families_->rounds.Add({{"reason", event.reason()}}).Increment();
    if (event.reason() != "first") {
      families_->restarts.Add({{"reason", event.reason()}}).Increment();
    }
  } else if (event.event() == "round_closed") {
    families_->round_seconds.Observe(event.duration_s());
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

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                                 Endpoint bound)
    : exposer_(std::move(exposer)), bound_(std::move(bound)) {}

MetricsEndpoint::~MetricsEndpoint() = default;

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const Endpoint& listen, const RendezvousMetrics& metrics) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One thread: a scrape every few seconds needs no more.
    exposer = std::make_unique<prometheus::Exposer>(listen.ToString(), 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen.ToString(),
                     " (address in use, or not an address of this machine)"));
  }
  for (const auto& c : metrics.Collectables()) exposer->RegisterCollectable(c);
  Endpoint bound = listen;
  if (const std::vector<int> ports = exposer->GetListeningPorts();
      !ports.empty()) {
    bound.port = ports.front();
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), std::move(bound)));
}

}  // namespace ctrun
