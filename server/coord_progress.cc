#include "server/coord_progress.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

namespace ps {

using nlohmann::json;

std::optional<json> ParseServerReport(const char* text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  for (const char* key : {"shards", "rows", "rows_spilled", "pushes", "pulls", "queue_depth"}) {
    if (j.contains(key) && !j[key].is_number()) return std::nullopt;
  }
  if (j.contains("held")) {
    if (!j["held"].is_array()) return std::nullopt;
    for (const json& h : j["held"]) {
      if (!h.is_object()) return std::nullopt;
      for (const char* key : {"worker", "waits_on", "seconds"}) {
        if (h.contains(key) && !h[key].is_number()) return std::nullopt;
      }
    }
  }
  for (const char* key : {"pushes_since_checkpoint", "restore_seconds"}) {
    if (j.contains(key) && !j[key].is_number()) return std::nullopt;
  }
  return j;
}

void ServerLive::Apply(json j, double now) {
  if (j.contains("checkpoint_clock") && j["checkpoint_clock"].is_number_integer()) {
    checkpoint_clock = j["checkpoint_clock"].get<int64_t>();
  }
  const uint64_t reported = j.value("pushes", uint64_t{0});
  if (checkpoint_clock >= 0 && j.contains("pushes_since_checkpoint")) {
    // Its push count at that checkpoint: what a restart from it would roll back to.
    const uint64_t since = j.value("pushes_since_checkpoint", uint64_t{0});
    if (since <= reported) pushes_at_checkpoint[checkpoint_clock] = reported - since;
    while (pushes_at_checkpoint.size() > 64) {
      pushes_at_checkpoint.erase(pushes_at_checkpoint.begin());
    }
  }
  if (time > 0 && now > time && reported >= pushes) {
    pushes_per_sec = static_cast<double>(reported - pushes) / (now - time);
  }
  pushes = reported;
  if (j.contains("clock") && j["clock"].is_number_integer()) {
    const int64_t c = j["clock"].get<int64_t>();
    if (time > 0 && now > time && clock >= 0 && c >= clock) {
      clocks_per_sec = static_cast<double>(c - clock) / (now - time);
    }
    clock = c;
  }
  time = now;
  report = std::move(j);
}

Status CheckReportFields(const json& j) {
  for (const char* key : {"examples", "loss", "accuracy", "examples_per_sec", "clock", "epoch",
                          "epoch_fraction", "test_loss", "test_accuracy", "test_auc", "seconds",
                          "steps", "wait_seconds", "compute_seconds", "batch_size", "worker"}) {
    if (j.contains(key) && !j[key].is_number()) {
      return InvalidArgument(std::string("report field '") + key + "' must be a number");
    }
  }
  for (const char* key : {"kind", "device"}) {
    if (j.contains(key) && !j[key].is_string()) {
      return InvalidArgument(std::string("report field '") + key + "' must be a string");
    }
  }
  if (j.contains("final") && !j["final"].is_boolean()) {
    return InvalidArgument("report field 'final' must be true or false");
  }
  return Status::Ok();
}

std::string Eta(double fraction, double elapsed) {
  if (!(fraction > 0.001) || fraction >= 1) return fraction >= 1 ? "0s" : "?";
  const long left = std::lround(elapsed * (1 - fraction) / fraction);
  char buf[32];
  if (left >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", left / 3600, left / 60 % 60);
  } else if (left >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", left / 60, left % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", left);
  }
  return buf;
}

void Progress::Assembled(size_t workers, size_t servers) {
  worker_live_.resize(workers);
  server_live_.resize(servers);
  Metrics* m = options_.metrics;
  if (m == nullptr) return;
  m->AddGauge("ps_workers", "workers in the job").Set(static_cast<double>(workers));
  m->AddGauge("ps_servers", "servers in the job").Set(static_cast<double>(servers));
  metrics_examples_ = m->AddCounter("ps_examples_total", "training examples processed");
  metrics_failures_ = m->AddCounter("ps_failures_total", "processes that failed");
  metrics_epoch_ = m->AddGauge("ps_epoch", "the epoch worker 0 is in");
  metrics_test_accuracy_ = m->AddGauge("ps_test_accuracy", "the last evaluation's accuracy");
  metrics_test_loss_ = m->AddGauge("ps_test_loss", "the last evaluation's loss");
  for (size_t i = 0; i < workers; ++i) {
    const MetricLabels w = {{"worker", std::to_string(i)}};
    metrics_workers_.push_back(
        {m->AddGauge("ps_worker_clock", "a worker's clock", w),
         m->AddGauge("ps_worker_clock_lag", "a worker's clock minus the slowest's", w),
         m->AddGauge("ps_worker_examples_per_second", "a worker's throughput", w),
         m->AddCounter("ps_worker_wait_seconds_total",
                       "seconds a worker was blocked by the staleness bound", w)});
  }
}

