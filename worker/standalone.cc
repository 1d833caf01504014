#include "worker/standalone.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/gradient_check.h"
#include "common/lr_policy.h"
#include "common/optimizer.h"
#include "common/row_init.h"
#include "common/run_files.h"
#include "common/run_summary.h"
#include "kernels/kernels.h"
#include "worker/idx_reader.h"
#include "worker/network.h"
#include "worker/trainer.h"

namespace ps {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// One table held whole, as the one server of a one-server job holds it: every row is its
// values followed by the optimizer's state (common/row_init.h). All three buffers are in
// the kernels' memory (the GPU's with --device=cuda), so that a step copies nothing but
// its batch. The model reads the values from the rows themselves unless they carry state;
// then from `copy`, refreshed after each update (the "pull").
struct Param {
  TableSpec spec;
  int rows = 0;
  int width = 0;
  int stride = 0;
  DeviceBuffer<float> table;  // rows x stride floats
  DeviceBuffer<float> copy;   // rows x width: the values only, when rows carry state
  DeviceBuffer<float> grad;   // rows x width
  bool has_state() const { return stride > width; }
  size_t grad_floats() const { return static_cast<size_t>(rows) * static_cast<size_t>(width); }
  const float* values() const { return has_state() ? copy.get() : table.get(); }
};

// What a run measured, for the train lines and summary.json.
struct RunStats {
  int64_t steps = 0;
  int64_t examples = 0;
  std::vector<uint64_t> examples_per_epoch;
  double compute_seconds = 0;
  double apply_seconds = 0;
  double copy_seconds = 0;  // refreshing `copy` from rows with state
  double train_start_unix = 0;
  double train_seconds = 0;
  json last_eval = json::object();  // the last eval line written
};

// One batch of the training order: examples order[begin, begin + n) of the epoch.
struct Batch {
  int epoch = 0;
  uint64_t begin = 0;
  uint64_t n = 0;
};

Status CheckStandaloneJob(const JobConfig& config, const StandaloneOptions& options) {
  if (config.model != "mlp" && config.model != "network") {
    return InvalidArgument("--standalone trains --model=mlp or network; this job's model is '" +
                           config.model + "'");
  }
  if (config.auto_batch) {
    return InvalidArgument("--standalone needs a fixed --batch_size, not auto");
  }
  if (options.run_dir.empty()) return InvalidArgument("--standalone needs a run directory");
  return Status::Ok();
}

// The run: Open, then Train, then WriteSummary (whatever Train returned).
class StandaloneRun {
 public:
  StandaloneRun(JobConfig config, const StandaloneOptions& options, const std::atomic<bool>& stop)
      : config_(std::move(config)), options_(options), stop_(stop) {}

  // Creates the run directory and metrics log, loads the data, builds the model and the
  // tables with their initial rows.
  Status Open();
  Status CreateModel();  // net_, for the data loaded
  // Every epoch, each followed by an evaluation; the first error stops it.
  Status Train();
  // summary.json (and *summary_out, may be null) for a run that ended with `outcome`.
  Status WriteSummary(const Status& outcome, json* summary_out);

 private:
  Status BuildTables();
  Status TrainEpoch(int epoch);
  Status Step(const Batch& batch, BatchResult* result);
  Status ComputeGradients(const Batch& batch, BatchResult* result);
  Status CheckGradientsOfStep();
  Status ApplyUpdate();
  Status RefreshValues();
  std::vector<const float*> Values() const;
  Status Evaluate(int epoch, bool final_eval);
  void AppendTrainLine(const Batch& batch, double seconds);

