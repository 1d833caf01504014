#include "worker/trainer.h"

#include <glog/logging.h>
#include <kj/exception.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "common/gradient_check.h"
#include "common/heartbeat.h"
#include "common/registration.h"
#include "common/run_summary.h"
#include "common/shard_map.h"
#include "common/wire.h"
#include "worker/coordinator_call.h"
#include "worker/group_trainer.h"
#include "worker/worker_metrics.h"

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
  CoordinatorSink(ClientSocket* coordinator, int worker_id, const HeartbeatSender* heartbeat)
      : coordinator_(coordinator), worker_id_(worker_id), heartbeat_(heartbeat) {}
  // With `metrics`, each train line also updates them (with `client`'s counters).
  void SetMetrics(WorkerMetrics* metrics, const KVClient* client) {
    metrics_ = metrics;
    client_ = client;
  }
  Status Report(const json& line) override {
    if (metrics_ != nullptr && KindOf(line) == MetricsLineKind::kTrain) {
      metrics_->OnReport(line, client_->stats());
    }
    capnp::MallocMessageBuilder b;
    NewHeader(b, ++request_id_, worker_id_).getBody().initReport().setJson(line.dump());
    Frames f;
    f.push_back(EncodeFrame(b));
    CoordinatorCallOptions call;
    call.heartbeat = heartbeat_;
    return CallCoordinator(*coordinator_, std::move(f), request_id_, call).status();
  }

 private:
  ClientSocket* coordinator_;
  int worker_id_;
  const HeartbeatSender* heartbeat_;
  uint64_t request_id_ = 0;
  WorkerMetrics* metrics_ = nullptr;
  const KVClient* client_ = nullptr;
};

