// A server's Prometheus metrics (common/metrics.h), kept from its ServerCore's counters:
// the request loop calls Update now and then, and the deltas since the last call are added,
// so the request path itself does no metrics work.
//
// Thread model: Update is called by the server's request loop only; a scrape reads the
// metrics from the exposer's thread (prometheus-cpp's metrics are thread-safe).
#pragma once

#include "common/metrics.h"
#include "server/server_core.h"

namespace ps {

class ServerMetrics {
 public:
  explicit ServerMetrics(Metrics* metrics);
  void Update(const ServerCore& core);

 private:
  Counter pushes_, pushes_rejected_, pushes_dropped_, pulls_, pulls_held_, bytes_pushed_,
      bytes_pulled_, bad_requests_, spill_read_, spill_written_;
  Gauge rows_, rows_spilled_, queue_depth_, max_clock_lag_;
  Histogram staleness_;
  std::vector<double> staleness_bounds_;
  ServerStats last_;
};

}  // namespace ps