  JobConfig config_;
  const StandaloneOptions& options_;
  const std::atomic<bool>& stop_;
  const SteadyClock::time_point wall_start_ = SteadyClock::now();
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Kernels> kernels_;
  ImageDataset train_;
  ImageDataset test_;
  size_t dim_ = 0;  // floats per example
  // The model: the --network, or the MLP's (--model=mlp).
  std::unique_ptr<Network> net_;
  UpdateRule rule_;
  std::optional<LrPolicy> lr_policy_;
  std::vector<Param> params_;
  std::vector<float*> grads_;
  DeviceBuffer<int32_t> bad_gradient_;  // FlagOutOfRange's flag for a step's gradients
  std::vector<float> x_;
  std::vector<int32_t> y_;
  float lr_ = 0;          // the last step's learning rate
  BatchResult interval_;  // since the last train line
  SteadyClock::time_point last_report_;
  RunStats stats_;
};

Status StandaloneRun::Open() {
  PS_RETURN_IF_ERROR(MakeDirs(options_.run_dir));
  PS_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(options_.run_dir + "/metrics.jsonl"));
  PS_ASSIGN_OR_RETURN(kernels_, MakeKernels(options_.device));
  LOG(INFO) << "standalone on " << kernels_->DeviceName() << "; loading " << config_.data_dir;
  PS_ASSIGN_OR_RETURN(train_, LoadIdxDatasetCached(config_.data_dir, "train"));
  PS_ASSIGN_OR_RETURN(test_, LoadIdxDatasetCached(config_.data_dir, "t10k"));
  dim_ = static_cast<size_t>(train_.rows) * static_cast<size_t>(train_.cols);
  PS_RETURN_IF_ERROR(CreateModel());
  PS_ASSIGN_OR_RETURN(rule_, MakeUpdateRule(config_));
  config_.SetWholeJobMaxIter(static_cast<uint64_t>(train_.count));  // as the coordinator does
  PS_ASSIGN_OR_RETURN(LrPolicy lr_policy, LrPolicy::Create(config_));
  lr_policy_.emplace(std::move(lr_policy));
  x_.resize(static_cast<size_t>(config_.batch_size) * dim_);
  y_.resize(static_cast<size_t>(config_.batch_size));
  return BuildTables();
}

Status StandaloneRun::CreateModel() {
  PS_ASSIGN_OR_RETURN(NetworkSpec spec, JobNetwork(config_));
  PS_RETURN_IF_ERROR(
      CheckNetworkInput(config_, spec, static_cast<int64_t>(dim_),
                        std::to_string(train_.rows) + "x" + std::to_string(train_.cols)));
  PS_ASSIGN_OR_RETURN(net_,
                      Network::Create(spec, kernels_.get(), config_.batch_size, config_.seed));
  return Status::Ok();
}

// Every table whole, initialized as a server initializes the rows it holds, then moved
// into the kernels' memory.
Status StandaloneRun::BuildTables() {
  params_.reserve(config_.table_specs.size());
  for (const TableSpec& spec : config_.table_specs) {
    if (!spec.dense()) {
      return InvalidArgument("--standalone holds dense tables only; '" + spec.name + "' is sparse");
    }
    const size_t stride = spec.width + rule_.StateFloats(spec.width);
    if (spec.rows > INT_MAX || stride > INT_MAX) {
      const std::string limit =
          "--standalone holds tables of fewer than 2^31 rows of fewer "
          "than 2^31 floats; '";
      return InvalidArgument(limit + spec.name + "' has " + std::to_string(spec.rows) +
                             " rows of " + std::to_string(stride));
    }
    Param& p = params_.emplace_back();
    p.spec = spec;
    p.rows = static_cast<int>(spec.rows);
    p.width = static_cast<int>(spec.width);
    p.stride = static_cast<int>(stride);
    std::vector<float> rows(spec.rows * stride);
    InitializeRows(spec, config_.seed, 0, stride, rows);
    PS_ASSIGN_OR_RETURN(p.table, DeviceBuffer<float>::Make(kernels_.get(), rows.size()));
    PS_RETURN_IF_ERROR(
        kernels_->CopyToDevice(p.table.get(), rows.data(), rows.size() * sizeof(float)));
    PS_ASSIGN_OR_RETURN(p.grad, DeviceBuffer<float>::Make(kernels_.get(), p.grad_floats()));
    if (p.has_state()) {
      PS_ASSIGN_OR_RETURN(p.copy, DeviceBuffer<float>::Make(kernels_.get(), p.grad_floats()));
    }
  }
  for (Param& p : params_) grads_.push_back(p.grad.get());
  PS_ASSIGN_OR_RETURN(bad_gradient_, DeviceBuffer<int32_t>::Make(kernels_.get(), 1));
  const int32_t no_bad_gradient = 0;
  PS_RETURN_IF_ERROR(
      kernels_->CopyToDevice(bad_gradient_.get(), &no_bad_gradient, sizeof(no_bad_gradient)));
  return RefreshValues();
}