// Tells the coordinator this worker is done and waits until every worker is (the barrier
// before the final evaluation).
// *evaluate: this worker evaluates the final model (worker 0, or the coordinator's choice
// once worker 0 is gone).
Status SendDone(ClientSocket& coordinator, int worker_id, const json& totals, const Status& outcome,
                const std::atomic<bool>& stop, const HeartbeatSender* heartbeat,
                bool* evaluate = nullptr) {
  constexpr uint64_t kDoneRequest = 1u << 30;
  capnp::MallocMessageBuilder b;
  auto done = NewHeader(b, kDoneRequest, worker_id).getBody().initDone();
  done.setJson(totals.dump());
  done.setFailed(!outcome.ok());
  done.setMessage(outcome.ToString());
  Frames f;
  f.push_back(EncodeFrame(b));
  // The barrier waits for the slowest worker: no limit but `stop`.
  CoordinatorCallOptions call;
  call.timeout = std::chrono::hours(24 * 365);
  call.heartbeat = heartbeat;
  call.stop = &stop;
  Result<CallReply> reply = CallCoordinator(coordinator, std::move(f), kDoneRequest, call);
  if (!reply.ok()) {
    if (reply.status().code() == StatusCode::kAborted) {
      return Aborted("stopped while waiting for the other workers");
    }
    return reply.status().WithContext("the coordinator refused done");
  }
  try {
    auto body = reply->header.get().getBody();
    if (body.which() == wire::Header::Body::EVALUATE_FINAL) {
      if (evaluate != nullptr) *evaluate = true;
    } else if (body.which() != wire::Header::Body::DONE_REPLY) {
      return Internal("the coordinator answered done with another message type");
    } else if (evaluate != nullptr) {
      *evaluate = worker_id == 0;
    }
  } catch (const kj::Exception& e) {
    return Internal(std::string("malformed answer to done: ") + e.getDescription().cStr());
  }
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> EpochOrder(uint64_t seed, int epoch, int64_t count) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(HashKey(seed, 0xda7a, static_cast<uint64_t>(epoch)));
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

LocalChunkSource::LocalChunkSource(int epochs, uint64_t chunk_examples, int batch_size)
    : table_(epochs, chunk_examples), epochs_(epochs), batch_size_(batch_size) {}

Result<ChunkSource::Next> LocalChunkSource::Lease(int worker, const Request& request) {
  std::unique_lock<std::mutex> lock(mu_);
  PS_RETURN_IF_ERROR(table_.SetDatasetSize(request.dataset_size));
  if (request.completed_epoch > 0) {
    PS_RETURN_IF_ERROR(table_.Complete(worker, request.completed_epoch, request.completed_chunk));
    for (int e : table_.TakeCompletedEpochs()) {
      if (e < epochs_) to_eval_.push_back(e);
    }
    cv_.notify_all();
  }
  Next next;
  next.batch_size = batch_size_;
  if (request.leave) {
    table_.Release(worker);
    cv_.notify_all();
    return next;  // kFinished
  }
  if (worker == 0 && !to_eval_.empty()) {
    next.evaluate_epoch = to_eval_.front();
    to_eval_.erase(to_eval_.begin());
  }
  while (true) {
    if (std::optional<LeaseTable::Lease> lease = table_.Acquire(worker)) {
      next.kind = Next::Kind::kChunk;
      next.lease = *lease;
      return next;
    }
    if (table_.AllDone()) {
      next.kind = Next::Kind::kFinished;
      return next;
    }
    if (!request.wait) {
      next.kind = Next::Kind::kWait;
      return next;
    }
    cv_.wait(lock);
  }
}

namespace {

// Leases from the coordinator, on the registration socket.
class CoordinatorChunkSource final : public ChunkSource {
 public:
  CoordinatorChunkSource(ClientSocket* coordinator, const HeartbeatSender* heartbeat)
      : coordinator_(coordinator), heartbeat_(heartbeat) {}
  Result<Next> Lease(int worker, const Request& request) override {
    capnp::MallocMessageBuilder b;
    auto lease = NewHeader(b, ++request_id_, worker).getBody().initLease();
    lease.setDatasetSize(request.dataset_size);
    lease.setCompletedEpoch(request.completed_epoch);
    lease.setCompletedChunk(request.completed_chunk);
    lease.setExamplesPerSec(request.examples_per_sec);
    lease.setWait(request.wait);
    lease.setLeave(request.leave);
    lease.setClock(request.clock);
    Frames f;
    f.push_back(EncodeFrame(b));
    // A waiting request is answered when another worker's chunk comes back or the job is
    // done, which may take as long as a chunk takes.
    CoordinatorCallOptions call;
    call.timeout = std::chrono::hours(24);
    call.heartbeat = heartbeat_;
    PS_ASSIGN_OR_RETURN(CallReply reply,
                        CallCoordinator(*coordinator_, std::move(f), request_id_, call));
    Next next;
    try {
      auto body = reply.header.get().getBody();
      if (body.which() != wire::Header::Body::LEASE_REPLY) {
        return Internal("the coordinator answered a lease request with another message type");
      }
      auto r = body.getLeaseReply();
      next.batch_size = static_cast<int>(r.getBatchSize());
      next.evaluate_epoch = r.getEvaluateEpoch();
      switch (r.which()) {
        case wire::LeaseReply::CHUNK: {
          auto c = r.getChunk();
          next.kind = Next::Kind::kChunk;
          next.lease = LeaseTable::Lease{c.getEpoch(), c.getIndex(), c.getBegin(), c.getEnd()};
          if (c.getBegin() > c.getEnd() || c.getEnd() > request.dataset_size) {
            return Internal("the coordinator leased positions outside the data set");
          }
          break;
        }
        case wire::LeaseReply::WAIT:
          next.kind = Next::Kind::kWait;
          break;
        case wire::LeaseReply::FINISHED:
          next.kind = Next::Kind::kFinished;
          break;
      }
    } catch (const kj::Exception& e) {
      return Internal(std::string("malformed lease reply: ") + e.getDescription().cStr());
    }
    return next;
  }

 private:
  ClientSocket* coordinator_;
  const HeartbeatSender* heartbeat_;
  uint64_t request_id_ = 1u << 20;
};

}  // namespace

TrainingLoop::TrainingLoop(const JobConfig& config, const TrainingLoopOptions& options,
                           KVClient* client, TrainableModel* model, ProgressSink* sink,
                           ChunkSource* chunks)
    : config_(config),
      worker_id_(options.worker_id),
      client_(client),
      model_(model),
      sink_(sink),
      chunks_(chunks),
      device_(options.device),
      slowdown_(options.slowdown),
      fixed_batch_(options.batch_size),
      batch_(options.batch_size > 0 ? options.batch_size : config.batch_size),
      local_(config) {
  bool bsp = false;
  for (const TableSpec& t : config.table_specs) bsp = bsp || config.StalenessOf(t) == 0;
  prefetch_ = options.prefetch && !bsp && !local_.active() && model->CanPrefetch();
  const bool heavy_momentum =
      (config.optimizer == "momentum" || config.optimizer == "nesterov") && config.momentum > 0.5;
  if (prefetch_ && heavy_momentum && worker_id_ == 0) {
    // Measured on the default job: 0.57 test accuracy with prefetch against 0.887 without.
    LOG(WARNING) << "--prefetch makes every gradient at least one update stale, which --optimizer="
                 << config.optimizer << " --momentum=" << config.momentum
                 << " trains poorly with; consider --momentum=0.5 or --prefetch=false";
  }
}

void TrainingLoop::SignalGroup(int64_t command) {
  if (group_ == nullptr) return;
  std::vector<int64_t> words = {command};
  Status s = group_->BroadcastControl(&words);
  if (!s.ok()) DissolveGroup(s);
}

Status TrainingLoop::WaitInFlight() {
  auto start = SteadyClock::now();
  Status first;
  for (Ticket t : in_flight_) {
    Status s = client_->Wait(t);
    if (!s.ok()) ++pushes_lost_;
    if (first.ok()) first = s;
  }
  in_flight_.clear();
  blocked_seconds_ += SecondsSince(start);
  return first;
}

Status TrainingLoop::DrainPrefetch() {
  if (!prefetched_) return Status::Ok();
  prefetched_ = false;
  RequestInfo info;
  return model_->FinishPull(*client_, &info);
}

Status TrainingLoop::PushAndTick() {
  PS_RETURN_IF_ERROR(WaitInFlight());
  auto start = SteadyClock::now();
  // The pushes and the tick go to each server as one message.
  KVClient::Corked batch(*client_);
  model_->Push(*client_, &in_flight_);
  in_flight_.push_back(client_->Clock());
  push_seconds_ += SecondsSince(start);
  return Status::Ok();
}

Result<json> TrainingLoop::Evaluate(int epoch, bool final_eval) {
  PS_RETURN_IF_ERROR(DrainPrefetch());
  PS_RETURN_IF_ERROR(WaitInFlight());
  // The model as the servers hold it, whatever --pull_dtype the steps use.
  const WireDtype step_dtype = client_->pull_dtype();
  client_->set_pull_dtype(WireDtype::kFp32);
  Result<json> evaluated = model_->Evaluate(*client_);
  client_->set_pull_dtype(step_dtype);
  PS_ASSIGN_OR_RETURN(json line, std::move(evaluated));
  line["kind"] = "eval";
  line["epoch"] = epoch;
  line["final"] = final_eval;
  return line;
}

json TrainingLoop::Totals() const {
  std::vector<float> ms = pull_wait_ms_;
  auto percentile = [&ms](double q) -> double {
    if (ms.empty()) return 0.0;
    const size_t k =
        std::min(ms.size() - 1, static_cast<size_t>(q * static_cast<double>(ms.size())));
    std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(k), ms.end());
    return ms[k];
  };
  json pull_wait = {{"p50", percentile(0.5)}, {"p99", percentile(0.99)}, {"max", percentile(1.0)}};
  json totals = {{"pull_wait_ms", pull_wait},
                 {"examples", examples_},
                 {"steps", steps_},
                 {"clock", client_->clock()},
                 {"seconds", prior_seconds_ + seconds_},
                 {"wait_seconds", wait_seconds_},
                 {"compute_seconds", compute_seconds_},
                 {"batch_size", batch_},
                 {"device", device_},
                 {"prefetch", prefetch_},
                 {"pushes_lost", pushes_lost_},
                 {"step_seconds",
                  {{"compute", compute_seconds_},
                   {"pull", pull_seconds_},
                   {"push", push_seconds_},
                   {"wait", wait_seconds_ + blocked_seconds_}}}};
  if (divergence_) totals["divergence"] = divergence_->ToJson();
  return totals;
}

