// A worker's training driver: registers with the coordinator, trains the job's model on
// its share of the data, and reports progress.
//
// Data: every epoch has one order of the training set (a permutation seeded by the job
// seed and the epoch, the same in every process), cut into chunks that workers lease from
// the coordinator (common/lease_table.h): a fast worker leases more, and every example is
// processed once per epoch whoever processes it.
//
// A step: pull every table (dense range pulls, all in flight together; the servers hold
// them while the staleness bound requires), compute the gradient of the batch's mean loss,
// push it, and tick the clock. Pushes and the tick are asynchronous: the next step's pull
// goes out behind them on the same connections, so it sees them. Worker 0 evaluates the
// test set at the end of each epoch and, once every worker is done, the final model.
//
// Failures (server/coordinator.h): a worker sends heartbeats from a thread of its own
// (common/heartbeat.h). On `stop` (SIGTERM, the preemption notice of cloud VMs) it finishes
// its current chunk if that takes less than drain_finish_chunk, else stops at the next step
// and returns the chunk; it waits for its pushes, leaves the clock tables and tells the
// coordinator it leaves, then exits 0. A worker whose id is past the job's num_workers
// joined a running job: it starts out of the clock table and enters it, at the slowest
// live worker's clock, with its first chunk.
//
// Prefetch (WorkerOptions::prefetch, off by default: see README "Speed and scaling"): the pull for
// step t + 1 goes out before step t computes, tagged with clock t + 1, so that its round trip hides
// behind the compute. Its rows then lack this worker's own step-t gradient (pushed after
// it): the worker's view is one step older in its own updates, and the server counts each
// push as staleness >= 1. The staleness bound S still holds for everyone's updates (the
// servers gate the pull at clock t + 1: every update from clocks <= t - S is in it, own
// ones included since S >= 1). Under BSP (a bound of 0 on any table) it would break
// lockstep semantics, so it is off there. Only models whose pulls do not depend on the
// batch prefetch (the MLP); sparse LR pulls as before.
//
// Step time breakdown (Totals()["step_seconds"]): `pull` blocked on pull replies (minus
// the servers' holds), `wait` blocked by the staleness bound (the holds) or on the previous
// step's push acknowledgements, `compute` forward/backward (and --slowdown), `push`
// issuing the pushes and the clock tick.
//
// Thread model: one thread drives a TrainingLoop; the KVClient has its own I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/divergence.h"
#include "common/job_config.h"
#include "common/lease_table.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/transport.h"
#include "kernels/kernels.h"
#include "worker/group_comm.h"
#include "worker/kv_client.h"
#include "worker/local_round.h"
#include "worker/model.h"

namespace ps {

struct WorkerOptions {
  // The coordinator's endpoint. Required.
  std::string coordinator;
  // Runs once, on the heartbeat thread, when the job ends under this worker: the
  // coordinator said that the job stops (it got SIGTERM), or it answered no heartbeat for
  // 3 x the job's --heartbeat_timeout plus --coordinator_restart_timeout (it died and was
  // not restarted). ps_worker makes it a SIGTERM to itself (drain, then leave within
  // --drain_timeout_ms). nullptr: nothing happens (the worker's calls time out on their own).
  std::function<void()> on_job_ending;
  // "cpu", "cuda", "cuda:N" (see kernels/kernels.h).
  std::string device = "cpu";
  std::chrono::milliseconds register_timeout{120000};
  // The id a launcher gave this worker; -1: registration order.
  int requested_id = -1;
  // How long a push or pull may take before the step fails. Pulls held by the staleness
  // bound are answered by the server within --staleness_wait_seconds, so this must exceed it.
  std::chrono::milliseconds request_timeout{600000};
  // > 1 makes this worker that many times slower (it sleeps (slowdown - 1) times its compute
  // time each step), so that users and tests can watch what a straggler does.
  double slowdown = 1;
  // This worker's batch size; 0 takes the job's (or, with --batch_size=auto, the
  // coordinator's throughput-following one).
  int batch_size = 0;
  // Where the Prometheus metrics go (common/metrics.h); nullptr: none. Borrowed.
  Metrics* metrics = nullptr;
  // An all-reduce group to join by name (workers of one name on one host form a group);
  // empty follows the job's --group_size.
  std::string group;
  // After `stop` (SIGTERM): how long the whole drain may take (worker_main enforces it);
  // the current chunk is finished when that fits in half of it, else returned.
  std::chrono::milliseconds drain_timeout{10000};
  // A request part not answered within this time is sent again (KVClientOptions).
  std::chrono::milliseconds retry_interval{10000};
  // Pull the next step's parameters while this step computes (see above). Ignored under
  // BSP and for models that cannot prefetch. Off by default: on the default job it adds
  // ~20% examples/s but its extra staleness costs more accuracy per epoch than that buys.
  bool prefetch = false;
  // How pushed gradients travel: "fp32", "bf16" or "fp16" (common/wire_dtype.h).
  std::string wire_dtype = "fp32";
  // How pulled parameters travel: "fp32", "bf16" or "fp16" (rounded on the server, widened
  // here); evaluations pull fp32 whatever this says.
  std::string pull_dtype = "fp32";
};

// The whole life of a worker process.
Status RunWorker(const WorkerOptions& options, Transport* transport, const std::atomic<bool>& stop);

// Where a training loop's progress lines go: the coordinator in a job, a test's sink else.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual Status Report(const nlohmann::json& line) = 0;
};