std::vector<const float*> StandaloneRun::Values() const {
  std::vector<const float*> v;
  for (const Param& p : params_) v.push_back(p.values());
  return v;
}

// The "pull": the values out of rows that carry state (nothing to do for plain SGD).
Status StandaloneRun::RefreshValues() {
  for (Param& p : params_) {
    if (!p.has_state()) continue;
    PS_RETURN_IF_ERROR(
        kernels_->Copy2d(p.rows, p.width, p.table.get(), p.stride, p.copy.get(), p.width));
  }
  return Status::Ok();
}

Status StandaloneRun::Train() {
  stats_.train_start_unix = UnixSeconds();
  const auto train_start = SteadyClock::now();
  last_report_ = train_start;
  Status outcome;
  for (int epoch = 1; epoch <= config_.epochs && outcome.ok(); ++epoch) {
    outcome = TrainEpoch(epoch);
    if (outcome.ok()) {
      // As a job: worker 0 evaluates after each epoch but the last, then the final model.
      outcome = Evaluate(epoch, epoch == config_.epochs);
    }
  }
  stats_.train_seconds = SecondsSince(train_start);
  return outcome;
}

Status StandaloneRun::TrainEpoch(int epoch) {
  const std::vector<int64_t> order = EpochOrder(config_.seed, epoch, train_.count);
  const uint64_t chunk = static_cast<uint64_t>(config_.chunk_examples);
  const uint64_t batch = static_cast<uint64_t>(config_.batch_size);
  const uint64_t count = static_cast<uint64_t>(train_.count);
  uint64_t seen = 0;
  Status outcome;
  // Chunks as the lease table cuts them, batches within a chunk as a worker takes them.
  for (uint64_t c = 0; c < count && outcome.ok(); c += chunk) {
    const uint64_t chunk_end = std::min(count, c + chunk);
    for (uint64_t begin = c; begin < chunk_end; begin += batch) {
      if (stop_.load()) {
        outcome = Aborted("stopped by signal");
        break;
      }
      const Batch b{epoch, begin, std::min(batch, chunk_end - begin)};
      for (uint64_t i = 0; i < b.n; ++i) {
        const size_t e = static_cast<size_t>(order[begin + i]);
        std::memcpy(x_.data() + i * dim_, train_.pixels.data() + e * dim_, dim_ * sizeof(float));
        y_[i] = train_.labels[e];
      }
      BatchResult result;
      outcome = Step(b, &result);
      if (!outcome.ok()) break;
      seen += b.n;
      interval_.loss_sum += result.loss_sum;
      interval_.correct += result.correct;
      interval_.examples += result.examples;
      const double dt = SecondsSince(last_report_);
      const bool last = begin + b.n >= count;
      if (interval_.examples > 0 && (dt >= config_.report_every_seconds || last)) {
        AppendTrainLine(b, dt);
        interval_ = BatchResult();
        last_report_ = SteadyClock::now();
      }
    }
  }
  stats_.examples_per_epoch.push_back(seen);
  return outcome;
}

// One step on the batch in x_, y_: gradients, the servers' update, the "pull".
Status StandaloneRun::Step(const Batch& batch, BatchResult* result) {
  const auto t0 = SteadyClock::now();
  PS_RETURN_IF_ERROR(ComputeGradients(batch, result));
  const auto t1 = SteadyClock::now();
  stats_.compute_seconds += std::chrono::duration<double>(t1 - t0).count();
  PS_RETURN_IF_ERROR(ApplyUpdate());
  const auto t2 = SteadyClock::now();
  stats_.apply_seconds += std::chrono::duration<double>(t2 - t1).count();
  PS_RETURN_IF_ERROR(RefreshValues());
  stats_.copy_seconds += SecondsSince(t2);
  ++stats_.steps;
  stats_.examples += static_cast<int64_t>(batch.n);
  return Status::Ok();
}