Status TrainingLoop::ReportTraining(int epoch, double epoch_fraction, bool force) {
  const double dt = SecondsSince(last_report_);
  if (interval_.examples == 0 || (!force && dt < config_.report_every_seconds)) {
    return Status::Ok();
  }
  KVClientStats now = client_->stats();
  const uint64_t n = now.staleness_count - stats_at_report_.staleness_count;
  TrainLine line;
  line.epoch = epoch;
  line.epoch_fraction = epoch_fraction;
  line.step = steps_;
  line.clock = client_->clock();
  line.examples = interval_.examples;
  line.loss = interval_.loss_sum / interval_.examples;
  line.accuracy = static_cast<double>(interval_.correct) / interval_.examples;
  line.examples_per_sec = interval_.examples / dt;
  line.wait_seconds = interval_wait_;
  line.clock_lag_max = interval_lag_;
  line.staleness_mean =
      n > 0 ? static_cast<double>(now.staleness_sum - stats_at_report_.staleness_sum) / n : 0.0;
  line.staleness_max_total = now.staleness_max;
  line.lr = now.last_learning_rate;
  stats_at_report_ = now;
  interval_ = BatchResult();
  interval_wait_ = 0;
  interval_lag_ = 0;
  last_report_ = SteadyClock::now();
  return sink_->Report(line.ToJson());
}

