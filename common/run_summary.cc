#include "common/run_summary.h"

namespace ps {
namespace {

using nlohmann::json;

template <typename T>
void Put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

// Reads `key` into *out when present and of a convertible type; else leaves *out.
template <typename T>
void Get(const json& j, const char* key, T* out) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return;
  try {
    *out = j[key].get<T>();
  } catch (const json::exception&) {
  }
}

template <typename T>
void Get(const json& j, const char* key, std::optional<T>* out) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return;
  T v{};
  try {
    v = j[key].get<T>();
  } catch (const json::exception&) {
    return;
  }
  *out = std::move(v);
}

json WorkerToJson(const WorkerSummary& w) {
  json j = {{"id", w.id},
            {"device", w.device},
            {"host", w.host},
            {"examples", w.examples},
            {"steps", w.steps},
            {"seconds", w.seconds},
            {"wait_seconds", w.wait_seconds},
            {"compute_seconds", w.compute_seconds},
            {"batch_size", w.batch_size},
            {"examples_per_sec", w.examples_per_sec},
            {"failed", w.failed}};
  Put(j, "group", w.group);
  Put(j, "state", w.state);
  Put(j, "joined", w.joined);
  Put(j, "pushes_lost", w.pushes_lost);
  Put(j, "step_seconds", w.step_seconds);
  Put(j, "pull_wait_ms", w.pull_wait_ms);
  Put(j, "prefetch", w.prefetch);
  return j;
}

WorkerSummary WorkerFromJson(const json& j) {
  WorkerSummary w;
  Get(j, "id", &w.id);
  Get(j, "device", &w.device);
  Get(j, "host", &w.host);
  Get(j, "examples", &w.examples);
  Get(j, "steps", &w.steps);
  Get(j, "seconds", &w.seconds);
  Get(j, "wait_seconds", &w.wait_seconds);
  Get(j, "compute_seconds", &w.compute_seconds);
  Get(j, "batch_size", &w.batch_size);
  Get(j, "examples_per_sec", &w.examples_per_sec);
  Get(j, "failed", &w.failed);
  Get(j, "group", &w.group);
  Get(j, "state", &w.state);
  Get(j, "joined", &w.joined);
  Get(j, "pushes_lost", &w.pushes_lost);
  Get(j, "step_seconds", &w.step_seconds);
  Get(j, "pull_wait_ms", &w.pull_wait_ms);
  Get(j, "prefetch", &w.prefetch);
  return w;
}

// The counters' JSON keys, in one list for both directions.
template <typename Counters, typename F>
void ForEachCounter(Counters& c, F&& f) {
  f("pushes_applied", c.pushes_applied);
  f("pushes_rejected", c.pushes_rejected);
  f("pulls_served", c.pulls_served);
  f("bytes_pushed", c.bytes_pushed);
  f("bytes_pulled", c.bytes_pulled);
  f("rows_held", c.rows_held);
  f("pushes_dropped", c.pushes_dropped);
  f("pulls_held", c.pulls_held);
  f("max_clock_lag", c.max_clock_lag);
  f("staleness_sum", c.staleness_sum);
  f("staleness_max", c.staleness_max);
  f("rows_in_memory", c.rows_in_memory);
  f("rows_spilled", c.rows_spilled);
  f("cache_hits", c.cache_hits);
  f("cache_misses", c.cache_misses);
  f("spill_bytes_read", c.spill_bytes_read);
  f("spill_bytes_written", c.spill_bytes_written);
  f("peak_rss_bytes", c.peak_rss_bytes);
  f("pushes_duplicate", c.pushes_duplicate);
  f("workers_evicted", c.workers_evicted);
  f("staleness_histogram", c.staleness_histogram);
}

json ServerToJson(const ServerSummary& s) {
  json j = {{"id", s.id}, {"endpoint", s.endpoint}};
  if (s.counters) {
    ForEachCounter(*s.counters, [&j](const char* key, const auto& v) { j[key] = v; });
  }
  Put(j, "state", s.state);
  Put(j, "served_by", s.served_by);
  Put(j, "error", s.error);
  Put(j, "before_loss", s.before_loss);
  return j;
}

ServerSummary ServerFromJson(const json& j) {
  ServerSummary s;
  Get(j, "id", &s.id);
  Get(j, "endpoint", &s.endpoint);
  if (j.is_object() && j.contains("pushes_applied")) {
    ServerCounters c;
    ForEachCounter(c, [&j](const char* key, auto& v) { Get(j, key, &v); });
    s.counters = c;
  }
  Get(j, "state", &s.state);
  Get(j, "served_by", &s.served_by);
  Get(j, "error", &s.error);
  Get(j, "before_loss", &s.before_loss);
  return s;
}

