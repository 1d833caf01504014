// What the coordinator knows of a running job from the processes' reports: the latest
// train line of each worker and status of each server (the live view ps_status shows),
// the console's progress and per-epoch lines, and the job's Prometheus gauges.
//
// Times are seconds into training (`now`), passed in by the caller.
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/run_summary.h"
#include "server/coord_membership.h"

namespace ps {

// A worker's latest train line.
struct WorkerLive {
  bool reported = false;
  double time = 0;  // seconds into training at the last report
  int epoch = 0;
  int64_t clock = 0;
  uint64_t examples = 0;
  double examples_per_sec = 0;
  double wait_seconds = 0;      // blocked by the staleness bound, in total
  double interval_wait = 0;     // ... in the last report's interval
  double interval_seconds = 0;  // that interval's length
};

// A server's latest status (server/server_node.h: ServerStatusJson).
struct ServerLive {
  nlohmann::json report;  // the last one
  double time = 0;
  uint64_t pushes = 0;
  double pushes_per_sec = 0;
  int64_t clock = -1;  // the slowest live worker's clock there
  double clocks_per_sec = 0;
  int64_t checkpoint_clock = -1;                     // the latest checkpoint it committed
  std::map<int64_t, uint64_t> pushes_at_checkpoint;  // its push count at each checkpoint

  // Takes in a report that ParseServerReport accepted, received at `now`.
  void Apply(nlohmann::json report, double now);
};

// A server's status text as JSON; nullopt when malformed (it changes nothing but the view).
std::optional<nlohmann::json> ParseServerReport(const char* text);

// Workers' JSON is input from the network: every field the coordinator reads must have
// the type it reads it as.
Status CheckReportFields(const nlohmann::json& j);

// The time left when `fraction` of the job took `elapsed` seconds: 1h02m, 3m05s or 42s.
std::string Eta(double fraction, double elapsed);

struct ProgressOptions {
  int epochs = 1;     // --epochs
  int staleness = 0;  // --staleness (-1: ASP)
  // Seconds between progress lines on stdout (0: only per epoch).
  double progress_every_seconds = 5;
  Metrics* metrics = nullptr;  // Prometheus; nullptr: none. Borrowed.
};

class Progress {
 public:
  explicit Progress(ProgressOptions options) : options_(options) {}

  // A restored job starts at `epoch`.
  void StartAtEpoch(int epoch) { epoch_ = epoch; }
  // The job is assembled: one live view per process, and the gauges.
  void Assembled(size_t workers, size_t servers);

  // A train line from a live worker; `members` says who is done and who evaluates.
  void OnTrain(const TrainLine& line, const Membership& members, double now);
  // An eval line: prints the epoch's line. The final one ends the job.
  void OnEval(const EvalLine& line, double now);
  // The progress line, when one is due (or `force`).
  void Print(bool force, double now);
  void CountFailure() { metrics_failures_.Increment(); }
  // The fastest live worker's clock in the workers' last reports (-1: none reported).
  int64_t FastestLiveClock(const Membership& members) const;

  // The job as ps_status shows it (server/status_main.cc).
  nlohmann::json StatusJson(const Membership& members, const nlohmann::json& failures,
                            double now) const;

  std::vector<ServerLive>& servers() { return server_live_; }
  const std::vector<ServerLive>& servers() const { return server_live_; }
  const std::vector<WorkerLive>& workers() const { return worker_live_; }
  int epoch() const { return epoch_; }
  const std::optional<EvalLine>& final_eval() const { return final_eval_; }
  const std::optional<EvalLine>& last_eval() const { return last_eval_; }

 private:
  void UpdateWorkerGauges(size_t w, const Membership& members);
  nlohmann::json WorkerStatus(size_t i, const Membership& members, int slowest, int64_t min_clock,
                              double now) const;
  double MeanSinceLastPrint(double sum) const;

  ProgressOptions options_;
  std::vector<WorkerLive> worker_live_;  // the job's workers at assembly
  std::vector<ServerLive> server_live_;
  uint64_t examples_total_ = 0;
  uint64_t examples_at_last_print_ = 0;
  double loss_sum_since_print_ = 0;
  double accuracy_sum_since_print_ = 0;
  uint64_t loss_examples_since_print_ = 0;
  double last_print_time_ = 0;
  int epoch_ = 1;  // the evaluator's
  double epoch_fraction_ = 0;
  std::optional<EvalLine> final_eval_, last_eval_;

  // Prometheus (no-ops without options_.metrics).
  struct WorkerMetricHandles {
    Gauge clock, clock_lag, examples_per_sec;
    Counter wait_seconds;
  };
  std::vector<WorkerMetricHandles> metrics_workers_;
  Counter metrics_examples_, metrics_failures_;
  Gauge metrics_epoch_, metrics_test_accuracy_, metrics_test_loss_;
};

}  // namespace ps