Status TrainingLoop::CheckDivergence(const BatchResult& br) {
  Divergence d;
  d.worker = worker_id_;
  d.clock = client_->clock();
  if (!std::isfinite(br.loss_sum)) {
    d.reason = "the loss of a batch is " + std::to_string(br.loss_sum);
  } else {
    // Dense models: one span per table, in table order. A gradient the servers would refuse
    // is divergence too; stopping here names the table instead of a refused push.
    std::vector<std::span<float>> grads = model_->DenseGrads();
    for (size_t t = 0; t < grads.size() && d.reason.empty(); ++t) {
      if (GradientsInRange(grads[t])) continue;
      const std::string table =
          t < config_.table_specs.size() ? config_.table_specs[t].name : std::to_string(t);
      d.reason = "table '" + table + "' has " + CheckGradients(grads[t]).message();
      d.table = table;
    }
  }
  if (d.reason.empty()) return Status::Ok();
  if (br.examples > 0 && std::isfinite(br.loss_sum)) d.loss = br.loss_sum / br.examples;
  divergence_ = d;
  return Aborted("the model diverged at clock " + std::to_string(d.clock) + ": " + d.reason);
}

Status TrainingLoop::TrainStep(std::span<const int64_t> examples, int epoch,
                               double epoch_fraction) {
  RequestInfo info;
  double held = 0;
  // --local_steps: only a round's first step pulls; the others compute on the copy the
  // round's earlier steps moved.
  if (local_.starting()) {
    auto pull_start = SteadyClock::now();
    if (prefetched_) {
      prefetched_ = false;
      PS_RETURN_IF_ERROR(model_->FinishPull(*client_, &info));
    } else {
      PS_RETURN_IF_ERROR(model_->Pull(*client_, examples, &info));
    }
    // A prefetched pull may have been held while the last step computed: only the part of
    // the hold this step actually waited for counts as waiting.
    const double pulled_in = SecondsSince(pull_start);
    pull_wait_ms_.push_back(static_cast<float>(pulled_in * 1e3));
    held = std::min(info.held_seconds, pulled_in);
    pull_seconds_ += pulled_in - held;
    if (prefetch_) {
      // The next step's pull, behind this step's compute; it will be used at clock + 1.
      PS_RETURN_IF_ERROR(model_->StartPull(*client_, client_->clock() + 1));
      prefetched_ = true;
    }
    pull_seconds_ += SecondsSince(pull_start) - pulled_in;  // issuing the prefetch
  }
  auto compute_start = SteadyClock::now();
  // A push is its batch's mean gradient; scaled by n / batch_size, every example weighs the
  // same in the model whichever worker, and whichever batch size, it went through.
  const float scale = static_cast<float>(examples.size()) / static_cast<float>(config_.batch_size);
  BatchResult br;
  PS_RETURN_IF_ERROR(model_->Compute(examples, scale, &br));
  PS_RETURN_IF_ERROR(CheckDivergence(br));
  if (slowdown_ > 1) {
    // A deliberate straggler (--slowdown): as if the device were this much slower.
    std::this_thread::sleep_for((SteadyClock::now() - compute_start) * (slowdown_ - 1));
  }
  compute_seconds_ += SecondsSince(compute_start);
  const bool push = !local_.active() ||
                    local_.Add(model_->DenseParams(), model_->DenseGrads(),
                               local_.Rate(client_->stats().last_learning_rate, client_->clock()));
  if (push) PS_RETURN_IF_ERROR(PushAndTick());
  ++steps_;
  examples_ += static_cast<int64_t>(examples.size());
  wait_seconds_ += held;
  interval_wait_ += held;
  interval_lag_ = std::max(interval_lag_, info.clock_lag);
  interval_.loss_sum += br.loss_sum;
  interval_.correct += br.correct;
  interval_.examples += br.examples;
  return ReportTraining(epoch, epoch_fraction, false);
}