// The order of the `count` training examples in `epoch` (1-based): the same in every
// process of a job.
std::vector<int64_t> EpochOrder(uint64_t seed, int epoch, int64_t count);

// Where a training loop gets its chunks: the coordinator's lease table in a job, a local
// one (LocalChunkSource) in tests and single-process runs.
class ChunkSource {
 public:
  struct Request {
    uint64_t dataset_size = 0;
    int completed_epoch = 0;  // 0: nothing completed
    uint64_t completed_chunk = 0;
    double examples_per_sec = 0;  // compute throughput, for --batch_size=auto
    bool wait = false;            // block until there is work or every epoch is done
    bool leave = false;           // this worker leaves the job: return what it holds
    int64_t clock = 0;            // the worker's clock (for the coordinator's checkpoint record)
  };
  struct Next {
    enum class Kind { kChunk, kWait, kFinished } kind = Kind::kFinished;
    LeaseTable::Lease lease;
    int batch_size = 0;      // 0: keep the current one
    int evaluate_epoch = 0;  // evaluate the model for this epoch now (worker 0)
  };
  virtual ~ChunkSource() = default;
  virtual Result<Next> Lease(int worker, const Request& request) = 0;
};

// A lease table in this process, shared by the TrainingLoops of its threads. Worker 0 is
// asked to evaluate after each completed epoch but the last. Thread-safe.
class LocalChunkSource final : public ChunkSource {
 public:
  LocalChunkSource(int epochs, uint64_t chunk_examples, int batch_size);
  Result<Next> Lease(int worker, const Request& request) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  LeaseTable table_;          // guarded by mu_
  std::vector<int> to_eval_;  // guarded by mu_
  const int epochs_;
  const int batch_size_;
};

// How one worker's TrainingLoop trains, beyond the job's config.
struct TrainingLoopOptions {
  // The worker's id: its row in the clock tables and the chunk source's leases.
  int worker_id = 0;
  // The device the model computes on, as Totals() reports it (Kernels::DeviceName()).
  std::string device = "cpu";
  // > 1 makes each step that many times slower (WorkerOptions::slowdown).
  double slowdown = 1;
  // This worker's batch size; 0 takes the job's (or the chunk source's). The model's
  // max_batch must cover what the source may ask for.
  int batch_size = 0;
  // Pull the next step's parameters while this step computes (WorkerOptions::prefetch);
  // ignored under BSP, with --local_steps > 1, and for models that cannot prefetch.
  bool prefetch = false;
};

class TrainingLoop {
 public:
  // All pointers are borrowed and must outlive the loop.
  TrainingLoop(const JobConfig& config, const TrainingLoopOptions& options, KVClient* client,
               TrainableModel* model, ProgressSink* sink, ChunkSource* chunks);

  // Whether this loop prefetches: asked for, the model can, and no table is BSP.
  bool prefetching() const { return prefetch_; }