// The batch's mean gradient, scaled as a worker scales a short batch's.
Status StandaloneRun::ComputeGradients(const Batch& batch, BatchResult* result) {
  const int n = static_cast<int>(batch.n);
  PS_RETURN_IF_ERROR(net_->ForwardBackward(x_.data(), y_.data(), n, Values(), grads_, result,
                                           TensorHome::kKernels));
  const float scale = static_cast<float>(batch.n) / static_cast<float>(config_.batch_size);
  if (scale != 1.0f) {
    for (Param& p : params_)
      PS_RETURN_IF_ERROR(kernels_->Scale(p.grad_floats(), scale, p.grad.get()));
  }
  return Status::Ok();
}

// The servers' check of every gradient (common/gradient_check.h), as one flag for the whole
// step read back from the kernels' memory; only a step that raised it looks for the value
// to name, table by table, on the host.
Status StandaloneRun::CheckGradientsOfStep() {
  // The flag was zeroed once (BuildTables): once raised, the run stops.
  for (const Param& p : params_) {
    PS_RETURN_IF_ERROR(kernels_->FlagOutOfRange(p.grad_floats(), p.grad.get(), kMaxAbsGradient,
                                                bad_gradient_.get()));
  }
  int32_t bad = 0;
  PS_RETURN_IF_ERROR(kernels_->CopyToHost(&bad, bad_gradient_.get(), sizeof(bad)));
  if (bad == 0) return Status::Ok();
  for (const Param& p : params_) {
    std::vector<float> grad(p.grad_floats());
    PS_RETURN_IF_ERROR(
        kernels_->CopyToHost(grad.data(), p.grad.get(), grad.size() * sizeof(float)));
    if (Status s = CheckGradients(grad); !s.ok()) {
      return InvalidArgument("step " + std::to_string(stats_.steps) + " of table '" + p.spec.name +
                             "' has " + s.message() + ": the model diverged");
    }
  }
  return Internal("a gradient of step " + std::to_string(stats_.steps) +
                  " was flagged out of range, but no table holds one");
}

// The server's update: every gradient checked, then each row through the servers' rule
// (Kernels::ApplyUpdate) at the schedule's rate for this step (a fresh gradient: staleness 0).
Status StandaloneRun::ApplyUpdate() {
  PS_RETURN_IF_ERROR(CheckGradientsOfStep());
  lr_ = static_cast<float>(lr_policy_->Rate(stats_.steps, 0));
  for (Param& p : params_) {
    PS_RETURN_IF_ERROR(
        kernels_->ApplyUpdate(rule_, lr_, p.rows, p.width, p.stride, p.table.get(), p.grad.get()));
  }
  return Status::Ok();
}

Status StandaloneRun::Evaluate(int epoch, bool final_eval) {
  BatchResult r;
  const int n_test = static_cast<int>(test_.count);
  PS_RETURN_IF_ERROR(net_->Evaluate(test_.pixels.data(), test_.labels.data(), n_test, Values(), &r,
                                    TensorHome::kKernels));
  const double n = static_cast<double>(std::max<int64_t>(1, r.examples));
  EvalLine eval;
  eval.worker = 0;
  eval.epoch = epoch;
  eval.final = final_eval;
  eval.test_examples = r.examples;
  eval.test_loss = r.loss_sum / n;
  eval.test_accuracy = static_cast<double>(r.correct) / n;
  const json line = eval.ToJson();
  metrics_->Append(line);
  if (options_.print_progress) {
    std::printf("epoch %d/%d  test_loss %.4f  test_acc %.4f  %.1fs%s\n", epoch, config_.epochs,
                r.loss_sum / n, static_cast<double>(r.correct) / n, SecondsSince(wall_start_),
                final_eval ? "  (final)" : "");
    std::fflush(stdout);
  }
  stats_.last_eval = line;
  return Status::Ok();
}