Status TrainingLoop::TrainChunk(const LeaseTable::Lease& lease, const std::atomic<bool>& stop,
                                bool* finished) {
  *finished = false;
  if (order_epoch_ != lease.epoch) {
    order_ = EpochOrder(config_.seed, lease.epoch, model_->train_examples());
    order_epoch_ = lease.epoch;
  }
  for (uint64_t begin = lease.begin; begin < lease.end;) {
    if (stop.load()) {
      // Draining: finish the chunk if that fits in the budget, else return it.
      if (!stop_seen_) {
        stop_seen_ = true;
        stop_time_ = SteadyClock::now();
        const double left = static_cast<double>(lease.end - begin);
        const double rate = compute_seconds_ > 0 ? examples_ / compute_seconds_ : 0;
        const double need = rate > 0 ? left / rate : 1e9;
        if (need > std::chrono::duration<double>(drain_finish_chunk_).count()) {
          local_.Drop();  // the chunk goes back, and its round with it
          return Status::Ok();
        }
      }
      if (SteadyClock::now() - stop_time_ > drain_finish_chunk_) {
        local_.Drop();
        return Status::Ok();
      }
    }
    if (group_ != nullptr) {
      // One step of the group: a batch for each member.
      const uint64_t n =
          std::min<uint64_t>(static_cast<uint64_t>(batch_) * group_->size(), lease.end - begin);
      std::span<const int64_t> examples(order_.data() + begin, n);
      const double fraction = static_cast<double>(begin + n) / model_->train_examples();
      PS_RETURN_IF_ERROR(GroupStep(examples, begin, lease.epoch, fraction));
      begin += n;
      continue;
    }
    const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(batch_), lease.end - begin);
    std::span<const int64_t> examples(order_.data() + begin, n);
    const double fraction = static_cast<double>(begin + n) / model_->train_examples();
    PS_RETURN_IF_ERROR(TrainStep(examples, lease.epoch, fraction));
    begin += n;
  }
  // A round ends with its chunk: a chunk reported complete has every example pushed.
  if (local_.Finish(model_->DenseGrads())) PS_RETURN_IF_ERROR(PushAndTick());
  *finished = true;
  return Status::Ok();
}

Status TrainingLoop::LeaveJob(ChunkSource::Request request, int epoch) {
  PS_RETURN_IF_ERROR(ReportTraining(epoch, 1.0, true));
  PS_RETURN_IF_ERROR(DrainPrefetch());
  PS_RETURN_IF_ERROR(WaitInFlight());  // every push acknowledged
  if (in_clock_table_) PS_RETURN_IF_ERROR(client_->Wait(client_->Leave()));
  in_clock_table_ = false;
  request.leave = true;
  request.wait = false;
  PS_RETURN_IF_ERROR(chunks_->Lease(worker_id_, request).status());
  seconds_ = SecondsSince(start_);
  left_job_ = true;
  LOG(INFO) << "worker " << worker_id_ << " left the job"
            << (request.completed_epoch > 0 ? " after finishing its chunk"
                                            : ", returning its chunk");
  return Status::Ok();
}

Status TrainingLoop::Run(const std::atomic<bool>& stop) {
  start_ = last_report_ = SteadyClock::now();
  stats_at_report_ = client_->stats();
  ChunkSource::Request request;
  request.dataset_size = static_cast<uint64_t>(model_->train_examples());
  int epoch = 1;
  while (true) {
    request.examples_per_sec = compute_seconds_ > 0 ? examples_ / compute_seconds_ : 0;
    if (stop.load()) return LeaveJob(request, epoch);
    request.wait = !in_clock_table_;
    request.clock = client_->clock();
    PS_ASSIGN_OR_RETURN(ChunkSource::Next next, chunks_->Lease(worker_id_, request));
    request.completed_epoch = 0;
    if (fixed_batch_ == 0 && next.batch_size > 0) {
      if (next.batch_size > model_->max_batch()) {
        return Internal("the coordinator asked for batches of " + std::to_string(next.batch_size) +
                        ", more than this worker's limit of " +
                        std::to_string(model_->max_batch()));
      }
      batch_ = next.batch_size;
    }
    if (next.evaluate_epoch > 0) {
      PS_RETURN_IF_ERROR(ReportTraining(epoch, 1.0, true));
      PS_ASSIGN_OR_RETURN(json line, Evaluate(next.evaluate_epoch, false));
      PS_RETURN_IF_ERROR(sink_->Report(line));
    }
    if (next.kind == ChunkSource::Next::Kind::kFinished) break;
    if (next.kind == ChunkSource::Next::Kind::kWait) {
      // Nothing to lease until another worker's chunk comes back or the job ends: out of the
      // clock table meanwhile, so that nobody waits on this worker's clock.
      PS_RETURN_IF_ERROR(DrainPrefetch());
      PS_RETURN_IF_ERROR(WaitInFlight());
      PS_RETURN_IF_ERROR(client_->Wait(client_->Leave()));
      in_clock_table_ = false;
      SignalGroup(kGroupIdle);  // the members wait with this worker, without a deadline
      continue;
    }
    if (!in_clock_table_) {
      PS_RETURN_IF_ERROR(client_->Wait(client_->Rejoin()));
      in_clock_table_ = true;
    }
    epoch = next.lease.epoch;
    bool finished = false;
    PS_RETURN_IF_ERROR(TrainChunk(next.lease, stop, &finished));
    if (!finished) {
      request.completed_epoch = 0;  // the chunk goes back to the queue
      return LeaveJob(request, epoch);
    }
    request.completed_epoch = next.lease.epoch;
    request.completed_chunk = next.lease.chunk;
  }
  SignalGroup(kGroupFinished);
  PS_RETURN_IF_ERROR(ReportTraining(epoch, 1.0, true));
  PS_RETURN_IF_ERROR(DrainPrefetch());
  PS_RETURN_IF_ERROR(WaitInFlight());
  seconds_ = SecondsSince(start_);
  // Nobody waits on a worker that has finished.
  if (in_clock_table_) PS_RETURN_IF_ERROR(client_->Wait(client_->Leave()));
  return Status::Ok();
}

