// A worker's training driver: registers with the coordinator, trains the job's model on
// its share of the data, and reports progress.
//
// Data: every epoch all workers draw the same permutation of the training set (seeded by
// the job seed and the epoch); worker r of W takes positions r, r + W, r + 2W, ... of it.
//
// A step: pull every table (dense range pulls, all in flight together; the servers hold
// them while the staleness bound requires), compute the gradient of the batch's mean loss,
// push it, and tick the clock. Pushes and the tick are asynchronous: the next step's pull
// goes out behind them on the same connections, so it sees them. Worker 0 evaluates the
// test set at the end of each epoch and, once every worker is done, the final model.
//
// Thread model: one thread drives a TrainingLoop; the KVClient has its own I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/job_config.h"
#include "common/status.h"
#include "common/transport.h"
#include "kernels/kernels.h"
#include "worker/idx_reader.h"
#include "worker/kv_client.h"
#include "worker/mlp.h"

namespace ps {

struct WorkerOptions {
  // The coordinator's endpoint. Required.
  std::string coordinator;
  // "cpu", "cuda", "cuda:N" (see kernels/kernels.h).
  std::string device = "cpu";
  std::chrono::milliseconds register_timeout{120000};
  // How long a push or pull may take before the step fails. Pulls held by the staleness
  // bound are answered by the server within --staleness_wait_seconds, so this must exceed it.
  std::chrono::milliseconds request_timeout{600000};
  // > 1 makes this worker that many times slower (it sleeps (slowdown - 1) times its compute
  // time each step), so that users and tests can watch what a straggler does.
  double slowdown = 1;
};

// The whole life of a worker process.
Status RunWorker(const WorkerOptions& options, Transport* transport, const std::atomic<bool>& stop);

// Where a training loop's progress lines go: the coordinator in a job, a test's sink else.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual Status Report(const nlohmann::json& line) = 0;
};

// The examples worker `worker` of `num_workers` trains on in `epoch`, in order.
std::vector<int64_t> EpochShare(uint64_t seed, int epoch, int64_t count, int worker,
                                int num_workers);

class TrainingLoop {
 public:
  // All pointers are borrowed and must outlive the loop. The job's model must be the MLP
  // whose tables are the first of config.table_specs.
  TrainingLoop(const JobConfig& config, int worker_id, Kernels* kernels, KVClient* client,
               Mlp* mlp, const ImageDataset& train, const ImageDataset& test, ProgressSink* sink,
               double slowdown = 1);

  // Trains every epoch, then leaves the clock table.
  Status Run(const std::atomic<bool>& stop);
  // Pulls the current model and evaluates it on the test set.
  Result<BatchResult> Evaluate();
  // The parameters of the last pull, by table.
  const std::vector<std::vector<float>>& params() const { return params_; }
  // examples, steps, seconds, wait_seconds, device.
  nlohmann::json Totals() const;
  static nlohmann::json EvalLine(int epoch, const BatchResult& result, bool final_eval);

 private:
  Status PullAll(RequestInfo* info);
  Status PushAllAndTick();
  Status WaitInFlight();
  Status ReportTraining(int epoch, double epoch_fraction, bool force);
  std::vector<const float*> ConstParams() const;

  const JobConfig& config_;
  const int worker_id_;
  Kernels* kernels_;
  KVClient* client_;
  Mlp* mlp_;
  const ImageDataset& train_;
  const ImageDataset& test_;
  ProgressSink* sink_;
  const double slowdown_;

  std::vector<std::vector<float>> params_, grads_;
  std::vector<Ticket> in_flight_;  // this step's pushes and clock tick

  // Totals and the current report interval.
  std::chrono::steady_clock::time_point start_, last_report_;
  int64_t examples_ = 0;
  int64_t steps_ = 0;
  double seconds_ = 0;
  double wait_seconds_ = 0;
  BatchResult interval_;
  double interval_wait_ = 0;
  int64_t interval_lag_ = 0;
  KVClientStats stats_at_report_;
};

}  // namespace ps
