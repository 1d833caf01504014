#include "common/metrics.h"

#include <CivetServer.h>
#include <dlfcn.h>
#include <glog/logging.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>

#include <algorithm>
#include <exception>
#include <stdexcept>

// CivetWeb (the exposer's HTTP server) asks for 100 KB thread stacks, fixed when Debian
// built it. glibc carves a thread's static TLS out of its stack, and a process that loads
// OpenBLAS, cuBLAS and glog has ~190 KB of it, so CivetWeb cannot start its threads in
// ps_worker ("Cannot create threads"). This definition, in the executable, comes before
// libc's for every library: it raises requests below 1 MB to 1 MB and passes the rest on.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStack = size_t{1} << 20;
  return next(attr, std::max(size, kMinStack));
}

namespace ps {

void Counter::Increment(double by) const {
  if (c_ != nullptr && by > 0) c_->Increment(by);
}

void Gauge::Set(double value) const {
  if (g_ != nullptr) g_->Set(value);
}

void Histogram::Observe(double value) const {
  if (h_ != nullptr) h_->Observe(value);
}

void Histogram::ObserveMany(const std::vector<double>& bucket_counts, double sum) const {
  if (h_ != nullptr) h_->ObserveMultiple(bucket_counts, sum);
}

Result<std::unique_ptr<Metrics>> StartProcessMetrics(const std::string& role, int id,
                                                     const std::string& host, int port) {
  MetricsOptions options;
  options.host = host;
  options.port = port;
  options.const_labels = {{"role", role}};
  if (id >= 0) options.const_labels["id"] = std::to_string(id);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics, Metrics::Start(options));
  if (metrics->port() > 0) {
    LOG(INFO) << "metrics on http://" << host << ":" << metrics->port() << "/metrics";
  }
  return metrics;
}

Result<std::unique_ptr<Metrics>> Metrics::Start(const MetricsOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("--metrics_port=" + std::to_string(options.port) +
                           " is not allowed: expected 0 (off) or a port in [1, 65535]");
  }
  std::unique_ptr<Metrics> m(new Metrics());
  m->options_ = options;
  m->registry_ = std::make_shared<prometheus::Registry>();
  if (options.port > 0) {
    const std::string address = options.host + ":" + std::to_string(options.port);
    try {
      // CivetWeb says why it could not start only through this callback.
      static thread_local std::string civet_error;
      civet_error.clear();
      CivetCallbacks callbacks{};
      callbacks.log_message = [](const mg_connection*, const char* message) {
        civet_error = message;
        return 1;
      };
      try {
        // Two CivetWeb threads are plenty for a scraper every few seconds.
        m->exposer_ = std::make_unique<prometheus::Exposer>(
            std::vector<std::string>{"listening_ports", address, "num_threads", "2"}, &callbacks);
      } catch (const std::exception& e) {
        throw std::runtime_error(civet_error.empty() ? e.what() : civet_error);
      }
      m->exposer_->RegisterCollectable(m->registry_);
      std::vector<int> ports = m->exposer_->GetListeningPorts();
      m->port_ = ports.empty() ? options.port : ports.front();
    } catch (const std::exception& e) {
      return Unavailable("cannot serve metrics on " + address + ": " + e.what());
    }
  }
  return m;
}

Metrics::~Metrics() = default;

MetricLabels Metrics::Merged(const MetricLabels& labels) const {
  MetricLabels all = options_.const_labels;
  for (const auto& [k, v] : labels) all[k] = v;
  return all;
}

Counter Metrics::AddCounter(const std::string& name, const std::string& help,
                            const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& f = families_[name];
  if (f == nullptr) f = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  Counter c;
  c.c_ = &static_cast<prometheus::Family<prometheus::Counter>*>(f)->Add(Merged(labels));
  return c;
}

Gauge Metrics::AddGauge(const std::string& name, const std::string& help,
                        const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& f = families_[name];
  if (f == nullptr) f = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  Gauge g;
  g.g_ = &static_cast<prometheus::Family<prometheus::Gauge>*>(f)->Add(Merged(labels));
  return g;
}

Histogram Metrics::AddHistogram(const std::string& name, const std::string& help,
                                const std::vector<double>& bucket_bounds,
                                const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  void*& f = families_[name];
  if (f == nullptr) f = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  Histogram h;
  h.h_ = &static_cast<prometheus::Family<prometheus::Histogram>*>(f)->Add(Merged(labels),
                                                                          bucket_bounds);
  return h;
}

std::string Metrics::Serialize() const {
  prometheus::TextSerializer s;
  return s.Serialize(registry_->Collect());
}

std::vector<double> Metrics::LatencyBuckets() {
  std::vector<double> b;
  for (double v = 1e-4; v < 200; v *= 2) b.push_back(v);
  return b;
}

std::vector<double> Metrics::StalenessBuckets() {
  std::vector<double> b = {0};
  for (double v = 1; v <= 1024; v *= 2) b.push_back(v);
  return b;
}

}  // namespace ps