namespace {

// The device a group's backend runs on: "cuda:N" for a GPU worker, else "cpu".
std::string GroupDevice(const Kernels& kernels) {
  if (!kernels.IsCuda()) return "cpu";
  const std::string name = kernels.DeviceName();
  const size_t at = name.find("(cuda:");
  if (at == std::string::npos) return "cuda:0";
  return "cuda:" + std::to_string(std::atoi(name.c_str() + at + 6));
}

// The KV client of a registered worker; its requests are timed into `metrics` when set.
Result<std::unique_ptr<KVClient>> ConnectToServers(const Registration& reg,
                                                   const WorkerOptions& options,
                                                   Transport* transport, WorkerMetrics* metrics) {
  KVClientOptions copt;
  copt.client_id = reg.id;
  copt.request_timeout = options.request_timeout;
  if (metrics != nullptr) {
    copt.on_request_done = [metrics](bool push, double seconds, bool ok) {
      metrics->OnRequestDone(push, seconds, ok);
    };
  }
  copt.retry_interval = options.retry_interval;
  PS_ASSIGN_OR_RETURN(copt.wire_dtype, ParseWireDtype(options.wire_dtype));
  PS_ASSIGN_OR_RETURN(copt.pull_dtype, ParseWireDtype(options.pull_dtype, "pull_dtype"));
  return KVClient::Create(transport, reg.config, reg.server_endpoints, copt);
}

// A restored job: the servers' clock tables hold the checkpoint's clocks. A rejoin tick
// raises this worker's clock to their slowest one, which must be the clock the
// coordinator recorded, so that SSP bounds and the LR schedule continue from there.
Status ResumeAtRestoredClock(const Registration& reg, KVClient& client) {
  if (reg.start_clock <= 0) return Status::Ok();
  PS_RETURN_IF_ERROR(client.Wait(client.Rejoin()));
  if (client.clock() != reg.start_clock) {
    return FailedPrecondition("restored job: the servers' clock is " +
                              std::to_string(client.clock()) + ", the coordinator's " +
                              std::to_string(reg.start_clock));
  }
  LOG(INFO) << "worker " << reg.id << ": resuming at clock " << reg.start_clock << ", epoch "
            << reg.start_epoch;
  return Status::Ok();
}

// Failover (--replicas=2): heartbeat replies name the servers whose shards moved, and
// `client` follows them while this guard lives (it unhooks the client before it is gone).
class RedirectsTo {
 public:
  RedirectsTo(HeartbeatSender* heartbeat, KVClient* client) : heartbeat_(heartbeat) {
    if (heartbeat_ == nullptr) return;
    heartbeat_->SetRedirectHandler(
        [client](int server, const std::string& endpoint) { client->Redirect(server, endpoint); });
  }
  ~RedirectsTo() {
    if (heartbeat_ != nullptr) heartbeat_->SetRedirectHandler(nullptr);
  }
  RedirectsTo(const RedirectsTo&) = delete;
  RedirectsTo& operator=(const RedirectsTo&) = delete;

