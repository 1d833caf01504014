#include "worker/standalone.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/run_files.h"
#include "kernels/kernels.h"
#include "server/lr_policy.h"
#include "server/optimizer.h"
#include "server/table.h"
#include "worker/idx_reader.h"
#include "worker/mlp.h"
#include "worker/trainer.h"

namespace ps {
namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// One `--name=value` (or `--name`, `--noname` for booleans) token.
Status ApplyFlagToken(const std::string& token, const std::string& where,
                      std::map<std::string, std::string>* flags) {
  if (token.rfind("--", 0) != 0 || token.size() < 3) {
    return InvalidArgument(where + ": '" + token + "' is not a --name=value flag");
  }
  const std::string body = token.substr(2);
  const size_t eq = body.find('=');
  if (eq == std::string::npos) {
    // Booleans as gflags writes them.
    if (body.rfind("no", 0) == 0 && body.size() > 2) {
      (*flags)[body.substr(2)] = "false";
    } else {
      (*flags)[body] = "true";
    }
    return Status::Ok();
  }
  (*flags)[body.substr(0, eq)] = body.substr(eq + 1);
  return Status::Ok();
}

Status ReadFlagFile(const std::string& path, int depth, std::map<std::string, std::string>* flags) {
  if (depth > 8) return InvalidArgument("flagfiles nest deeper than 8 at '" + path + "'");
  std::ifstream in(path);
  if (!in) return NotFound("cannot read flagfile '" + path + "'");
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::string token = line.substr(first);
    while (!token.empty() &&
           (token.back() == ' ' || token.back() == '\t' || token.back() == '\r')) {
      token.pop_back();
    }
    const std::string where = path + ":" + std::to_string(number);
    if (token.rfind("--flagfile=", 0) == 0) {
      PS_RETURN_IF_ERROR(ReadFlagFile(token.substr(11), depth + 1, flags));
      continue;
    }
    PS_RETURN_IF_ERROR(ApplyFlagToken(token, where, flags));
  }
  return Status::Ok();
}

// The parameters as the model reads them: a table's rows, which hold optimizer state beside
// the values unless the optimizer has none (then the table's block is used in place).
struct Param {
  Table table;
  std::vector<float> copy;  // values only, when rows carry state
  std::vector<float> grad;
  const float* values() const { return copy.empty() ? table_values : copy.data(); }
  const float* table_values = nullptr;
};

}  // namespace

Status ReadJobFlagFile(const std::string& path, std::map<std::string, std::string>* flags) {
  return ReadFlagFile(path, 0, flags);
}

Status ApplyJobFlagOverrides(const std::string& overrides,
                             std::map<std::string, std::string>* flags) {
  std::istringstream in(overrides);
  std::string token;
  while (in >> token) {
    if (token.rfind("--flagfile=", 0) == 0) {
      PS_RETURN_IF_ERROR(ReadJobFlagFile(token.substr(11), flags));
      continue;
    }
    PS_RETURN_IF_ERROR(ApplyFlagToken(token, "--job_flags", flags));
  }
  return Status::Ok();
}

