#include "worker/trainer.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include <glog/logging.h>
#include <kj/exception.h>
#include <nlohmann/json.hpp>

#include "common/registration.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "kernels/kernels.h"
#include "worker/idx_reader.h"
#include "worker/kv_client.h"
#include "worker/mlp.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;
using nlohmann::json;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Sends one JSON report (or done) to the coordinator and waits for the answer.
Status SendReport(ClientSocket& coordinator, int worker_id, const json& report) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, 1, worker_id).getBody().initReport().setJson(report.dump());
  Frames f;
  f.push_back(EncodeFrame(b));
  return Call(coordinator, std::move(f), std::chrono::seconds(60)).status();
}

// Tells the coordinator this worker is done and waits until every worker is (the barrier
// before the final evaluation).
Status SendDone(ClientSocket& coordinator, int worker_id, const json& totals, const Status& outcome,
                const std::atomic<bool>& stop) {
  capnp::MallocMessageBuilder b;
  auto done = NewHeader(b, 2, worker_id).getBody().initDone();
  done.setJson(totals.dump());
  done.setFailed(!outcome.ok());
  done.setMessage(outcome.ToString());
  Frames f;
  f.push_back(EncodeFrame(b));
  PS_RETURN_IF_ERROR(coordinator.Send(std::move(f)));
  while (!stop.load()) {
    Result<Frames> reply = coordinator.Recv(std::chrono::milliseconds(500));
    if (!reply.ok()) {
      if (reply.status().code() == StatusCode::kDeadlineExceeded) continue;
      return reply.status();
    }
    return Status::Ok();
  }
  return Aborted("stopped while waiting for the other workers");
}

class Training {
 public:
  Training(Registration& reg, Kernels* kernels, KVClient* client, Mlp* mlp,
           const ImageDataset& train, const ImageDataset& test)
      : reg_(reg), config_(reg.config), kernels_(kernels), client_(client), mlp_(mlp),
        train_(train), test_(test) {
    for (size_t i = 0; i < num_tables(); ++i) {
      const TableSpec& t = config_.table_specs[i];
      params_.emplace_back(t.rows * t.width);
      grads_.emplace_back(t.rows * t.width);
    }
  }

  size_t num_tables() const { return config_.table_specs.size(); }

  Status PullAll() {
    std::vector<Ticket> tickets;
    for (size_t i = 0; i < num_tables(); ++i) {
      const TableSpec& t = config_.table_specs[i];
      tickets.push_back(client_->PullRange(t.id, RowRange{0, t.rows}, params_[i]));
    }
    Status first;
    for (Ticket t : tickets) {
      Status s = client_->Wait(t);
      if (first.ok()) first = s;
    }
    return first;
  }

  Status PushAll() {
    PS_RETURN_IF_ERROR(WaitPushes());
    for (size_t i = 0; i < num_tables(); ++i) {
      const TableSpec& t = config_.table_specs[i];
      push_tickets_.push_back(client_->PushRange(t.id, RowRange{0, t.rows}, grads_[i]));
    }
    return Status::Ok();
  }

  Status WaitPushes() {
    Status first;
    for (Ticket t : push_tickets_) {
      Status s = client_->Wait(t);
      if (first.ok()) first = s;
    }
    push_tickets_.clear();
    return first;
  }

  Result<BatchResult> Evaluate() {
    PS_RETURN_IF_ERROR(WaitPushes());
    PS_RETURN_IF_ERROR(PullAll());
    BatchResult r;
    PS_RETURN_IF_ERROR(mlp_->Evaluate(test_.pixels.data(), test_.labels.data(),
                                      static_cast<int>(test_.count), ConstParams(), &r));
    return r;
  }

  std::vector<const float*> ConstParams() const {
    std::vector<const float*> p;
    for (const auto& v : params_) p.push_back(v.data());
    return p;
  }