 private:
  HeartbeatSender* heartbeat_;
};

// The worker's all-reduce group; null when it has none, or when joining failed (the
// others find out through their own timeouts, and everyone trains alone).
std::unique_ptr<GroupComm> JoinWorkerGroup(const Registration& reg, const Kernels& kernels,
                                           Transport* transport) {
  if (reg.group.size <= 1) return nullptr;
  GroupCommOptions gopt;
  gopt.rank = reg.group.rank;
  gopt.size = reg.group.size;
  gopt.leader_endpoint = reg.group.leader_endpoint;
  gopt.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(reg.config.group_timeout_seconds * 1000));
  gopt.device = GroupDevice(kernels);
  Result<std::unique_ptr<GroupComm>> joined = JoinGroup(transport, gopt);
  if (!joined.ok()) {
    LOG(WARNING) << "worker " << reg.id << ": could not join all-reduce group '" << reg.group.name
                 << "': " << joined.status().ToString() << "; training alone";
    return nullptr;
  }
  std::unique_ptr<GroupComm> group = std::move(joined).value();
  LOG(INFO) << "worker " << reg.id << ": rank " << group->rank() << " of all-reduce group '"
            << reg.group.name << "' (" << group->size() << " workers, " << group->backend() << ")";
  return group;
}

// A group member trains through its leader until the group ends. *alone: the group
// dissolved, and this worker goes on training on its own (back in the clock table).
Status TrainAsMember(const Registration& reg, KVClient& client, TrainableModel& model,
                     GroupComm& group, const std::atomic<bool>& stop, TrainingLoop& loop,
                     bool* alone) {
  const auto member_start = SteadyClock::now();
  PS_ASSIGN_OR_RETURN(GroupMemberResult member,
                      RunGroupMember(reg.config, &client, &model, &group, stop));
  LOG(INFO) << "worker " << reg.id << ": trained " << member.examples << " examples in "
            << member.steps << " steps of its group (the leader counts them)";
  loop.AddPriorTotals(0, 0, SecondsSince(member_start));
  *alone = member.dissolved;
  if (*alone) PS_RETURN_IF_ERROR(client.Wait(client.Rejoin()));
  return Status::Ok();
}

// After training: the barrier with the other workers, then the final evaluation when the
// coordinator picks this worker for it.
Status FinishJob(const Registration& reg, TrainingLoop& loop, ProgressSink& sink,
                 const KVClient& client, const json& totals, const std::atomic<bool>& stop,
                 const HeartbeatSender* heartbeat) {
  bool evaluate = false;
  PS_RETURN_IF_ERROR(
      SendDone(*reg.coordinator, reg.id, totals, Status::Ok(), stop, heartbeat, &evaluate));
  if (evaluate) {
    PS_ASSIGN_OR_RETURN(json line, loop.Evaluate(reg.config.epochs, true));
    PS_RETURN_IF_ERROR(sink.Report(line));
  }
  KVClientStats cs = client.stats();
  LOG(INFO) << "worker " << reg.id << " done: pushes " << cs.pushes << " pulls " << cs.pulls
            << " bytes pushed " << cs.bytes_pushed << " pulled " << cs.bytes_pulled
            << " max staleness " << cs.staleness_max << " max clock lag " << cs.max_clock_lag;
  return Status::Ok();
}

