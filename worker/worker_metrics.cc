#include "worker/worker_metrics.h"

namespace ps {

WorkerMetrics::WorkerMetrics(Metrics* m) {
  pushes_ = m->AddCounter("ps_pushes_total", "pushes completed");
  pulls_ = m->AddCounter("ps_pulls_total", "pulls completed");
  failed_requests_ = m->AddCounter("ps_failed_requests_total", "pushes and pulls that failed");
  examples_ = m->AddCounter("ps_examples_total", "training examples processed");
  wait_seconds_ = m->AddCounter("ps_wait_seconds_total", "seconds blocked by the staleness bound");
  bytes_pushed_ = m->AddCounter("ps_pushed_bytes_total", "gradient payload bytes sent");
  bytes_pulled_ = m->AddCounter("ps_pulled_bytes_total", "value payload bytes received");
  push_latency_ =
      m->AddHistogram("ps_push_latency_seconds", "push round trip", Metrics::LatencyBuckets());
  pull_latency_ = m->AddHistogram("ps_pull_latency_seconds",
                                  "pull round trip, time held by the staleness bound included",
                                  Metrics::LatencyBuckets());
  clock_ = m->AddGauge("ps_clock", "steps completed (the worker's clock)");
  clock_lag_ = m->AddGauge("ps_clock_lag", "largest clock lag over the last report interval");
  loss_ = m->AddGauge("ps_train_loss", "training loss over the last report interval");
  accuracy_ = m->AddGauge("ps_train_accuracy", "training accuracy over the last report interval");
  examples_per_sec_ = m->AddGauge("ps_examples_per_second", "training throughput");
  staleness_mean_ =
      m->AddGauge("ps_gradient_staleness_mean", "mean staleness of the last interval's pushes");
}

void WorkerMetrics::OnRequestDone(bool push, double seconds, bool ok) {
  if (!ok) {
    failed_requests_.Increment();
    return;
  }
  (push ? pushes_ : pulls_).Increment();
  (push ? push_latency_ : pull_latency_).Observe(seconds);
}

void WorkerMetrics::OnReport(const nlohmann::json& line, const KVClientStats& stats) {
  auto number = [&](const char* key) {
    return line.contains(key) && line[key].is_number() ? line[key].get<double>() : 0.0;
  };
  examples_.Increment(number("examples"));
  wait_seconds_.Increment(number("wait_seconds"));
  clock_.Set(number("clock"));
  clock_lag_.Set(number("clock_lag_max"));
  loss_.Set(number("loss"));
  accuracy_.Set(number("accuracy"));
  examples_per_sec_.Set(number("examples_per_sec"));
  staleness_mean_.Set(number("staleness_mean"));
  if (stats.bytes_pushed >= last_.bytes_pushed) {
    bytes_pushed_.Increment(static_cast<double>(stats.bytes_pushed - last_.bytes_pushed));
  }
  if (stats.bytes_pulled >= last_.bytes_pulled) {
    bytes_pulled_.Increment(static_cast<double>(stats.bytes_pulled - last_.bytes_pulled));
  }
  last_ = stats;
}

}  // namespace ps