  Status Run(const std::atomic<bool>& stop) {
    const int W = config_.num_workers;
    const int r = reg_.id;
    const size_t dim = static_cast<size_t>(train_.rows) * static_cast<size_t>(train_.cols);
    const int B = config_.batch_size;
    std::vector<float> x(static_cast<size_t>(B) * dim);
    std::vector<int32_t> y(static_cast<size_t>(B));
    std::vector<float*> grad_ptrs;
    for (auto& g : grads_) grad_ptrs.push_back(g.data());

    start_ = SteadyClock::now();
    auto last_report = SteadyClock::now();
    BatchResult since_report;
    int64_t step = 0;
    for (int epoch = 1; epoch <= config_.epochs; ++epoch) {
      std::vector<int64_t> order(static_cast<size_t>(train_.count));
      std::iota(order.begin(), order.end(), 0);
      std::mt19937_64 rng(HashKey(config_.seed, 0xda7a, static_cast<uint64_t>(epoch)));
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int64_t> mine;
      for (size_t i = static_cast<size_t>(r); i < order.size(); i += static_cast<size_t>(W)) {
        mine.push_back(order[i]);
      }
      for (size_t begin = 0; begin < mine.size(); begin += static_cast<size_t>(B)) {
        if (stop.load()) return Aborted("stopped by signal");
        const int n = static_cast<int>(std::min<size_t>(B, mine.size() - begin));
        for (int i = 0; i < n; ++i) {
          const int64_t e = mine[begin + static_cast<size_t>(i)];
          std::copy_n(train_.pixels.data() + static_cast<size_t>(e) * dim, dim,
                      x.data() + static_cast<size_t>(i) * dim);
          y[static_cast<size_t>(i)] = train_.labels[static_cast<size_t>(e)];
        }
        PS_RETURN_IF_ERROR(PullAll());
        BatchResult br;
        PS_RETURN_IF_ERROR(
            mlp_->ForwardBackward(x.data(), y.data(), n, ConstParams(), grad_ptrs, &br));
        PS_RETURN_IF_ERROR(PushAll());
        ++step;
        examples_ += n;
        since_report.loss_sum += br.loss_sum;
        since_report.correct += br.correct;
        since_report.examples += br.examples;
        double dt = SecondsSince(last_report);
        if (dt >= config_.report_every_seconds) {
          json rep = {{"kind", "train"},
                      {"epoch", epoch},
                      {"step", step},
                      {"examples", since_report.examples},
                      {"loss", since_report.loss_sum / std::max<int64_t>(1, since_report.examples)},
                      {"accuracy", static_cast<double>(since_report.correct) /
                                       std::max<int64_t>(1, since_report.examples)},
                      {"examples_per_sec", since_report.examples / dt},
                      {"epoch_fraction", static_cast<double>(begin + n) / mine.size()}};
          PS_RETURN_IF_ERROR(SendReport(*reg_.coordinator, r, rep));
          since_report = BatchResult();
          last_report = SteadyClock::now();
        }
      }
      if (since_report.examples > 0) {
        json rep = {{"kind", "train"},
                    {"epoch", epoch},
                    {"step", step},
                    {"examples", since_report.examples},
                    {"loss", since_report.loss_sum / since_report.examples},
                    {"accuracy", static_cast<double>(since_report.correct) / since_report.examples},
                    {"examples_per_sec", since_report.examples / SecondsSince(last_report)},
                    {"epoch_fraction", 1.0}};
        PS_RETURN_IF_ERROR(SendReport(*reg_.coordinator, r, rep));
        since_report = BatchResult();
        last_report = SteadyClock::now();
      }
      if (r == 0 && epoch < config_.epochs) {
        PS_ASSIGN_OR_RETURN(BatchResult ev, Evaluate());
        PS_RETURN_IF_ERROR(SendReport(*reg_.coordinator, r, EvalReport(epoch, ev, false)));
      }
    }
    PS_RETURN_IF_ERROR(WaitPushes());
    seconds_ = SecondsSince(start_);
    return Status::Ok();
  }

  Status FinalEvaluation() {
    PS_ASSIGN_OR_RETURN(BatchResult ev, Evaluate());
    return SendReport(*reg_.coordinator, reg_.id, EvalReport(config_.epochs, ev, true));
  }

  static json EvalReport(int epoch, const BatchResult& ev, bool final_eval) {
    return {{"kind", "eval"},
            {"epoch", epoch},
            {"final", final_eval},
            {"test_examples", ev.examples},
            {"test_loss", ev.loss_sum / std::max<int64_t>(1, ev.examples)},
            {"test_accuracy", static_cast<double>(ev.correct) / std::max<int64_t>(1, ev.examples)}};
  }

