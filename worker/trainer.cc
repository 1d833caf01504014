#include "worker/trainer.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include <glog/logging.h>
#include <kj/exception.h>

#include "common/registration.h"
#include "common/shard_map.h"
#include "common/wire.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;
using nlohmann::json;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Reports go to the coordinator, one request at a time on the registration socket.
class CoordinatorSink final : public ProgressSink {
 public:
  CoordinatorSink(ClientSocket* coordinator, int worker_id)
      : coordinator_(coordinator), worker_id_(worker_id) {}
  Status Report(const json& line) override {
    capnp::MallocMessageBuilder b;
    NewHeader(b, ++request_id_, worker_id_).getBody().initReport().setJson(line.dump());
    Frames f;
    f.push_back(EncodeFrame(b));
    return Call(*coordinator_, std::move(f), std::chrono::seconds(60)).status();
  }

 private:
  ClientSocket* coordinator_;
  int worker_id_;
  uint64_t request_id_ = 0;
};

// Tells the coordinator this worker is done and waits until every worker is (the barrier
// before the final evaluation).
Status SendDone(ClientSocket& coordinator, int worker_id, const json& totals, const Status& outcome,
                const std::atomic<bool>& stop) {
  capnp::MallocMessageBuilder b;
  auto done = NewHeader(b, 1u << 30, worker_id).getBody().initDone();
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
    if (reply->empty()) return Internal("empty answer to done");
    PS_ASSIGN_OR_RETURN(DecodedHeader h, DecodedHeader::Decode((*reply)[0]));
    try {
      auto body = h.get().getBody();
      if (body.which() == wire::Header::Body::ERROR) {
        return StatusFromError(body.getError()).WithContext("the coordinator refused done");
      }
      if (body.which() != wire::Header::Body::DONE_REPLY) {
        return Internal("the coordinator answered done with another message type");
      }
    } catch (const kj::Exception& e) {
      return Internal(std::string("malformed answer to done: ") + e.getDescription().cStr());
    }
    return Status::Ok();
  }
  return Aborted("stopped while waiting for the other workers");
}

}  // namespace

std::vector<int64_t> EpochShare(uint64_t seed, int epoch, int64_t count, int worker,
                                int num_workers) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(HashKey(seed, 0xda7a, static_cast<uint64_t>(epoch)));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> mine;
  for (size_t i = static_cast<size_t>(worker); i < order.size(); i += static_cast<size_t>(num_workers)) {
    mine.push_back(order[i]);
  }
  return mine;
}

TrainingLoop::TrainingLoop(const JobConfig& config, int worker_id, Kernels* kernels,
                           KVClient* client, Mlp* mlp, const ImageDataset& train,
                           const ImageDataset& test, ProgressSink* sink, double slowdown)
    : config_(config), worker_id_(worker_id), kernels_(kernels), client_(client), mlp_(mlp),
      train_(train), test_(test), sink_(sink), slowdown_(slowdown) {
  const size_t n = MlpParamSizes(mlp_->shape()).size();
  for (size_t i = 0; i < n; ++i) {
    const TableSpec& t = config_.table_specs[i];
    params_.emplace_back(t.rows * t.width);
    grads_.emplace_back(t.rows * t.width);
  }
}

std::vector<const float*> TrainingLoop::ConstParams() const {
  std::vector<const float*> p;
  for (const auto& v : params_) p.push_back(v.data());
  return p;
}

Status TrainingLoop::PullAll(RequestInfo* info) {
  std::vector<Ticket> tickets;
  for (size_t i = 0; i < params_.size(); ++i) {
    const TableSpec& t = config_.table_specs[i];
    tickets.push_back(client_->PullRange(t.id, RowRange{0, t.rows}, params_[i]));
  }
  Status first;
  for (Ticket t : tickets) {
    RequestInfo one;
    Status s = client_->Wait(t, &one);
    if (first.ok()) first = s;
    // The tables' pulls were held side by side: the step waited as long as the longest.
    info->held_seconds = std::max(info->held_seconds, one.held_seconds);
    info->clock_lag = std::max(info->clock_lag, one.clock_lag);
  }
  return first;
}

