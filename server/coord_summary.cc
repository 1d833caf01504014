#include "server/coord_summary.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "common/run_files.h"

namespace ps {
namespace {

using nlohmann::json;

// The numbers of an object a worker sent (input from the network: copied only when
// well-typed); nullopt when it is absent or not an object.
std::optional<std::map<std::string, double>> Numbers(const json& totals, const char* key) {
  if (!totals.contains(key) || !totals[key].is_object()) return std::nullopt;
  std::map<std::string, double> numbers;
  for (const auto& [k, v] : totals[key].items()) {
    if (v.is_number()) numbers[k] = v.get<double>();
  }
  return numbers;
}

WorkerSummary SummarizeWorker(size_t id, const Member& m) {
  const json& t = m.result.totals.is_object() ? m.result.totals : json::object();
  WorkerSummary w;
  w.id = id;
  w.device = m.device;
  w.host = m.host;
  w.examples = t.value("examples", uint64_t{0});
  w.steps = t.value("steps", int64_t{0});
  w.seconds = t.value("seconds", 0.0);
  w.wait_seconds = t.value("wait_seconds", 0.0);
  w.compute_seconds = t.value("compute_seconds", 0.0);
  w.batch_size = t.value("batch_size", 0);
  w.examples_per_sec = w.seconds > 0 ? w.examples / w.seconds : 0.0;
  w.failed = m.result.failed;
  w.group = m.group_formed;
  w.state = m.dead ? "lost" : m.left ? "left" : "finished";
  w.joined = m.joined;
  w.pushes_lost = t.value("pushes_lost", uint64_t{0});
  w.step_seconds = Numbers(t, "step_seconds");
  w.pull_wait_ms = Numbers(t, "pull_wait_ms");
  if (t.contains("prefetch") && t["prefetch"].is_boolean()) w.prefetch = t["prefetch"].get<bool>();
  return w;
}

// The servers' counters: summed, maxima, merged staleness histogram.
void AddServerTotals(const std::vector<ServerSummary>& servers, RunSummary* s, JobTotals* job) {
  std::vector<uint64_t> histogram;
  uint64_t staleness_sum = 0, hits = 0, misses = 0;
  for (const ServerSummary& e : servers) {
    if (!e.counters) continue;
    const ServerCounters& c = *e.counters;
    s->pushes_applied += c.pushes_applied;
    s->pushes_rejected += c.pushes_rejected;
    s->pushes_dropped += c.pushes_dropped;
    s->pulls_held += c.pulls_held;
    s->bytes_pushed += c.bytes_pushed;
    s->bytes_pulled += c.bytes_pulled;
    s->max_clock_lag_seen = std::max(s->max_clock_lag_seen, c.max_clock_lag);
    s->max_staleness_seen = std::max(s->max_staleness_seen, c.staleness_max);
    staleness_sum += c.staleness_sum;
    hits += c.cache_hits;
    misses += c.cache_misses;
    job->rows_in_memory += c.rows_in_memory;
    job->rows_spilled += c.rows_spilled;
    job->spill_bytes_read += c.spill_bytes_read;
    job->spill_bytes_written += c.spill_bytes_written;
    job->max_server_peak_rss_bytes = std::max(job->max_server_peak_rss_bytes, c.peak_rss_bytes);
    job->pushes_duplicate += c.pushes_duplicate;
    if (histogram.size() < c.staleness_histogram.size()) {
      histogram.resize(c.staleness_histogram.size(), 0);
    }
    for (size_t i = 0; i < c.staleness_histogram.size(); ++i) {
      histogram[i] += c.staleness_histogram[i];
    }
  }
  s->mean_staleness =
      s->pushes_applied > 0 ? static_cast<double>(staleness_sum) / s->pushes_applied : 0.0;
  s->p99_staleness = P99Index(histogram);
  job->cache_hit_rate = hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 1.0;
}

}  // namespace

uint64_t P99Index(const std::vector<uint64_t>& histogram) {
  uint64_t total = 0, seen = 0;
  for (uint64_t c : histogram) total += c;
  for (size_t i = 0; i < histogram.size(); ++i) {
    seen += histogram[i];
    if (seen * 100 >= total * 99) return i;
  }
  return 0;
}

Status WriteRunSummary(const RunSummary& summary, const std::string& run_dir) {
  const std::string path = run_dir + "/summary.json";
  PS_RETURN_IF_ERROR(WriteJsonFile(path, summary.ToJson()));
  std::printf("%s: test_acc %.4f  test_loss %.4f  %.0f ex/s  %.1fs wall  -> %s\n",
              summary.ok           ? "done"
              : summary.divergence ? "DIVERGED"
                                   : "FAILED",
              summary.test_accuracy, summary.test_loss, summary.examples_per_sec,
              summary.wall_seconds, path.c_str());
  std::fflush(stdout);
  return Status::Ok();
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

RunSummary BuildSummary(const SummaryInputs& in) {
  const JobConfig& config = *in.config;
  RunSummary s;
  s.ok = in.outcome.ok();
  if (!in.outcome.ok()) s.error = in.outcome.ToString();
  if (!s.ok) s.divergence = in.divergence;
  if (in.eval) {
    s.test_accuracy = in.eval->test_accuracy;
    s.test_loss = in.eval->test_loss;
    s.test_auc = in.eval->test_auc;
  }
  s.epochs = config.epochs;
  s.wall_seconds = in.wall_seconds;
  s.train_seconds = in.train_seconds;
  s.train_start_time = in.train_start_time;
  for (size_t i = 0; i < in.workers.size(); ++i) {
    s.workers.push_back(SummarizeWorker(i, in.workers[i]));
    s.examples += s.workers.back().examples;
    s.wait_seconds += s.workers.back().wait_seconds;
  }
  s.examples_per_epoch = in.examples_per_epoch;
  s.batch_size = config.batch_size;
  s.batch_size_auto = config.auto_batch;
  s.examples_per_sec = in.train_seconds > 0 ? s.examples / in.train_seconds : 0.0;
  s.staleness = config.staleness;
  JobTotals job;
  if (in.restored) job.restored = in.restored;
  if (!config.checkpoint_dir.empty()) {
    job.checkpoints_recorded = in.checkpoints_recorded;
    job.last_recorded_checkpoint_clock = in.recorded_clock;
  }
  job.coordinator_cpu_seconds = in.cpu_seconds;
  job.coordinator_messages_per_sec =
      in.train_seconds > 0 ? in.messages_during_training / in.train_seconds : 0.0;
  AddServerTotals(in.servers, &s, &job);
  job.failures = in.failures;
  job.joins = in.joins;
  job.heartbeat_timeout = config.heartbeat_timeout;
  for (const WorkerSummary& w : s.workers) job.pushes_lost_by_workers += *w.pushes_lost;
  // pushes_lost also counts the acknowledged pushes restarted servers rolled back, so it
  // is an estimate then (pushes_lost_estimated).
  job.pushes_rolled_back = in.pushes_rolled_back;
  job.pushes_lost_estimated = in.rollback_estimated;
  job.pushes_lost = job.pushes_lost_by_workers + in.pushes_rolled_back;
  s.job = std::move(job);
  s.servers = in.servers;
  s.config = config.ToFlagMap();
  return s;
}

}  // namespace ps