// A train line of metrics.jsonl for the steps since the last one (`seconds` ago), with the
// keys a job's worker reports.
void StandaloneRun::AppendTrainLine(const Batch& batch, double seconds) {
  const double examples = static_cast<double>(interval_.examples);
  TrainLine line;
  line.worker = 0;
  line.epoch = batch.epoch;
  line.epoch_fraction =
      static_cast<double>(batch.begin + batch.n) / static_cast<double>(train_.count);
  line.step = stats_.steps;
  line.clock = stats_.steps;
  line.examples = interval_.examples;
  line.loss = interval_.loss_sum / examples;
  line.accuracy = static_cast<double>(interval_.correct) / examples;
  line.examples_per_sec = examples / seconds;
  line.lr = lr_;
  metrics_->Append(line.ToJson());
}

Status StandaloneRun::WriteSummary(const Status& outcome, json* summary_out) {
  const RunStats& st = stats_;
  const double examples_per_sec = st.train_seconds > 0 ? st.examples / st.train_seconds : 0.0;
  RunSummary r;
  r.mode = "standalone";
  r.ok = outcome.ok();
  if (!outcome.ok()) r.error = outcome.ToString();
  r.test_accuracy = st.last_eval.value("test_accuracy", 0.0);
  r.test_loss = st.last_eval.value("test_loss", 0.0);
  r.epochs = config_.epochs;
  r.wall_seconds = SecondsSince(wall_start_);
  r.train_seconds = st.train_seconds;
  r.train_start_time = st.train_start_unix;
  r.examples = st.examples;
  r.examples_per_epoch = st.examples_per_epoch;
  r.batch_size = config_.batch_size;
  r.examples_per_sec = examples_per_sec;
  r.pushes_applied = st.steps * static_cast<int64_t>(params_.size());
  r.staleness = config_.staleness;
  WorkerSummary w;
  w.device = kernels_->DeviceName();
  w.host = "localhost";
  w.examples = st.examples;
  w.steps = st.steps;
  w.seconds = st.train_seconds;
  w.compute_seconds = st.compute_seconds;
  w.batch_size = config_.batch_size;
  w.examples_per_sec = examples_per_sec;
  w.failed = !outcome.ok();
  // In one process there is no pull or push: `pull` is copying values out of rows that
  // carry optimizer state, `push` is applying the update (the servers' work in a job).
  w.step_seconds = std::map<std::string, double>{{"compute", st.compute_seconds},
                                                 {"pull", st.copy_seconds},
                                                 {"push", st.apply_seconds},
                                                 {"wait", 0.0}};
  r.workers.push_back(std::move(w));
  r.config = config_.ToFlagMap();
  const json s = r.ToJson();
  PS_RETURN_IF_ERROR(WriteJsonFile(options_.run_dir + "/summary.json", s));
  if (summary_out != nullptr) *summary_out = s;
  if (options_.print_progress) {
    std::printf("done: test_acc %.4f  test_loss %.4f  %.0f ex/s  %.1fs wall -> %s/summary.json\n",
                s["test_accuracy"].get<double>(), s["test_loss"].get<double>(), examples_per_sec,
                s["wall_seconds"].get<double>(), options_.run_dir.c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace

Status RunStandalone(JobConfig config, const StandaloneOptions& options,
                     const std::atomic<bool>& stop, json* summary_out) {
  PS_RETURN_IF_ERROR(CheckStandaloneJob(config, options));
  PS_RETURN_IF_ERROR(config.SetNumWorkers(1));
  config.num_servers = 1;
  StandaloneRun run(std::move(config), options, stop);
  PS_RETURN_IF_ERROR(run.Open());
  const Status outcome = run.Train();
  PS_RETURN_IF_ERROR(run.WriteSummary(outcome, summary_out));
  return outcome;
}

}  // namespace ps
