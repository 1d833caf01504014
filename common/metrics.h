// Prometheus metrics for every process (coordinator, servers, workers): counters, gauges
// and histograms in one registry per process, served over HTTP by a pull exposer
// (prometheus-cpp's CivetWeb server) at http://HOST:PORT/metrics when a port is given.
// This header wraps prometheus-cpp so that the rest of the code does not include it.
//
// Names follow Prometheus conventions: base units (seconds, bytes), `_total` counters.
// Every metric of a process carries the labels in MetricsOptions::const_labels (role, id).
//
// Thread model: every method is thread-safe. Handles (Counter, Gauge, Histogram) are cheap
// to copy, stay valid while the Metrics object lives, and a default-constructed handle
// ignores what it is given, so that code can update metrics whether or not they are on.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
class Exposer;
}  // namespace prometheus

namespace ps {

using MetricLabels = std::map<std::string, std::string>;

class Counter {
 public:
  void Increment(double by = 1) const;

 private:
  friend class Metrics;
  prometheus::Counter* c_ = nullptr;
};

class Gauge {
 public:
  void Set(double value) const;

 private:
  friend class Metrics;
  prometheus::Gauge* g_ = nullptr;
};

class Histogram {
 public:
  void Observe(double value) const;
  // Adds counts to the buckets at once (bucket_counts[i] observations in bucket i, one
  // more entry than the bucket bounds for +Inf) whose values sum to `sum`.
  void ObserveMany(const std::vector<double>& bucket_counts, double sum) const;

 private:
  friend class Metrics;
  prometheus::Histogram* h_ = nullptr;
};

struct MetricsOptions {
  // The address the HTTP endpoint binds to: the launcher's, never all interfaces unless
  // asked (0.0.0.0).
  std::string host = "127.0.0.1";
  // The endpoint's port; 0: none (metrics are kept but nobody can read them).
  int port = 0;
  // Labels on every metric of this process, e.g. {{"role", "worker"}, {"id", "1"}}.
  MetricLabels const_labels;
};

class Metrics;

// A binary's metrics: `role` and (when >= 0) `id` as labels on every series, the endpoint
// at host:port (port 0: none), and a log line saying where it listens. Each main calls it
// once.
Result<std::unique_ptr<Metrics>> StartProcessMetrics(const std::string& role, int id,
                                                     const std::string& host, int port);

class Metrics {
 public:
  // Starts the registry and, with a port, the HTTP endpoint. Unavailable when the port
  // cannot be bound; InvalidArgument for a port outside [0, 65535].
  static Result<std::unique_ptr<Metrics>> Start(const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // One time series of the family `name` (created on first use with `help`), with the
  // process's labels plus `labels`. The same name and labels give the same series.
  Counter AddCounter(const std::string& name, const std::string& help,
                     const MetricLabels& labels = {});
  Gauge AddGauge(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Histogram AddHistogram(const std::string& name, const std::string& help,
                         const std::vector<double>& bucket_bounds, const MetricLabels& labels = {});

  // The port the endpoint listens on; 0 when there is none.
  int port() const { return port_; }
  // Everything in Prometheus' text format, as a scrape would see it.
  std::string Serialize() const;

  // Bucket bounds for latencies: 100 us to ~100 s, x2 steps... (seconds).
  static std::vector<double> LatencyBuckets();
  // 0, 1, 2, 4, ... 1024: for staleness in versions or clocks.
  static std::vector<double> StalenessBuckets();

 private:
  Metrics() = default;
  MetricLabels Merged(const MetricLabels& labels) const;

  MetricsOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::mutex mu_;  // guards families_ (prometheus' Family::Add is thread-safe itself)
  std::map<std::string, void*> families_;  // name -> prometheus::Family<T>*
};

}  // namespace ps
