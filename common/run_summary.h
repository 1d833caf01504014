// The records of a run directory, typed: the lines of metrics.jsonl that training writes
// (`kind: train` and `kind: eval`) and summary.json. Each has one definition here with
// its JSON form; the coordinator, the workers and the standalone trainer write them through
// these types, and tests and tools may read them back (FromJson).
//
// A field marked optional is left out of the JSON when unset: what a standalone run has no
// notion of (servers, failures), or what only one writer knows (a train line's worker id
// is added by the coordinator). Readers tolerate missing keys: every field keeps its
// default then.
//
// Thread model: plain values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/divergence.h"

namespace ps {

// What a metrics line is, from its "kind" (kOther: a line this file does not type).
enum class MetricsLineKind { kTrain, kEval, kOther };
MetricsLineKind KindOf(const nlohmann::json& line);

// `kind: train`: one worker's training over a report interval.
struct TrainLine {
  std::optional<int> worker;  // the coordinator adds it to what a worker reports
  int epoch = 0;              // 1-based
  double epoch_fraction = 0;  // of `epoch`, in [0, 1]
  int64_t step = 0;           // the worker's steps so far
  int64_t clock = 0;          // its clock
  int64_t examples = 0;       // examples in the interval
  double loss = 0;            // mean over the interval's examples
  double accuracy = 0;
  double examples_per_sec = 0;
  double wait_seconds = 0;  // blocked by the staleness bound in the interval
  int64_t clock_lag_max = 0;
  double staleness_mean = 0;  // of the gradients pushed in the interval
  std::optional<uint64_t> staleness_max_total;
  double lr = 0;  // the learning rate last applied

  nlohmann::json ToJson() const;
  static TrainLine FromJson(const nlohmann::json& j);
};

// `kind: eval`: an evaluation of the model on the test set.
struct EvalLine {
  std::optional<int> worker;
  int epoch = 0;
  bool final = false;  // the final model's evaluation (ends the job)
  int64_t test_examples = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  std::optional<double> test_auc;  // sparse_lr

  nlohmann::json ToJson() const;
  static EvalLine FromJson(const nlohmann::json& j);
};

// summary.json's entry for one worker.
struct WorkerSummary {
  uint64_t id = 0;
  std::string device;
  std::string host;
  uint64_t examples = 0;
  int64_t steps = 0;
  double seconds = 0;
  double wait_seconds = 0;
  double compute_seconds = 0;
  int batch_size = 0;
  double examples_per_sec = 0;
  bool failed = false;
  // A job's worker (the standalone trainer leaves them out): its all-reduce group ("" for
  // none), "finished" | "lost" | "left", whether it joined the running job, and the pushes
  // it gave up on.
  std::optional<std::string> group;
  std::optional<std::string> state;
  std::optional<bool> joined;
  std::optional<uint64_t> pushes_lost;
  // Where the worker's time went: compute/pull/push/wait seconds; pull wait p50/p99/max.
  std::optional<std::map<std::string, double>> step_seconds;
  std::optional<std::map<std::string, double>> pull_wait_ms;
  std::optional<bool> prefetch;
};

// A server's counters at shutdown (wire::ShutdownReply).
struct ServerCounters {
  uint64_t pushes_applied = 0, pushes_rejected = 0, pulls_served = 0;
  uint64_t bytes_pushed = 0, bytes_pulled = 0, rows_held = 0;
  uint64_t pushes_dropped = 0, pulls_held = 0;
  int64_t max_clock_lag = 0;
  uint64_t staleness_sum = 0, staleness_max = 0;
  uint64_t rows_in_memory = 0, rows_spilled = 0, cache_hits = 0, cache_misses = 0;
  uint64_t spill_bytes_read = 0, spill_bytes_written = 0, peak_rss_bytes = 0;
  uint64_t pushes_duplicate = 0, workers_evicted = 0;
  std::vector<uint64_t> staleness_histogram;  // applied pushes by staleness; last: overflow
};

// summary.json's entry for one server: its counters, or why there are none.
struct ServerSummary {
  uint64_t id = 0;
  std::string endpoint;
  std::optional<ServerCounters> counters;  // it shut down cleanly
  std::optional<std::string> state;        // "lost": failed over or dead
  std::optional<int> served_by;            // lost: who serves its shards (-1: nobody)
  std::optional<std::string> error;        // it did not shut down cleanly
  // A server that was lost (failed over, or dead and then replaced or restarted): its
  // counters as it last reported them before the loss, and when ("seconds" into training).
  // Its final counters died with it; these are the lower bound the job knows.
  std::optional<nlohmann::json> before_loss;
};

// What a checkpoint restore started from.
struct RestoredFrom {
  std::string set;
  int64_t clock = 0;
  int epoch = 1;
  bool recorded = false;  // the set was in checkpoints.json (else: its name's clock, epoch 1)
};

// summary.json's fields that only a multi-process job has.
struct JobTotals {
  std::optional<RestoredFrom> restored;
  // With --checkpoint_dir: sets recorded, and the clock of the latest.
  std::optional<uint64_t> checkpoints_recorded;
  std::optional<int64_t> last_recorded_checkpoint_clock;
  double coordinator_cpu_seconds = 0;
  double coordinator_messages_per_sec = 0;  // requests from workers while they trained
  // The spill tier over all servers.
  uint64_t rows_in_memory = 0, rows_spilled = 0;
  double cache_hit_rate = 1;
  uint64_t spill_bytes_read = 0, spill_bytes_written = 0;
  uint64_t max_server_peak_rss_bytes = 0;
  nlohmann::json failures = nlohmann::json::array();  // the coordinator's failure log
  nlohmann::json joins = nlohmann::json::array();     // workers that joined the running job
  double heartbeat_timeout = 0;
  // pushes_lost = pushes_lost_by_workers + pushes_rolled_back; estimated when a restarted
  // server rolled some back.
  uint64_t pushes_lost_by_workers = 0, pushes_rolled_back = 0, pushes_lost = 0;
  bool pushes_lost_estimated = false;
  uint64_t pushes_duplicate = 0;
};

// summary.json.
struct RunSummary {
  std::optional<std::string> mode;  // "standalone" for a one-process run
  bool ok = false;  // "status": "ok" | "failed" | "diverged" (not ok, with `divergence`)
  std::optional<std::string> error;
  std::optional<Divergence> divergence;  // why the job stopped as diverged
  double test_accuracy = 0, test_loss = 0;
  std::optional<double> test_auc;
  int epochs = 0;
  double wall_seconds = 0, train_seconds = 0;
  double train_start_time = 0;  // Unix seconds: metrics lines' "time" minus this
  uint64_t examples = 0;
  std::vector<uint64_t> examples_per_epoch;
  int batch_size = 0;
  bool batch_size_auto = false;  // "batch_size": "auto"
  double examples_per_sec = 0;
  uint64_t pushes_applied = 0, pushes_rejected = 0, pushes_dropped = 0, pulls_held = 0;
  uint64_t bytes_pushed = 0, bytes_pulled = 0;
  int staleness = 0;  // the job's bound
  int64_t max_clock_lag_seen = 0;
  uint64_t max_staleness_seen = 0;
  double mean_staleness = 0;
  uint64_t p99_staleness = 0;
  double wait_seconds = 0;  // summed over workers
  std::vector<WorkerSummary> workers;
  std::vector<ServerSummary> servers;
  std::optional<JobTotals> job;
  std::map<std::string, std::string> config;  // the job's flags

  nlohmann::json ToJson() const;
  static RunSummary FromJson(const nlohmann::json& j);
};

}  // namespace ps