void Progress::OnTrain(const TrainLine& line, const Membership& members, double now) {
  const uint64_t n = line.examples > 0 ? static_cast<uint64_t>(line.examples) : 0;
  const int w = line.worker.value_or(-1);
  if (w >= 0 && static_cast<size_t>(w) < worker_live_.size()) {
    WorkerLive& l = worker_live_[static_cast<size_t>(w)];
    l.reported = true;
    l.time = now;
    l.epoch = line.epoch;
    l.clock = line.clock;
    l.examples += n;
    l.examples_per_sec = line.examples_per_sec;
    l.interval_wait = line.wait_seconds;
    l.interval_seconds = l.examples_per_sec > 0 ? n / l.examples_per_sec : 0.0;
    l.wait_seconds += l.interval_wait;
    UpdateWorkerGauges(static_cast<size_t>(w), members);
  }
  metrics_examples_.Increment(static_cast<double>(n));
  accuracy_sum_since_print_ += line.accuracy * static_cast<double>(n);
  examples_total_ += n;
  loss_sum_since_print_ += line.loss * static_cast<double>(n);
  loss_examples_since_print_ += n;
  if (w == members.Evaluator()) {  // worker 0 unless it is gone
    metrics_epoch_.Set(line.epoch);
    epoch_ = line.epoch;
    epoch_fraction_ = line.epoch_fraction;
  }
}

void Progress::UpdateWorkerGauges(size_t w, const Membership& members) {
  if (w >= metrics_workers_.size()) return;
  const WorkerLive& l = worker_live_[w];
  const WorkerMetricHandles& m = metrics_workers_[w];
  int64_t min_clock = l.clock;
  for (size_t i = 0; i < worker_live_.size(); ++i) {
    if (worker_live_[i].reported && !members.workers()[i].result.done) {
      min_clock = std::min(min_clock, worker_live_[i].clock);
    }
  }
  m.clock.Set(static_cast<double>(l.clock));
  m.clock_lag.Set(static_cast<double>(l.clock - min_clock));
  m.examples_per_sec.Set(l.examples_per_sec);
  m.wait_seconds.Increment(l.interval_wait);
}

int64_t Progress::FastestLiveClock(const Membership& members) const {
  int64_t fastest = -1;
  for (size_t w = 0; w < worker_live_.size(); ++w) {
    if (!members.Gone(w) && worker_live_[w].reported) {
      fastest = std::max(fastest, worker_live_[w].clock);
    }
  }
  return fastest;
}

double Progress::MeanSinceLastPrint(double sum) const {
  return loss_examples_since_print_ > 0 ? sum / static_cast<double>(loss_examples_since_print_)
                                        : 0.0;
}

void Progress::OnEval(const EvalLine& line, double now) {
  last_eval_ = line;
  metrics_test_accuracy_.Set(line.test_accuracy);
  metrics_test_loss_.Set(line.test_loss);
  const double rate = examples_total_ / std::max(now, 1e-9);
  const std::string auc =
      line.test_auc ? "  test_auc " + std::to_string(*line.test_auc).substr(0, 6) : "";
  const std::string tail =
      line.final ? "  (final)"
                 : "  ETA " + Eta(static_cast<double>(line.epoch) / options_.epochs, now);
  std::printf(
      "epoch %d/%d  train_loss %.4f  train_acc %.4f  test_loss %.4f  test_acc %.4f%s  %.0f "
      "ex/s  %.1fs%s\n",
      line.epoch, options_.epochs, MeanSinceLastPrint(loss_sum_since_print_),
      MeanSinceLastPrint(accuracy_sum_since_print_), line.test_loss, line.test_accuracy,
      auc.c_str(), rate, now, tail.c_str());
  std::fflush(stdout);
  accuracy_sum_since_print_ = 0;
  loss_sum_since_print_ = 0;
  loss_examples_since_print_ = 0;
  last_print_time_ = now;
  examples_at_last_print_ = examples_total_;
  if (line.final) final_eval_ = line;
}

