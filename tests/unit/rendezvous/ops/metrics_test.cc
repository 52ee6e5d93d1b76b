#include "rendezvous/ops/metrics.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "ctrun/v1/event.pb.h"

namespace ctrun {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return absl::StrContains(text, line + "\n");
}

TEST_CASE(
    "Metrics are written in Prometheus' text format: counters from zero, "
    "cumulative buckets, escaped labels",
    "[metrics][unit]") {
  RendezvousMetrics metrics;
  std::string text = metrics.Render();
  // Present before anything happened, so that a rate sees the first one.
  CHECK(Has(text, "# TYPE ctrund_rounds_total counter"));
  CHECK(Has(text, "ctrund_rounds_total{reason=\"first\"} 0"));
  CHECK(Has(text, "ctrund_worker_failures_total{class=\"user_error\"} 0"));
  CHECK(Has(text, "ctrund_round_close_seconds_count 0"));
  CHECK_FALSE(absl::StrContains(text, "ctrund_jobs{"));  // no holding yet

  v1::Event opened;
  opened.set_event("round_opened");
  opened.set_reason("worker_failed");
  metrics.Count(opened);
  metrics.Count(opened);
  v1::Event closed;
  closed.set_event("round_closed");
  closed.set_duration_s(0.3);
  metrics.Count(closed);
  v1::Event recovered;
  recovered.set_event("workers_recovered");
  recovered.set_kept(3);
  recovered.set_duration_s(0.05);
  metrics.Count(recovered);
  metrics.StoreOperation("get", absl::Microseconds(300), absl::StatusCode::kOk);
  metrics.StoreOperation("get", absl::Seconds(2), absl::StatusCode::kOk);
  metrics.StoreOperation("set", absl::Milliseconds(1),
                         absl::StatusCode::kResourceExhausted);
  metrics.Refusal("Session \"x\"\\", absl::StatusCode::kUnauthenticated);
  metrics.SetHolding([] {
    ServiceMetrics::Holding h;
    h.jobs = {{"running", 2}};
    h.nodes = {{"active", 5}, {"spare", 1}};
    h.store_bytes = 1234567890;
    return h;
  });
  text = metrics.Render();
  INFO(text);
  CHECK(Has(text, "ctrund_rounds_total{reason=\"worker_failed\"} 2"));
  CHECK(Has(text, "ctrund_restarts_total{reason=\"worker_failed\"} 2"));
  CHECK(Has(text, "ctrund_events_total{event=\"round_opened\"} 2"));
  CHECK(Has(text, "ctrund_workers_kept_total 3"));
  // Each bucket counts everything at most its bound.
  CHECK(Has(text, "ctrund_round_close_seconds_bucket{le=\"0.25\"} 0"));
  CHECK(Has(text, "ctrund_round_close_seconds_bucket{le=\"0.5\"} 1"));
  CHECK(Has(text, "ctrund_round_close_seconds_bucket{le=\"+Inf\"} 1"));
  CHECK(Has(text, "ctrund_round_close_seconds_sum 0.3"));
  CHECK(Has(text,
            "ctrund_store_operation_seconds_bucket{kind=\"get\",le=\"0.0005\"} "
            "1"));
  CHECK(
      Has(text,
          "ctrund_store_operation_seconds_bucket{kind=\"get\",le=\"2.5\"} 2"));
  CHECK(Has(text, "ctrund_store_operation_seconds_count{kind=\"get\"} 2"));
  CHECK(Has(text,
            "ctrund_store_errors_total{kind=\"set\",code="
            "\"resource_exhausted\"} 1"));
  CHECK(Has(text,
            "ctrund_refusals_total{rpc=\"Session \\\"x\\\"\\\\\","
            "code=\"unauthenticated\"} 1"));
  CHECK(Has(text, "# TYPE ctrund_nodes gauge"));
  CHECK(Has(text, "ctrund_nodes{state=\"spare\"} 1"));
  CHECK(Has(text, "ctrund_jobs{phase=\"running\"} 2"));
  CHECK(Has(text, "ctrund_store_bytes 1234567890"));
  CHECK(RenderMetrics(metrics) == metrics.Render());
}

}  // namespace
}  // namespace ctrun
