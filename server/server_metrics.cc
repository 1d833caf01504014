#include "server/server_metrics.h"

#include <algorithm>

namespace ps {

ServerMetrics::ServerMetrics(Metrics* m) : staleness_bounds_(Metrics::StalenessBuckets()) {
  pushes_ = m->AddCounter("ps_pushes_total", "pushes applied");
  pushes_rejected_ =
      m->AddCounter("ps_pushes_rejected_total", "pushes answered with an error (bad input)");
  pushes_dropped_ =
      m->AddCounter("ps_pushes_dropped_total", "pushes dropped as too stale (max_grad_staleness)");
  pulls_ = m->AddCounter("ps_pulls_total", "pulls served");
  pulls_held_ = m->AddCounter("ps_pulls_held_total", "pulls the staleness bound made wait");
  bytes_pushed_ = m->AddCounter("ps_pushed_bytes_total", "gradient payload bytes applied");
  bytes_pulled_ = m->AddCounter("ps_pulled_bytes_total", "value payload bytes sent");
  bad_requests_ = m->AddCounter("ps_failed_requests_total", "requests answered with an error");
  rows_ = m->AddGauge("ps_rows", "rows held in memory");
  rows_spilled_ = m->AddGauge("ps_rows_spilled", "rows spilled to RocksDB (not in memory)");
  spill_read_ = m->AddCounter("ps_spill_read_bytes_total", "bytes read back from RocksDB");
  spill_written_ = m->AddCounter("ps_spill_written_bytes_total", "bytes written to RocksDB");
  queue_depth_ = m->AddGauge("ps_held_pulls", "pulls held by the staleness bound now");
  max_clock_lag_ = m->AddGauge("ps_max_clock_lag", "largest clock lag of a pull served so far");
  staleness_ =
      m->AddHistogram("ps_gradient_staleness",
                      "applied gradients by staleness (shard versions behind)", staleness_bounds_);
  last_.staleness_histogram.assign(ServerCore::kStalenessBuckets, 0);
}

void ServerMetrics::Update(const ServerCore& core) {
  const ServerStats now = core.stats();
  auto delta = [](uint64_t a, uint64_t b) { return static_cast<double>(a >= b ? a - b : 0); };
  pushes_.Increment(delta(now.pushes_applied, last_.pushes_applied));
  pushes_rejected_.Increment(delta(now.pushes_rejected, last_.pushes_rejected));
  pushes_dropped_.Increment(delta(now.pushes_dropped, last_.pushes_dropped));
  pulls_.Increment(delta(now.pulls_served, last_.pulls_served));
  pulls_held_.Increment(delta(now.pulls_held, last_.pulls_held));
  bytes_pushed_.Increment(delta(now.bytes_pushed, last_.bytes_pushed));
  bytes_pulled_.Increment(delta(now.bytes_pulled, last_.bytes_pulled));
  bad_requests_.Increment(delta(now.bad_requests, last_.bad_requests));
  rows_.Set(static_cast<double>(now.rows_held));
  rows_spilled_.Set(static_cast<double>(now.rows_spilled));
  spill_read_.Increment(delta(now.spill_bytes_read, last_.spill_bytes_read));
  spill_written_.Increment(delta(now.spill_bytes_written, last_.spill_bytes_written));
  queue_depth_.Set(static_cast<double>(core.held_pulls()));
  max_clock_lag_.Set(static_cast<double>(now.max_clock_lag));
  // The core counts staleness exactly per value (the last index: that or more); the
  // histogram's buckets are powers of two.
  std::vector<double> counts(staleness_bounds_.size() + 1, 0.0);
  double sum = 0;
  bool any = false;
  for (size_t i = 0; i < now.staleness_histogram.size() && i < last_.staleness_histogram.size();
       ++i) {
    const double d = delta(now.staleness_histogram[i], last_.staleness_histogram[i]);
    if (d == 0) continue;
    any = true;
    const size_t b =
        static_cast<size_t>(std::lower_bound(staleness_bounds_.begin(), staleness_bounds_.end(),
                                             static_cast<double>(i)) -
                            staleness_bounds_.begin());
    counts[b] += d;
    sum += d * static_cast<double>(i);
  }
  if (any) staleness_.ObserveMany(counts, sum);
  last_ = now;
}

}  // namespace ps