// Everything after registration. *done_sent tells the caller whether the coordinator
// already heard from this worker.
Status Train(Registration& reg, Kernels* kernels, const WorkerOptions& options,
             Transport* transport, const std::atomic<bool>& stop, json* totals, bool* done_sent,
             HeartbeatSender* heartbeat) {
  const JobConfig& config = reg.config;
  // With --batch_size=auto a worker's batch follows its share of the job's throughput, at
  // most every worker's batches together.
  const int max_batch =
      std::max(options.batch_size,
               config.auto_batch ? config.batch_size * config.num_workers : config.batch_size);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<TrainableModel> model, LoadModel(config, kernels, max_batch));
  std::optional<WorkerMetrics> metrics;
  if (options.metrics != nullptr) metrics.emplace(options.metrics);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<KVClient> client,
                      ConnectToServers(reg, options, transport, metrics ? &*metrics : nullptr));
  PS_RETURN_IF_ERROR(ResumeAtRestoredClock(reg, *client));
  CoordinatorSink sink(reg.coordinator.get(), reg.id, heartbeat);
  if (metrics) sink.SetMetrics(&*metrics, client.get());
  CoordinatorChunkSource chunks(reg.coordinator.get(), heartbeat);
  RedirectsTo redirects(heartbeat, client.get());
  TrainingLoopOptions lopt;
  lopt.worker_id = reg.id;
  lopt.device = kernels->DeviceName();
  lopt.slowdown = options.slowdown;
  lopt.batch_size = options.batch_size;
  lopt.prefetch = options.prefetch;
  TrainingLoop loop(config, lopt, client.get(), model.get(), &sink, &chunks);
  LOG(INFO) << "prefetch " << (loop.prefetching() ? "on" : "off")
            << (options.prefetch && !loop.prefetching()
                    ? " (BSP, --local_steps, or a model that cannot)"
                    : "");
  if (!options.group.empty() && config.local_steps > 1) {
    return InvalidArgument(
        "--group=" + options.group +
        " cannot be used in a job with --local_steps=" + std::to_string(config.local_steps) +
        ": expected no group (a group's leader pushes every step)");
  }
  if (config.local_steps > 1) PS_RETURN_IF_ERROR(LrPolicy::Create(config).status());  // rounds'
  std::unique_ptr<GroupComm> group = JoinWorkerGroup(reg, *kernels, transport);
  bool alone = true;
  if (group != nullptr && group->leader()) {
    loop.SetGroup(group.get());
  } else if (group != nullptr) {
    PS_RETURN_IF_ERROR(TrainAsMember(reg, *client, *model, *group, stop, loop, &alone));
  }
  loop.set_drain_finish_chunk(options.drain_timeout / 2);
  // Ids past num_workers are handed to workers that join the running job.
  if (reg.id >= config.num_workers) loop.set_joined();
  Status s;
  if (alone) s = loop.Run(stop);
  *totals = loop.Totals();
  if (!s.ok()) return s;
  *done_sent = true;
  // Drained on SIGTERM: the coordinator knows; no barrier, no final evaluation here.
  if (loop.left_job()) return Status::Ok();
  return FinishJob(reg, loop, sink, *client, *totals, stop, heartbeat);
}

}  // namespace

Status RunWorker(const WorkerOptions& options, Transport* transport,
                 const std::atomic<bool>& stop) {
  if (options.batch_size < 0) {
    return InvalidArgument("--batch_size=" + std::to_string(options.batch_size) +
                           " is not allowed: expected 0 (the job's) or a positive count");
  }
  PS_RETURN_IF_ERROR(ParseWireDtype(options.wire_dtype).status());
  PS_RETURN_IF_ERROR(ParseWireDtype(options.pull_dtype, "pull_dtype").status());
  if (!(options.slowdown >= 1)) {
    return InvalidArgument("--slowdown=" + std::to_string(options.slowdown) +
                           " is not allowed: expected a factor >= 1");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Kernels> kernels, MakeKernels(options.device));
  RegisterRequest req;
  req.device = kernels->DeviceName();
  req.requested_id = options.requested_id;
  req.group = options.group;
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, options.coordinator, req,
                                                                options.register_timeout));
  LOG(INFO) << "registered as worker " << reg.id << " of " << reg.config.num_workers << " on "
            << req.device << (reg.id >= reg.config.num_workers ? " (joined a running job)" : "");
  // Heartbeats from a thread of their own, until this function returns.
  HeartbeatOptions hopt;
  hopt.coordinator = options.coordinator;
  hopt.id = reg.id;
  hopt.interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(reg.config.heartbeat_timeout * 1000 / 4)));
  // A dead coordinator may be restarted (server/coordinator.h): train on meanwhile.
  hopt.coordinator_timeout = std::chrono::milliseconds(static_cast<int64_t>(
      (reg.config.heartbeat_timeout * 3 + reg.config.coordinator_restart_timeout) * 1000));
  hopt.on_coordinator_lost = options.on_job_ending;
  hopt.on_job_stopping = options.on_job_ending;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<HeartbeatSender> heartbeat,
                      HeartbeatSender::Start(transport, hopt));
  json totals = json::object();
  bool done_sent = false;
  Status s =
      Train(reg, kernels.get(), options, transport, stop, &totals, &done_sent, heartbeat.get());
  if (!s.ok() && !done_sent) {
    // Tell the coordinator, so that the job ends instead of waiting for this worker.
    Status told = SendDone(*reg.coordinator, reg.id, totals, s, stop, heartbeat.get());
    if (!told.ok()) LOG(WARNING) << "could not tell the coordinator: " << told.ToString();
  }
  return s;
}

}  // namespace ps
