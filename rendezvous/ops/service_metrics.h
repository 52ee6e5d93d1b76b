// ServiceMetrics: what the rendezvous service reports as it runs, for
// whoever counts it. The service calls this interface only; the Prometheus
// implementation (metrics.h, RendezvousMetrics) is linked and made by the
// binaries, and only when --metrics-listen / --metrics_listen asks for it.
//
// Implementations are thread-safe.
#ifndef CTRUN_RENDEZVOUS_OPS_SERVICE_METRICS_H_
#define CTRUN_RENDEZVOUS_OPS_SERVICE_METRICS_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ctrun/v1/event.pb.h"

namespace ctrun {

class ServiceMetrics {
 public:
  // What the service holds, by state; the names are the label values.
  struct Holding {
    std::map<std::string, int> jobs;      // by phase: collecting, running...
    std::map<std::string, int> nodes;     // by state: joined, active...
    std::map<std::string, int> sessions;  // in_job, resuming, not_joined
    double store_bytes = 0;
  };

  virtual ~ServiceMetrics() = default;

  // Counts what `event` says: rounds and restarts by reason, node losses,
  // job ends, the time rounds took to close.
  virtual void Count(const v1::Event& event) = 0;
  // One store request answered: its kind (the StoreRequest op's field name),
  // how long it took (a wait's included), and its status code.
  virtual void StoreOperation(std::string_view kind, absl::Duration latency,
                              absl::StatusCode code) = 0;
  // One commit to the journal or to etcd.
  virtual void LogWrite(absl::Duration latency) = 0;
  // A session, store request or admin call refused with `code`.
  virtual void Refusal(std::string_view rpc, absl::StatusCode code) = 0;

  // Sets (or, with nullptr, clears) what the gauges are read from, when
  // they are read. Clearing waits for a reading in progress: afterwards
  // `holding` is never called again.
  virtual void SetHolding(std::function<Holding()> holding) = 0;
};

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_OPS_SERVICE_METRICS_H_