Status RunStandalone(JobConfig config, const StandaloneOptions& options,
                     const std::atomic<bool>& stop, json* summary_out) {
  const auto wall_start = SteadyClock::now();
  if (config.model != "mlp") {
    return InvalidArgument("--standalone trains --model=mlp; this job's model is '" + config.model +
                           "'");
  }
  if (config.auto_batch) {
    return InvalidArgument("--standalone needs a fixed --batch_size, not auto");
  }
  if (options.run_dir.empty()) return InvalidArgument("--standalone needs a run directory");
  config.num_workers = 1;
  config.num_servers = 1;
  PS_RETURN_IF_ERROR(MakeDirs(options.run_dir));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<MetricsLog> metrics,
                      MetricsLog::Open(options.run_dir + "/metrics.jsonl"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Kernels> kernels, MakeKernels(options.device));
  LOG(INFO) << "standalone on " << kernels->DeviceName() << "; loading " << config.data_dir;
  PS_ASSIGN_OR_RETURN(ImageDataset train, LoadIdxDataset(config.data_dir, "train"));
  PS_ASSIGN_OR_RETURN(ImageDataset test, LoadIdxDataset(config.data_dir, "t10k"));
  PS_ASSIGN_OR_RETURN(std::vector<int> layers, ParseIntList("mlp_layers", config.mlp_layers));
  const size_t dim = static_cast<size_t>(train.rows) * static_cast<size_t>(train.cols);
  if (static_cast<int64_t>(dim) != layers.front()) {
    return InvalidArgument("the data has " + std::to_string(dim) +
                           " inputs per example but --mlp_layers starts with " +
                           std::to_string(layers.front()));
  }
  MlpShape shape{layers};
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> mlp,
                      Mlp::Create(shape, kernels.get(), config.batch_size));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, MakeOptimizer(config));
  PS_ASSIGN_OR_RETURN(LrPolicy lr_policy, LrPolicy::Create(config));

  // Every table whole, initialized as a server initializes the rows it holds.
  std::vector<Param> params;
  params.reserve(config.table_specs.size());
  for (const TableSpec& spec : config.table_specs) {
    const size_t state = optimizer->StateFloats(spec.width);
    PS_ASSIGN_OR_RETURN(Table table,
                        Table::Create(spec, RowRange{0, spec.rows}, config.seed, state));
    params.push_back(Param{std::move(table), {}, {}});
    Param& p = params.back();
    p.grad.assign(spec.rows * spec.width, 0.0f);
    p.table_values = p.table.DenseRow(0);
    if (state > 0) p.copy.assign(spec.rows * spec.width, 0.0f);
  }
  // "Pull": the values out of rows that carry state (nothing to do for plain SGD).
  auto refresh = [&params] {
    for (Param& p : params) {
      if (p.copy.empty()) continue;
      const size_t w = p.table.width();
      for (uint64_t r = 0; r < p.table.spec().rows; ++r) {
        std::memcpy(p.copy.data() + r * w, p.table.DenseRow(r), w * sizeof(float));
      }
    }
  };
  auto const_params = [&params] {
    std::vector<const float*> v;
    for (const Param& p : params) v.push_back(p.values());
    return v;
  };
  json last_eval = json::object();
  auto evaluate = [&](int epoch, bool final_eval) -> Status {
    BatchResult r;
    PS_RETURN_IF_ERROR(mlp->Evaluate(test.pixels.data(), test.labels.data(),
                                     static_cast<int>(test.count), const_params(), &r));
    const double n = static_cast<double>(std::max<int64_t>(1, r.examples));
    json line = {{"kind", "eval"},
                 {"worker", 0},
                 {"epoch", epoch},
                 {"final", final_eval},
                 {"test_examples", r.examples},
                 {"test_loss", r.loss_sum / n},
                 {"test_accuracy", static_cast<double>(r.correct) / n}};
    metrics->Append(line);
    if (options.print_progress) {
      std::printf("epoch %d/%d  test_loss %.4f  test_acc %.4f  %.1fs%s\n", epoch, config.epochs,
                  r.loss_sum / n, static_cast<double>(r.correct) / n, SecondsSince(wall_start),
                  final_eval ? "  (final)" : "");
      std::fflush(stdout);
    }
    last_eval = line;
    return Status::Ok();
  };

  const double train_start_unix = UnixSeconds();
  const auto train_start = SteadyClock::now();
  auto last_report = train_start;
  std::vector<float> x(static_cast<size_t>(config.batch_size) * dim);
  std::vector<int32_t> y(static_cast<size_t>(config.batch_size));
  std::vector<float*> grads;
  for (Param& p : params) grads.push_back(p.grad.data());
  double compute_seconds = 0, apply_seconds = 0, copy_seconds = 0;
  int64_t step = 0, examples = 0;
  BatchResult interval;
  std::vector<uint64_t> per_epoch;
  Status outcome;
  const uint64_t chunk = static_cast<uint64_t>(config.chunk_examples);
  const uint64_t batch = static_cast<uint64_t>(config.batch_size);
  const uint64_t count = static_cast<uint64_t>(train.count);
  float lr = 0;
  for (int epoch = 1; epoch <= config.epochs && outcome.ok(); ++epoch) {
    const std::vector<int64_t> order = EpochOrder(config.seed, epoch, train.count);
    uint64_t seen = 0;
    // Chunks as the lease table cuts them, batches within a chunk as a worker takes them.
    for (uint64_t c = 0; c < count && outcome.ok(); c += chunk) {
      const uint64_t chunk_end = std::min(count, c + chunk);
      for (uint64_t begin = c; begin < chunk_end; begin += batch) {
        if (stop.load()) {
          outcome = Aborted("stopped by signal");
          break;
        }
        const uint64_t n = std::min(batch, chunk_end - begin);
        auto t0 = SteadyClock::now();
        for (uint64_t i = 0; i < n; ++i) {
          const size_t e = static_cast<size_t>(order[begin + i]);
          std::memcpy(x.data() + i * dim, train.pixels.data() + e * dim, dim * sizeof(float));
          y[i] = train.labels[e];
        }
        BatchResult br;
        outcome = mlp->ForwardBackward(x.data(), y.data(), static_cast<int>(n), const_params(),
                                       grads, &br);
        if (!outcome.ok()) break;
        const float scale = static_cast<float>(n) / static_cast<float>(config.batch_size);
        if (scale != 1.0f) {
          for (Param& p : params) {
            for (float& g : p.grad) g *= scale;
          }
        }
        auto t1 = SteadyClock::now();
        compute_seconds += std::chrono::duration<double>(t1 - t0).count();
        // The server's update: every gradient checked, then each row through the optimizer
        // at the schedule's rate for this step (a fresh gradient: staleness 0).
        for (const Param& p : params) {
          // Branch-free, as the server checks (NaN fails the comparison).
          bool bad = false;
          for (float g : p.grad) bad |= !(std::fabs(g) <= 1e18f);
          if (bad) {
            outcome = InvalidArgument("step " + std::to_string(step) + " of table '" +
                                      p.table.spec().name +
                                      "' has a NaN, Inf or huge gradient: the model diverged");
            break;
          }
        }
        if (!outcome.ok()) break;
        lr = static_cast<float>(lr_policy.Rate(step, 0));
        for (Param& p : params) {
          const size_t w = p.table.width();
          const size_t state = p.table.stride() - w;
          const std::span<const float> g(p.grad);
          for (uint64_t r = 0; r < p.table.spec().rows; ++r) {
            float* row = p.table.DenseRow(r);
            optimizer->Apply(std::span<float>(row, w), std::span<float>(row + w, state),
                             g.subspan(r * w, w), lr);
          }
        }
        auto t2 = SteadyClock::now();
        apply_seconds += std::chrono::duration<double>(t2 - t1).count();
        refresh();
        copy_seconds += SecondsSince(t2);
        ++step;
        examples += static_cast<int64_t>(n);
        seen += n;
        interval.loss_sum += br.loss_sum;
        interval.correct += br.correct;
        interval.examples += br.examples;
        const double dt = SecondsSince(last_report);
        const bool last = begin + n >= count;
        if (interval.examples > 0 && (dt >= config.report_every_seconds || last)) {
          metrics->Append({{"kind", "train"},
                           {"worker", 0},
                           {"epoch", epoch},
                           {"epoch_fraction", static_cast<double>(begin + n) / count},
                           {"step", step},
                           {"clock", step},
                           {"examples", interval.examples},
                           {"loss", interval.loss_sum / interval.examples},
                           {"accuracy", static_cast<double>(interval.correct) / interval.examples},
                           {"examples_per_sec", interval.examples / dt},
                           {"wait_seconds", 0.0},
                           {"clock_lag_max", 0},
                           {"staleness_mean", 0.0},
                           {"lr", lr}});
          interval = BatchResult();
          last_report = SteadyClock::now();
        }
      }
    }
    per_epoch.push_back(seen);
    if (outcome.ok()) {
      // As a job: worker 0 evaluates after each epoch but the last, then the final model.
      outcome = evaluate(epoch, epoch == config.epochs);
    }
  }
  const double train_seconds = SecondsSince(train_start);

  json s;
  s["mode"] = "standalone";
  s["status"] = outcome.ok() ? "ok" : "failed";
  if (!outcome.ok()) s["error"] = outcome.ToString();
  s["test_accuracy"] = last_eval.value("test_accuracy", 0.0);
  s["test_loss"] = last_eval.value("test_loss", 0.0);
  s["epochs"] = config.epochs;
  s["wall_seconds"] = SecondsSince(wall_start);
  s["train_seconds"] = train_seconds;
  s["train_start_time"] = train_start_unix;
  s["examples"] = examples;
  s["examples_per_epoch"] = per_epoch;
  s["batch_size"] = config.batch_size;
  s["examples_per_sec"] = train_seconds > 0 ? examples / train_seconds : 0.0;
  s["pushes_applied"] = step * static_cast<int64_t>(params.size());
  s["pushes_rejected"] = 0;
  s["pushes_dropped"] = 0;
  s["pulls_held"] = 0;
  s["bytes_pushed"] = 0;
  s["bytes_pulled"] = 0;
  s["staleness"] = config.staleness;
  s["max_clock_lag_seen"] = 0;
  s["max_staleness_seen"] = 0;
  s["mean_staleness"] = 0.0;
  s["p99_staleness"] = 0;
  s["wait_seconds"] = 0.0;
  // In one process there is no pull or push: `pull` is copying values out of rows that
  // carry optimizer state, `push` is applying the update (the servers' work in a job).
  s["workers"] =
      json::array({{{"id", 0},
                    {"device", kernels->DeviceName()},
                    {"host", "localhost"},
                    {"examples", examples},
                    {"steps", step},
                    {"seconds", train_seconds},
                    {"wait_seconds", 0.0},
                    {"compute_seconds", compute_seconds},
                    {"batch_size", config.batch_size},
                    {"examples_per_sec", train_seconds > 0 ? examples / train_seconds : 0.0},
                    {"failed", !outcome.ok()},
                    {"step_seconds",
                     {{"compute", compute_seconds},
                      {"pull", copy_seconds},
                      {"push", apply_seconds},
                      {"wait", 0.0}}}}});
  s["servers"] = json::array();
  s["config"] = config.ToFlagMap();
  PS_RETURN_IF_ERROR(WriteJsonFile(options.run_dir + "/summary.json", s));
  if (summary_out != nullptr) *summary_out = s;
  if (options.print_progress) {
    std::printf("done: test_acc %.4f  test_loss %.4f  %.0f ex/s  %.1fs wall -> %s/summary.json\n",
                s["test_accuracy"].get<double>(), s["test_loss"].get<double>(),
                s["examples_per_sec"].get<double>(), s["wall_seconds"].get<double>(),
                options.run_dir.c_str());
    std::fflush(stdout);
  }
  return outcome;
}

}  // namespace ps