Status TrainingLoop::WaitInFlight() {
  Status first;
  for (Ticket t : in_flight_) {
    Status s = client_->Wait(t);
    if (first.ok()) first = s;
  }
  in_flight_.clear();
  return first;
}

Status TrainingLoop::PushAllAndTick() {
  PS_RETURN_IF_ERROR(WaitInFlight());
  for (size_t i = 0; i < grads_.size(); ++i) {
    const TableSpec& t = config_.table_specs[i];
    in_flight_.push_back(client_->PushRange(t.id, RowRange{0, t.rows}, grads_[i]));
  }
  in_flight_.push_back(client_->Clock());
  return Status::Ok();
}

Result<BatchResult> TrainingLoop::Evaluate() {
  PS_RETURN_IF_ERROR(WaitInFlight());
  RequestInfo info;
  PS_RETURN_IF_ERROR(PullAll(&info));
  BatchResult r;
  PS_RETURN_IF_ERROR(mlp_->Evaluate(test_.pixels.data(), test_.labels.data(),
                                    static_cast<int>(test_.count), ConstParams(), &r));
  return r;
}

json TrainingLoop::EvalLine(int epoch, const BatchResult& ev, bool final_eval) {
  return {{"kind", "eval"},
          {"epoch", epoch},
          {"final", final_eval},
          {"test_examples", ev.examples},
          {"test_loss", ev.loss_sum / std::max<int64_t>(1, ev.examples)},
          {"test_accuracy", static_cast<double>(ev.correct) / std::max<int64_t>(1, ev.examples)}};
}

json TrainingLoop::Totals() const {
  return {{"examples", examples_},
          {"steps", steps_},
          {"clock", client_->clock()},
          {"seconds", seconds_},
          {"wait_seconds", wait_seconds_},
          {"device", kernels_->DeviceName()}};
}

Status TrainingLoop::ReportTraining(int epoch, double epoch_fraction, bool force) {
  const double dt = SecondsSince(last_report_);
  if (interval_.examples == 0 || (!force && dt < config_.report_every_seconds)) {
    return Status::Ok();
  }
  KVClientStats now = client_->stats();
  const uint64_t n = now.staleness_count - stats_at_report_.staleness_count;
  json line = {
      {"kind", "train"},
      {"epoch", epoch},
      {"epoch_fraction", epoch_fraction},
      {"step", steps_},
      {"clock", client_->clock()},
      {"examples", interval_.examples},
      {"loss", interval_.loss_sum / interval_.examples},
      {"accuracy", static_cast<double>(interval_.correct) / interval_.examples},
      {"examples_per_sec", interval_.examples / dt},
      {"wait_seconds", interval_wait_},
      {"clock_lag_max", interval_lag_},
      {"staleness_mean",
       n > 0 ? static_cast<double>(now.staleness_sum - stats_at_report_.staleness_sum) / n : 0.0},
      {"staleness_max_total", now.staleness_max},
      {"lr", now.last_learning_rate},
  };
  stats_at_report_ = now;
  interval_ = BatchResult();
  interval_wait_ = 0;
  interval_lag_ = 0;
  last_report_ = SteadyClock::now();
  return sink_->Report(line);
}