void PutJobTotals(const JobTotals& t, json& j) {
  if (t.restored) {
    j["restored"] = {{"set", t.restored->set},
                     {"clock", t.restored->clock},
                     {"epoch", t.restored->epoch},
                     {"recorded", t.restored->recorded}};
  }
  Put(j, "checkpoints_recorded", t.checkpoints_recorded);
  Put(j, "last_recorded_checkpoint_clock", t.last_recorded_checkpoint_clock);
  j["coordinator_cpu_seconds"] = t.coordinator_cpu_seconds;
  j["coordinator_messages_per_sec"] = t.coordinator_messages_per_sec;
  j["rows_in_memory"] = t.rows_in_memory;
  j["rows_spilled"] = t.rows_spilled;
  j["cache_hit_rate"] = t.cache_hit_rate;
  j["spill_bytes_read"] = t.spill_bytes_read;
  j["spill_bytes_written"] = t.spill_bytes_written;
  j["max_server_peak_rss_bytes"] = t.max_server_peak_rss_bytes;
  j["failures"] = t.failures;
  j["joins"] = t.joins;
  j["heartbeat_timeout"] = t.heartbeat_timeout;
  j["pushes_lost_by_workers"] = t.pushes_lost_by_workers;
  j["pushes_rolled_back"] = t.pushes_rolled_back;
  j["pushes_lost_estimated"] = t.pushes_lost_estimated;
  j["pushes_lost"] = t.pushes_lost;
  j["pushes_duplicate"] = t.pushes_duplicate;
}

JobTotals GetJobTotals(const json& j) {
  JobTotals t;
  if (j.contains("restored") && j["restored"].is_object()) {
    RestoredFrom r;
    Get(j["restored"], "set", &r.set);
    Get(j["restored"], "clock", &r.clock);
    Get(j["restored"], "epoch", &r.epoch);
    Get(j["restored"], "recorded", &r.recorded);
    t.restored = r;
  }
  Get(j, "checkpoints_recorded", &t.checkpoints_recorded);
  Get(j, "last_recorded_checkpoint_clock", &t.last_recorded_checkpoint_clock);
  Get(j, "coordinator_cpu_seconds", &t.coordinator_cpu_seconds);
  Get(j, "coordinator_messages_per_sec", &t.coordinator_messages_per_sec);
  Get(j, "rows_in_memory", &t.rows_in_memory);
  Get(j, "rows_spilled", &t.rows_spilled);
  Get(j, "cache_hit_rate", &t.cache_hit_rate);
  Get(j, "spill_bytes_read", &t.spill_bytes_read);
  Get(j, "spill_bytes_written", &t.spill_bytes_written);
  Get(j, "max_server_peak_rss_bytes", &t.max_server_peak_rss_bytes);
  if (j.contains("failures")) t.failures = j["failures"];
  if (j.contains("joins")) t.joins = j["joins"];
  Get(j, "heartbeat_timeout", &t.heartbeat_timeout);
  Get(j, "pushes_lost_by_workers", &t.pushes_lost_by_workers);
  Get(j, "pushes_rolled_back", &t.pushes_rolled_back);
  Get(j, "pushes_lost_estimated", &t.pushes_lost_estimated);
  Get(j, "pushes_lost", &t.pushes_lost);
  Get(j, "pushes_duplicate", &t.pushes_duplicate);
  return t;
}

}  // namespace

MetricsLineKind KindOf(const json& line) {
  if (!line.is_object() || !line.contains("kind") || !line["kind"].is_string()) {
    return MetricsLineKind::kOther;
  }
  const std::string& kind = line["kind"].get_ref<const std::string&>();
  if (kind == "train") return MetricsLineKind::kTrain;
  if (kind == "eval") return MetricsLineKind::kEval;
  return MetricsLineKind::kOther;
}

json TrainLine::ToJson() const {
  json j = {{"kind", "train"},
            {"epoch", epoch},
            {"epoch_fraction", epoch_fraction},
            {"step", step},
            {"clock", clock},
            {"examples", examples},
            {"loss", loss},
            {"accuracy", accuracy},
            {"examples_per_sec", examples_per_sec},
            {"wait_seconds", wait_seconds},
            {"clock_lag_max", clock_lag_max},
            {"staleness_mean", staleness_mean},
            {"lr", lr}};
  Put(j, "worker", worker);
  Put(j, "staleness_max_total", staleness_max_total);
  return j;
}

TrainLine TrainLine::FromJson(const json& j) {
  TrainLine t;
  Get(j, "worker", &t.worker);
  Get(j, "epoch", &t.epoch);
  Get(j, "epoch_fraction", &t.epoch_fraction);
  Get(j, "step", &t.step);
  Get(j, "clock", &t.clock);
  Get(j, "examples", &t.examples);
  Get(j, "loss", &t.loss);
  Get(j, "accuracy", &t.accuracy);
  Get(j, "examples_per_sec", &t.examples_per_sec);
  Get(j, "wait_seconds", &t.wait_seconds);
  Get(j, "clock_lag_max", &t.clock_lag_max);
  Get(j, "staleness_mean", &t.staleness_mean);
  Get(j, "staleness_max_total", &t.staleness_max_total);
  Get(j, "lr", &t.lr);
  return t;
}