void Progress::Print(bool force, double now) {
  if (options_.progress_every_seconds <= 0) return;
  if (!force && now - last_print_time_ < options_.progress_every_seconds) return;
  const double dt = now - last_print_time_;
  const double rate = dt > 0 ? (examples_total_ - examples_at_last_print_) / dt : 0;
  const double done = (epoch_ - 1 + epoch_fraction_) / std::max(options_.epochs, 1);
  std::printf("  epoch %d/%d %3.0f%%  %.0f ex/s  train_loss %.4f  train_acc %.4f  %.1fs  ETA %s\n",
              epoch_, options_.epochs, 100.0 * epoch_fraction_, rate,
              MeanSinceLastPrint(loss_sum_since_print_),
              MeanSinceLastPrint(accuracy_sum_since_print_), now, Eta(done, now).c_str());
  std::fflush(stdout);
  last_print_time_ = now;
  examples_at_last_print_ = examples_total_;
}

// One worker's line in the status: who it waits on is what a server holding its pull
// says; else, a worker blocked in its last report interval waits on the slowest one.
json Progress::WorkerStatus(size_t i, const Membership& members, int slowest, int64_t min_clock,
                            double now) const {
  const WorkerLive& l = worker_live_[i];
  const Member& m = members.workers()[i];
  int waits_on = -1;
  for (const ServerLive& s : server_live_) {
    if (!s.report.contains("held")) continue;
    for (const json& h : s.report["held"]) {
      if (h.is_object() && h.value("worker", -1) == static_cast<int>(i)) {
        waits_on = h.value("waits_on", -1);
      }
    }
  }
  const bool blocked =
      l.interval_wait > 0.05 * std::max(l.interval_seconds, 1e-9) && l.interval_wait > 0.01;
  if (waits_on < 0 && blocked && options_.staleness >= 0 && slowest != static_cast<int>(i)) {
    waits_on = slowest;
  }
  if (m.result.done) waits_on = -1;
  return {{"id", i},
          {"device", m.device},
          {"host", m.host},
          {"state", m.result.failed ? "failed"
                    : m.result.done ? "done"
                                    : "training"},
          {"epoch", l.epoch},
          {"clock", l.clock},
          {"clock_lag", slowest >= 0 && !m.result.done ? l.clock - min_clock : 0},
          {"examples", l.examples},
          {"examples_per_sec", l.examples_per_sec},
          {"wait_seconds", l.wait_seconds},
          {"blocked_fraction", l.interval_seconds > 0 ? l.interval_wait / l.interval_seconds : 0},
          {"waits_on", waits_on},
          {"report_age_seconds", l.reported ? now - l.time : -1.0}};
}

json Progress::StatusJson(const Membership& members, const json& failures, double now) const {
  json st;
  st["phase"] = members.assembled() ? "training" : "registering";
  st["elapsed_seconds"] = members.assembled() ? now : 0.0;
  st["epoch"] = epoch_;
  st["epochs"] = options_.epochs;
  st["epoch_fraction"] = epoch_fraction_;
  st["staleness"] = options_.staleness;
  st["examples"] = examples_total_;
  st["registered_servers"] = members.servers().size();
  st["registered_workers"] = members.workers().size();
  // The slowest worker still in the clock table: the one SSP makes the others wait on.
  int slowest = -1;
  int64_t min_clock = INT64_MAX;
  for (size_t i = 0; i < worker_live_.size(); ++i) {
    const WorkerLive& l = worker_live_[i];
    if (members.workers()[i].result.done || !l.reported) continue;
    if (l.clock < min_clock) {
      min_clock = l.clock;
      slowest = static_cast<int>(i);
    }
  }
  json workers = json::array();
  for (size_t i = 0; i < worker_live_.size(); ++i) {
    workers.push_back(WorkerStatus(i, members, slowest, min_clock, now));
  }
  st["workers"] = workers;
  json servers = json::array();
  for (size_t s = 0; s < members.servers().size(); ++s) {
    const Member& m = members.servers()[s];
    json e = {{"id", s}, {"endpoint", m.endpoint}, {"host", m.host}};
    if (s < server_live_.size() && server_live_[s].report.is_object()) {
      const json& r = server_live_[s].report;
      for (const char* key : {"shards", "rows", "rows_spilled", "pushes", "pulls", "queue_depth"}) {
        e[key] = r.value(key, uint64_t{0});
      }
      e["pushes_per_sec"] = server_live_[s].pushes_per_sec;
      e["report_age_seconds"] = now - server_live_[s].time;
    }
    servers.push_back(e);
  }
  st["servers"] = servers;
  st["failures"] = failures;
  return st;
}

}  // namespace ps