  json Totals() const {
    return {{"examples", examples_}, {"device", kernels_->DeviceName()}, {"seconds", seconds_}};
  }

 private:
  Registration& reg_;
  const JobConfig& config_;
  Kernels* kernels_;
  KVClient* client_;
  Mlp* mlp_;
  const ImageDataset& train_;
  const ImageDataset& test_;
  std::vector<std::vector<float>> params_, grads_;
  std::vector<Ticket> push_tickets_;
  SteadyClock::time_point start_;
  int64_t examples_ = 0;
  double seconds_ = 0;
};

// Everything after registration; its error is reported to the coordinator by the caller.
Status Train(Registration& reg, Kernels* kernels, const WorkerOptions& options,
             Transport* transport, const std::atomic<bool>& stop, json* totals, bool* done_sent) {
  const JobConfig& config = reg.config;
  if (config.model != "mlp") {
    return InvalidArgument("ps_worker trains --model=mlp; this job's model is '" + config.model +
                           "'");
  }
  PS_ASSIGN_OR_RETURN(std::vector<int> layers, ParseIntList("mlp_layers", config.mlp_layers));
  MlpShape shape{layers};
  std::vector<size_t> sizes = MlpParamSizes(shape);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const TableSpec& t = config.table_specs[i];
    if (sizes[i] != t.rows * t.width) {
      return Internal("table '" + t.name + "' does not match the MLP's parameter " +
                      std::to_string(i));
    }
  }
  LOG(INFO) << "worker " << reg.id << ": loading " << config.data_dir;
  PS_ASSIGN_OR_RETURN(ImageDataset train, LoadIdxDataset(config.data_dir, "train"));
  PS_ASSIGN_OR_RETURN(ImageDataset test, LoadIdxDataset(config.data_dir, "t10k"));
  if (static_cast<int64_t>(train.rows) * train.cols != layers.front()) {
    return InvalidArgument("the data has " + std::to_string(train.rows * train.cols) +
                           " inputs per example but --mlp_layers starts with " +
                           std::to_string(layers.front()));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> mlp, Mlp::Create(shape, kernels, config.batch_size));
  KVClientOptions copt;
  copt.client_id = reg.id;
  copt.request_timeout = options.request_timeout;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KVClient> client,
                      KVClient::Create(transport, config, reg.server_endpoints, copt));
  Training training(reg, kernels, client.get(), mlp.get(), train, test);
  Status s = training.Run(stop);
  *totals = training.Totals();
  if (!s.ok()) return s;
  *done_sent = true;
  PS_RETURN_IF_ERROR(SendDone(*reg.coordinator, reg.id, *totals, Status::Ok(), stop));
  if (reg.id == 0) PS_RETURN_IF_ERROR(training.FinalEvaluation());
  KVClientStats cs = client->stats();
  LOG(INFO) << "worker " << reg.id << " done: pushes " << cs.pushes << " pulls " << cs.pulls
            << " bytes pushed " << cs.bytes_pushed << " pulled " << cs.bytes_pulled;
  return Status::Ok();
}

}  // namespace

Status RunWorker(const WorkerOptions& options, Transport* transport, const std::atomic<bool>& stop) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Kernels> kernels, MakeKernels(options.device));
  RegisterRequest req;
  req.device = kernels->DeviceName();
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, options.coordinator,
                                                                req, options.register_timeout));
  LOG(INFO) << "registered as worker " << reg.id << " of " << reg.config.num_workers << " on "
            << req.device;
  json totals = json::object();
  bool done_sent = false;
  Status s = Train(reg, kernels.get(), options, transport, stop, &totals, &done_sent);
  if (!s.ok() && !done_sent) {
    // Tell the coordinator, so that the job ends instead of waiting for this worker.
    Status told = SendDone(*reg.coordinator, reg.id, totals, s, stop);
    if (!told.ok()) LOG(WARNING) << "could not tell the coordinator: " << told.ToString();
  }
  return s;
}

}  // namespace ps