Status TrainingLoop::Run(const std::atomic<bool>& stop) {
  const int W = config_.num_workers;
  const size_t dim = static_cast<size_t>(train_.rows) * static_cast<size_t>(train_.cols);
  const int B = config_.batch_size;
  std::vector<float> x(static_cast<size_t>(B) * dim);
  std::vector<int32_t> y(static_cast<size_t>(B));
  std::vector<float*> grad_ptrs;
  for (auto& g : grads_) grad_ptrs.push_back(g.data());

  start_ = last_report_ = SteadyClock::now();
  stats_at_report_ = client_->stats();
  for (int epoch = 1; epoch <= config_.epochs; ++epoch) {
    std::vector<int64_t> mine = EpochShare(config_.seed, epoch, train_.count, worker_id_, W);
    for (size_t begin = 0; begin < mine.size(); begin += static_cast<size_t>(B)) {
      if (stop.load()) return Aborted("stopped by signal");
      const int n = static_cast<int>(std::min<size_t>(B, mine.size() - begin));
      for (int i = 0; i < n; ++i) {
        const int64_t e = mine[begin + static_cast<size_t>(i)];
        std::copy_n(train_.pixels.data() + static_cast<size_t>(e) * dim, dim,
                    x.data() + static_cast<size_t>(i) * dim);
        y[static_cast<size_t>(i)] = train_.labels[static_cast<size_t>(e)];
      }
      RequestInfo info;
      PS_RETURN_IF_ERROR(PullAll(&info));
      auto compute_start = SteadyClock::now();
      BatchResult br;
      PS_RETURN_IF_ERROR(
          mlp_->ForwardBackward(x.data(), y.data(), n, ConstParams(), grad_ptrs, &br));
      if (slowdown_ > 1) {
        // A deliberate straggler (--slowdown): as if the device were this much slower.
        std::this_thread::sleep_for((SteadyClock::now() - compute_start) * (slowdown_ - 1));
      }
      PS_RETURN_IF_ERROR(PushAllAndTick());
      ++steps_;
      examples_ += n;
      wait_seconds_ += info.held_seconds;
      interval_wait_ += info.held_seconds;
      interval_lag_ = std::max(interval_lag_, info.clock_lag);
      interval_.loss_sum += br.loss_sum;
      interval_.correct += br.correct;
      interval_.examples += br.examples;
      PS_RETURN_IF_ERROR(ReportTraining(epoch, static_cast<double>(begin + n) / mine.size(), false));
    }
    PS_RETURN_IF_ERROR(ReportTraining(epoch, 1.0, true));
    if (worker_id_ == 0 && epoch < config_.epochs) {
      PS_ASSIGN_OR_RETURN(BatchResult ev, Evaluate());
      PS_RETURN_IF_ERROR(sink_->Report(EvalLine(epoch, ev, false)));
    }
  }
  PS_RETURN_IF_ERROR(WaitInFlight());
  seconds_ = SecondsSince(start_);
  // Nobody waits on a worker that has finished.
  return client_->Wait(client_->Leave());
}

namespace {

// Everything after registration. *done_sent tells the caller whether the coordinator
// already heard from this worker.
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
  CoordinatorSink sink(reg.coordinator.get(), reg.id);
  TrainingLoop loop(config, reg.id, kernels, client.get(), mlp.get(), train, test, &sink,
                    options.slowdown);
  Status s = loop.Run(stop);
  *totals = loop.Totals();
  if (!s.ok()) return s;
  *done_sent = true;
  PS_RETURN_IF_ERROR(SendDone(*reg.coordinator, reg.id, *totals, Status::Ok(), stop));
  if (reg.id == 0) {
    PS_ASSIGN_OR_RETURN(BatchResult ev, loop.Evaluate());
    PS_RETURN_IF_ERROR(sink.Report(TrainingLoop::EvalLine(config.epochs, ev, true)));
  }
  KVClientStats cs = client->stats();
  LOG(INFO) << "worker " << reg.id << " done: pushes " << cs.pushes << " pulls " << cs.pulls
            << " bytes pushed " << cs.bytes_pushed << " pulled " << cs.bytes_pulled
            << " max staleness " << cs.staleness_max << " max clock lag " << cs.max_clock_lag;
  return Status::Ok();
}

}  // namespace

Status RunWorker(const WorkerOptions& options, Transport* transport, const std::atomic<bool>& stop) {
  if (!(options.slowdown >= 1)) {
    return InvalidArgument("--slowdown=" + std::to_string(options.slowdown) +
                           " is not allowed: expected a factor >= 1");
  }
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