  // Trains on leased chunks until every epoch is done, then leaves the clock table. When
  // `stop` is set, drains instead (see the top of this file): left_job() is then true.
  Status Run(const std::atomic<bool>& stop);
  bool left_job() const { return left_job_; }
  // After `stop`, finish the current chunk if it takes less than this; else return it.
  void set_drain_finish_chunk(std::chrono::milliseconds d) { drain_finish_chunk_ = d; }
  // Starts out of the clock table (a worker that joined a running job).
  void set_joined() { in_clock_table_ = false; }
  // Pulls the current model and evaluates it on the test set: an `eval` metrics line.
  Result<nlohmann::json> Evaluate(int epoch, bool final_eval);
  // examples, steps, seconds, wait_seconds, device, prefetch, step_seconds {compute, pull,
  // push, wait}, pull_wait_ms {p50, p99, max}.
  nlohmann::json Totals() const;
  // Makes this loop the leader of an all-reduce group (worker/group_trainer.h): each step
  // then covers group->size() batches, one per member, and pushes their sum. Borrowed;
  // null: train alone. The clock ticks then say that each clock is the group's batches.
  void SetGroup(GroupComm* group) {
    group_ = group;
    client_->SetBatchesPerClock(group != nullptr ? static_cast<uint32_t>(group->size()) : 1u);
  }
  // Counted into Totals (a member that trained in a group before training alone).
  void AddPriorTotals(int64_t examples, int64_t steps, double seconds) {
    examples_ += examples;
    steps_ += steps;
    prior_seconds_ += seconds;
  }

 private:
  // A group step (group_trainer.cc): the members' batches with this one's, summed.
  Status GroupStep(std::span<const int64_t> examples, uint64_t begin, int epoch, double fraction);
  // Leaves the group after a failure; the step's examples are then trained alone.
  void DissolveGroup(const Status& why);
  // Leader: a control word to the members (kGroupIdle, kGroupFinished).
  void SignalGroup(int64_t command);
  Status PushAndTick();
  Status WaitInFlight();
  // After a step's compute: Aborted, with divergence_ set, when its loss is not finite or a
  // table's gradient is not finite or beyond the servers' limit.
  Status CheckDivergence(const BatchResult& br);
  // Waits for a prefetch in flight, if any (before evaluating, leaving, or finishing).
  Status DrainPrefetch();
  // *finished: false when `stop` cut the chunk short.
  Status TrainChunk(const LeaseTable::Lease& lease, const std::atomic<bool>& stop, bool* finished);
  // Flushes pushes, leaves the clock table and tells the chunk source this worker leaves,
  // reporting the chunk in `request` if it completed one.
  Status LeaveJob(ChunkSource::Request request, int epoch);
  Status TrainStep(std::span<const int64_t> examples, int epoch, double epoch_fraction);
  Status ReportTraining(int epoch, double epoch_fraction, bool force);

  const JobConfig& config_;
  const int worker_id_;
  KVClient* client_;
  TrainableModel* model_;
  ProgressSink* sink_;
  ChunkSource* chunks_;
  const std::string device_;
  const double slowdown_;
  const int fixed_batch_;       // this worker's own batch size; 0: follow the chunk source
  int batch_ = 0;               // the batch size in use
  std::vector<int64_t> order_;  // the current epoch's example order
  int order_epoch_ = 0;
  double compute_seconds_ = 0;     // forward/backward (and --slowdown), for the throughput
  std::vector<Ticket> in_flight_;  // this step's pushes and clock tick
  GroupComm* group_ = nullptr;     // leading an all-reduce group; null: training alone
  bool in_clock_table_ = true;
  bool left_job_ = false;
  // Set when a step's loss or gradient showed that the model diverged (common/divergence.h);
  // Totals() carries it to the coordinator.
  std::optional<Divergence> divergence_;
  std::chrono::milliseconds drain_finish_chunk_{0};
  bool stop_seen_ = false;
  std::chrono::steady_clock::time_point stop_time_;
  uint64_t pushes_lost_ = 0;  // push or tick requests that failed (not acknowledged)
  LocalRound local_;          // --local_steps: the current round of steps between pushes
  bool prefetch_ = false;     // prefetching at all
  bool prefetched_ = false;   // a prefetch for the next step is in flight
  // Step time breakdown (see the top of this file).
  double pull_seconds_ = 0, push_seconds_ = 0, blocked_seconds_ = 0;
  // How long each step blocked on its pull (the round trip, holds included, without
  // prefetch; what the prefetch did not hide, with it), for percentiles in Totals().
  std::vector<float> pull_wait_ms_;

  // Totals and the current report interval.
  std::chrono::steady_clock::time_point start_, last_report_;
  int64_t examples_ = 0;
  int64_t steps_ = 0;
  double seconds_ = 0;
  double prior_seconds_ = 0;  // in a group, before training alone
  double wait_seconds_ = 0;
  BatchResult interval_;
  double interval_wait_ = 0;
  int64_t interval_lag_ = 0;
  KVClientStats stats_at_report_;
};

}  // namespace ps
