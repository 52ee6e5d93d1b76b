// RendezvousMetrics: ServiceMetrics (service_metrics.h) for Prometheus
// (ctrund --metrics-listen, and ctrun's --metrics_listen when it hosts the
// rendezvous), written in Prometheus' text format by ctrun itself: no
// client library is loaded by a launcher that never serves metrics.
//
// Counters and histograms are fed by the service as things happen: the
// core's events (rendezvous_core.h, Effects::events), store operations as
// they are answered, writes to the journal or etcd, refusals. What the
// service holds (jobs, nodes, sessions by state) is read at each scrape
// from a function the service sets, so a scrape never sees stale gauges.
// docs/metrics.md lists every metric.
//
// Thread-safe.
#ifndef CTRUN_RENDEZVOUS_OPS_METRICS_H_
#define CTRUN_RENDEZVOUS_OPS_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ctrun/v1/event.pb.h"
#include "rendezvous/ops/service_metrics.h"
#include "rendezvous/rpc/endpoint.h"

namespace ctrun {

class RendezvousMetrics final : public ServiceMetrics {
 public:
  RendezvousMetrics();
  ~RendezvousMetrics() override;
  RendezvousMetrics(const RendezvousMetrics&) = delete;
  RendezvousMetrics& operator=(const RendezvousMetrics&) = delete;

  void Count(const v1::Event& event) override;
  void StoreOperation(std::string_view kind, absl::Duration latency,
                      absl::StatusCode code) override;
  void LogWrite(absl::Duration latency) override;
  void Refusal(std::string_view rpc, absl::StatusCode code) override;
  // The gauges are read at each scrape.
  void SetHolding(std::function<Holding()> holding) override;

  // Every metric in Prometheus' text exposition format (version 0.0.4).
  std::string Render() const;

 private:
  struct Families;
  mutable absl::Mutex mu_;
  std::unique_ptr<Families> families_ ABSL_PT_GUARDED_BY(mu_);
  mutable absl::Mutex holding_mu_;
  std::function<Holding()> holding_ ABSL_GUARDED_BY(holding_mu_);
};

// An HTTP endpoint serving /metrics in Prometheus' text format.
//
// One thread of its own, with every connection non-blocking on one epoll:
// a connection that sends nothing (a port scan, a half-open probe) costs a
// descriptor, never the thread, so scrapes are answered while hundreds of
// them sit open. Each connection gets kRequestTimeout to send its request
// and its answer; beyond kMaxConnections the oldest is closed. One request
// per connection (HTTP/1.0 style, `Connection: close`). Out of
// descriptors, it stops accepting for kAcceptAgainAfter at a time (the
// waiting connections stay queued) instead of spinning on the listener.
class MetricsEndpoint {
 public:
  static constexpr int kMaxConnections = 512;
  static constexpr absl::Duration kAcceptAgainAfter = absl::Milliseconds(100);
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(10);
  static constexpr size_t kMaxRequestBytes = 8192;

  // Listens on `listen` (port 0 picks one) and serves `metrics`, which must
  // outlive the endpoint. UNAVAILABLE naming the address when it cannot
  // listen.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const Endpoint& listen, const RendezvousMetrics& metrics);
  // Stops serving: closes every connection and joins the thread.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound address, with the actual port.
  const Endpoint& endpoint() const { return bound_; }

 private:
  class Server;
  MetricsEndpoint(std::unique_ptr<Server> server, Endpoint bound);
  std::unique_ptr<Server> server_;
  Endpoint bound_;
};

// The metrics as Prometheus' text exposition format (what /metrics serves).
std::string RenderMetrics(const RendezvousMetrics& metrics);

}  // namespace ctrun

#endif  // CTRUN_RENDEZVOUS_OPS_METRICS_H_
