// A worker's Prometheus metrics (common/metrics.h): push and pull counts and latencies (from
// KVClient's completion hook), and what its progress lines say (examples, loss, accuracy,
// clock, clock lag, time blocked by the staleness bound, bytes moved).
//
// Thread model: OnRequestDone is called from KVClient's I/O thread, OnReport from the
// training thread; both only touch thread-safe prometheus-cpp metrics.
#pragma once

#include <nlohmann/json.hpp>

#include "common/metrics.h"
#include "worker/kv_client.h"

namespace ps {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(Metrics* metrics);
  void OnRequestDone(bool push, double seconds, bool ok);
  // A `train` progress line (worker/trainer.h) and the client's counters at that time.
  void OnReport(const nlohmann::json& line, const KVClientStats& stats);

 private:
  Counter pushes_, pulls_, failed_requests_, examples_, wait_seconds_, bytes_pushed_, bytes_pulled_;
  Histogram push_latency_, pull_latency_;
  Gauge clock_, clock_lag_, loss_, accuracy_, examples_per_sec_, staleness_mean_;
  KVClientStats last_;
};

}  // namespace ps