json EvalLine::ToJson() const {
  json j = {{"kind", "eval"},         {"epoch", epoch},
            {"final", final},         {"test_examples", test_examples},
            {"test_loss", test_loss}, {"test_accuracy", test_accuracy}};
  Put(j, "worker", worker);
  Put(j, "test_auc", test_auc);
  return j;
}

EvalLine EvalLine::FromJson(const json& j) {
  EvalLine e;
  Get(j, "worker", &e.worker);
  Get(j, "epoch", &e.epoch);
  Get(j, "final", &e.final);
  Get(j, "test_examples", &e.test_examples);
  Get(j, "test_loss", &e.test_loss);
  Get(j, "test_accuracy", &e.test_accuracy);
  Get(j, "test_auc", &e.test_auc);
  return e;
}

json RunSummary::ToJson() const {
  json j;
  Put(j, "mode", mode);
  j["status"] = ok ? "ok" : divergence ? "diverged" : "failed";
  Put(j, "error", error);
  if (divergence) j["divergence"] = divergence->ToJson();
  j["test_accuracy"] = test_accuracy;
  j["test_loss"] = test_loss;
  Put(j, "test_auc", test_auc);
  j["epochs"] = epochs;
  j["wall_seconds"] = wall_seconds;
  j["train_seconds"] = train_seconds;
  j["train_start_time"] = train_start_time;
  j["examples"] = examples;
  j["examples_per_epoch"] = examples_per_epoch;
  j["batch_size"] = batch_size_auto ? json("auto") : json(batch_size);
  j["examples_per_sec"] = examples_per_sec;
  j["pushes_applied"] = pushes_applied;
  j["pushes_rejected"] = pushes_rejected;
  j["pushes_dropped"] = pushes_dropped;
  j["pulls_held"] = pulls_held;
  j["bytes_pushed"] = bytes_pushed;
  j["bytes_pulled"] = bytes_pulled;
  j["staleness"] = staleness;
  j["max_clock_lag_seen"] = max_clock_lag_seen;
  j["max_staleness_seen"] = max_staleness_seen;
  j["mean_staleness"] = mean_staleness;
  j["p99_staleness"] = p99_staleness;
  j["wait_seconds"] = wait_seconds;
  j["workers"] = json::array();
  for (const WorkerSummary& w : workers) j["workers"].push_back(WorkerToJson(w));
  j["servers"] = json::array();
  for (const ServerSummary& s : servers) j["servers"].push_back(ServerToJson(s));
  if (job) PutJobTotals(*job, j);
  j["config"] = config;
  return j;
}

RunSummary RunSummary::FromJson(const json& j) {
  RunSummary s;
  Get(j, "mode", &s.mode);
  s.ok = j.is_object() && j.value("status", "") == "ok";
  Get(j, "error", &s.error);
  if (j.is_object() && j.contains("divergence"))
    s.divergence = Divergence::FromJson(j["divergence"]);
  Get(j, "test_accuracy", &s.test_accuracy);
  Get(j, "test_loss", &s.test_loss);
  Get(j, "test_auc", &s.test_auc);
  Get(j, "epochs", &s.epochs);
  Get(j, "wall_seconds", &s.wall_seconds);
  Get(j, "train_seconds", &s.train_seconds);
  Get(j, "train_start_time", &s.train_start_time);
  Get(j, "examples", &s.examples);
  Get(j, "examples_per_epoch", &s.examples_per_epoch);
  s.batch_size_auto = j.is_object() && j.contains("batch_size") && j["batch_size"] == "auto";
  if (!s.batch_size_auto) Get(j, "batch_size", &s.batch_size);
  Get(j, "examples_per_sec", &s.examples_per_sec);
  Get(j, "pushes_applied", &s.pushes_applied);
  Get(j, "pushes_rejected", &s.pushes_rejected);
  Get(j, "pushes_dropped", &s.pushes_dropped);
  Get(j, "pulls_held", &s.pulls_held);
  Get(j, "bytes_pushed", &s.bytes_pushed);
  Get(j, "bytes_pulled", &s.bytes_pulled);
  Get(j, "staleness", &s.staleness);
  Get(j, "max_clock_lag_seen", &s.max_clock_lag_seen);
  Get(j, "max_staleness_seen", &s.max_staleness_seen);
  Get(j, "mean_staleness", &s.mean_staleness);
  Get(j, "p99_staleness", &s.p99_staleness);
  Get(j, "wait_seconds", &s.wait_seconds);
  if (j.is_object() && j.contains("workers") && j["workers"].is_array()) {
    for (const json& w : j["workers"]) s.workers.push_back(WorkerFromJson(w));
  }
  if (j.is_object() && j.contains("servers") && j["servers"].is_array()) {
    for (const json& e : j["servers"]) s.servers.push_back(ServerFromJson(e));
  }
  // A job's summary always has the failure log; a standalone run's never.
  if (j.is_object() && j.contains("failures")) s.job = GetJobTotals(j);
  Get(j, "config", &s.config);
  return s;
}

}  // namespace ps
