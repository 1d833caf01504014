#include "server/coordinator.h"

#include <glog/logging.h>
#include <kj/exception.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/lease_table.h"
#include "common/run_files.h"
#include "common/wire.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Member {
  std::string peer;  // routing identity of its registration socket
  std::string endpoint;
  std::string device;
  std::string host;
  uint32_t pid = 0;
  uint64_t register_request = 0;
  int requested_id = -1;
};

// Ids within a role: requested ids where valid and free, then arrival order.
void AssignIds(std::vector<Member>& members) {
  std::vector<std::optional<Member>> slots(members.size());
  std::vector<Member> rest;
  for (Member& m : members) {
    const int want = m.requested_id;
    if (want >= 0 && want < static_cast<int>(slots.size()) && !slots[static_cast<size_t>(want)]) {
      slots[static_cast<size_t>(want)] = std::move(m);
    } else {
      if (want >= 0) LOG(WARNING) << "requested id " << want << " is taken or out of range";
      rest.push_back(std::move(m));
    }
  }
  size_t next = 0;
  for (auto& slot : slots) {
    if (!slot) slot = std::move(rest[next++]);
  }
  members.clear();
  for (auto& slot : slots) members.push_back(std::move(*slot));
}

struct WorkerResult {
  bool done = false;
  bool failed = false;
  std::string message;
  json totals = json::object();
  uint64_t done_request = 0;
};

class CoordinatorJob {
 public:
  CoordinatorJob(const JobConfig& config, const CoordinatorOptions& options, Transport* transport)
      : config_(config),
        options_(options),
        transport_(transport),
        leases_(config.epochs, static_cast<uint64_t>(config.chunk_examples)) {}

  Status Run(const std::atomic<bool>& stop) {
    PS_RETURN_IF_ERROR(MakeDirs(options_.run_dir));
    PS_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(options_.run_dir + "/metrics.jsonl"));
    PS_ASSIGN_OR_RETURN(socket_, transport_->Listen(options_.listen));
    LOG(INFO) << "coordinator listening on " << socket_->BoundEndpoint();
    if (!options_.endpoint_file.empty()) {
      PS_RETURN_IF_ERROR(WriteTextFile(options_.endpoint_file, socket_->BoundEndpoint() + "\n"));
    }
    job_start_ = Clock::now();
    Status outcome = Register(stop);
    if (!outcome.ok()) {
      // Tell whoever did register, so that no process waits on a job that will not start.
      for (const auto* group : {&servers_, &workers_}) {
        for (const Member& m : *group) ReplyError(m.peer, m.register_request, outcome);
      }
      servers_.clear();
    } else {
      outcome = Train(stop);
    }
    json servers = json::array();
    // Servers are shut down whatever happened, so that no process outlives the job.
    Status shut = ShutdownServers(&servers);
    if (outcome.ok()) outcome = shut;
    Status written = WriteSummary(outcome, servers);
    if (outcome.ok()) outcome = written;
    return outcome;
  }

 private:
  static Status WriteTextFile(const std::string& path, const std::string& text) {
    std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) return Unavailable("cannot write " + tmp);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return Unavailable("cannot rename " + tmp);
    return Status::Ok();
  }

  Status Send(const std::string& peer, capnp::MallocMessageBuilder& b) {
    Frames f;
    f.push_back(EncodeFrame(b));
    return socket_->Send(peer, std::move(f));
  }

  void ReplyError(const std::string& peer, uint64_t request_id, const Status& error) {
    LOG(WARNING) << "coordinator: rejecting a request: " << error.ToString();
    Status s = socket_->Send(peer, ErrorReply(request_id, -1, error));
    if (!s.ok()) LOG(WARNING) << "coordinator: " << s.ToString();
  }

  // Decodes a request; on failure answers with an error and returns nullopt.
  std::optional<DecodedHeader> Decode(Incoming& in) {
    if (in.frames.empty()) return std::nullopt;
    Result<DecodedHeader> h = DecodedHeader::Decode(in.frames[0]);
    if (!h.ok()) {
      ReplyError(in.peer, 0, h.status());
      return std::nullopt;
    }
    Status v = CheckProtocolVersion(h->get());
    if (!v.ok()) {
      ReplyError(in.peer, h->get().getRequestId(), v);
      return std::nullopt;
    }
    return std::move(h).value();
  }

  Status Register(const std::atomic<bool>& stop) {
    const auto deadline = Clock::now() + options_.register_timeout;
    std::printf("waiting for %d servers and %d workers to register on %s\n", config_.num_servers,
                config_.num_workers, socket_->BoundEndpoint().c_str());
    std::fflush(stdout);
    while (static_cast<int>(servers_.size()) < config_.num_servers ||
           static_cast<int>(workers_.size()) < config_.num_workers) {
      if (stop.load()) return Aborted("coordinator stopped by signal during registration");
      if (Clock::now() > deadline) {
        return DeadlineExceeded("only " + std::to_string(servers_.size()) + " of " +
                                std::to_string(config_.num_servers) + " servers and " +
                                std::to_string(workers_.size()) + " of " +
                                std::to_string(config_.num_workers) +
                                " workers registered within " +
                                std::to_string(options_.register_timeout.count()) + " ms");
      }
      Result<Incoming> in = socket_->Recv(options_.poll_interval);
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
        return in.status();
      }
      std::optional<DecodedHeader> h = Decode(*in);
      if (!h) continue;
      try {
        auto header = h->get();
        if (header.getBody().which() != wire::Header::Body::REGISTER) {
          ReplyError(in->peer, header.getRequestId(),
                     FailedPrecondition("the job is still assembling: only registrations are "
                                        "accepted now"));
          continue;
        }
        auto reg = header.getBody().getRegister();
        Member m;
        m.peer = in->peer;
        m.endpoint = reg.getEndpoint().cStr();
        m.device = reg.getDevice().cStr();
        m.host = reg.getHost().cStr();
        m.pid = reg.getPid();
        m.register_request = header.getRequestId();
        m.requested_id = reg.getRequestedId();
        if (reg.getRole() == wire::Role::SERVER) {
          if (static_cast<int>(servers_.size()) >= config_.num_servers) {
            ReplyError(in->peer, m.register_request,
                       FailedPrecondition("the job is full: it has all " +
                                          std::to_string(config_.num_servers) +
                                          " of its servers (--num_servers)"));
            continue;
          }
          Status ep = ValidateEndpoint(m.endpoint);
          if (!ep.ok()) {
            ReplyError(in->peer, m.register_request, ep);
            continue;
          }
          LOG(INFO) << "server registered: " << m.endpoint << " (pid " << m.pid << " on " << m.host
                    << ")";
          servers_.push_back(std::move(m));
        } else if (reg.getRole() == wire::Role::WORKER) {
          if (static_cast<int>(workers_.size()) >= config_.num_workers) {
            ReplyError(in->peer, m.register_request,
                       FailedPrecondition("the job is full: it has all " +
                                          std::to_string(config_.num_workers) +
                                          " of its workers (--num_workers)"));
            continue;
          }
          LOG(INFO) << "worker registered: " << m.device << " (pid " << m.pid << " on " << m.host
                    << ")";
          workers_.push_back(std::move(m));
        } else {
          ReplyError(in->peer, m.register_request, InvalidArgument("unknown role"));
        }
      } catch (const kj::Exception& e) {
        ReplyError(
            in->peer, 0,
            InvalidArgument(std::string("malformed registration: ") + e.getDescription().cStr()));
      }
    }
    // Everyone is here: hand out ids, the config and the shard map.
    AssignIds(servers_);
    AssignIds(workers_);
    std::map<std::string, std::string> flags = config_.ToFlagMap();
    auto reply_to = [&](const Member& m, uint32_t id) -> Status {
      capnp::MallocMessageBuilder b;
      auto r = NewHeader(b, m.register_request, -1).getBody().initRegisterReply();
      r.setId(id);
      auto cfg = r.initConfig(static_cast<unsigned>(flags.size()));
      unsigned i = 0;
      for (const auto& [k, v] : flags) {
        cfg[i].setKey(k);
        cfg[i].setValue(v);
        ++i;
      }
      auto map = r.initShardMap();
      map.setVersion(1);
      auto list = map.initServers(static_cast<unsigned>(servers_.size()));
      for (unsigned s = 0; s < servers_.size(); ++s) {
        list[s].setId(s);
        list[s].setEndpoint(servers_[s].endpoint);
      }
      return Send(m.peer, b);
    };
    for (uint32_t i = 0; i < servers_.size(); ++i) PS_RETURN_IF_ERROR(reply_to(servers_[i], i));
    for (uint32_t i = 0; i < workers_.size(); ++i) PS_RETURN_IF_ERROR(reply_to(workers_[i], i));
    results_.resize(workers_.size());
    rates_.assign(workers_.size(), 0.0);
    train_start_ = Clock::now();
    std::printf("job assembled: %d servers, %d workers; training %d epochs\n", config_.num_servers,
                config_.num_workers, config_.epochs);
    std::fflush(stdout);
    return Status::Ok();
  }

  // Workers' JSON is input from the network: every field the coordinator reads must have
  // the type it reads it as, or nlohmann::json would throw.
  static Status CheckReportFields(const json& j) {
    for (const char* key : {"examples", "loss", "epoch", "epoch_fraction", "test_loss",
                            "test_accuracy", "test_auc", "seconds", "steps", "wait_seconds",
                            "compute_seconds", "batch_size", "worker"}) {
      if (j.contains(key) && !j[key].is_number()) {
        return InvalidArgument(std::string("report field '") + key + "' must be a number");
      }
    }
    for (const char* key : {"kind", "device"}) {
      if (j.contains(key) && !j[key].is_string()) {
        return InvalidArgument(std::string("report field '") + key + "' must be a string");
      }
    }
    if (j.contains("final") && !j["final"].is_boolean()) {
      return InvalidArgument("report field 'final' must be true or false");
    }
    return Status::Ok();
  }

  int WorkerIndex(const std::string& peer) const {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].peer == peer) return static_cast<int>(i);
    }
    return -1;
  }

  Status Train(const std::atomic<bool>& stop) {
    bool barrier_released = false;
    Clock::time_point barrier_time;
    while (!final_eval_) {
      if (stop.load()) return Aborted("coordinator stopped by signal");
      if (barrier_released && Clock::now() - barrier_time > options_.final_eval_timeout) {
        return DeadlineExceeded("worker 0 sent no final evaluation within " +
                                std::to_string(options_.final_eval_timeout.count()) + " ms");
      }
      Result<Incoming> in = socket_->Recv(options_.poll_interval);
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
        return in.status();
      }
      std::optional<DecodedHeader> h = Decode(*in);
      if (!h) continue;
      int w = WorkerIndex(in->peer);
      try {
        auto header = h->get();
        uint64_t rid = header.getRequestId();
        if (w < 0) {
          ReplyError(in->peer, rid,
                     FailedPrecondition("the job is running and full; this peer "
                                        "is not one of its workers"));
          continue;
        }
        switch (header.getBody().which()) {
          case wire::Header::Body::REPORT: {
            json report = json::parse(header.getBody().getReport().getJson().cStr(), nullptr,
                                      /*allow_exceptions=*/false);
            if (!report.is_object()) {
              ReplyError(in->peer, rid, InvalidArgument("a report must be one JSON object"));
              continue;
            }
            report["worker"] = w;
            Status fields = CheckReportFields(report);
            if (!fields.ok()) {
              ReplyError(in->peer, rid, fields);
              continue;
            }
            OnReport(report);
            capnp::MallocMessageBuilder b;
            NewHeader(b, rid, -1).getBody().setReportReply();
            PS_RETURN_IF_ERROR(Send(in->peer, b));
            break;
          }
          case wire::Header::Body::DONE: {
            auto done = header.getBody().getDone();
            WorkerResult& r = results_[static_cast<size_t>(w)];
            r.done = true;
            r.failed = done.getFailed();
            r.message = done.getMessage().cStr();
            r.done_request = rid;
            json totals = json::parse(done.getJson().cStr(), nullptr, false);
            if (totals.is_object() && CheckReportFields(totals).ok()) {
              r.totals = totals;
            } else {
              LOG(WARNING) << "worker " << w << " sent malformed totals; they are left out";
            }
            if (r.failed) {
              LOG(ERROR) << "worker " << w << " failed: " << r.message;
              // Its unfinished chunks go back to the queue for the others.
              int returned = leases_.Release(w);
              if (returned > 0) {
                LOG(INFO) << "returned " << returned << " chunks of worker " << w;
                PS_RETURN_IF_ERROR(AnswerHeldLeases());
              }
            }
            bool all_done = true;
            for (const WorkerResult& x : results_) all_done &= x.done;
            if (all_done && !barrier_released) {
              barrier_released = true;
              barrier_time = Clock::now();
              for (size_t i = 0; i < workers_.size(); ++i) {
                capnp::MallocMessageBuilder b;
                NewHeader(b, results_[i].done_request, -1).getBody().setDoneReply();
                Status s = Send(workers_[i].peer, b);
                if (!s.ok()) LOG(WARNING) << "worker " << i << ": " << s.ToString();
              }
              if (results_[0].failed) {
                return Internal("worker 0 failed, so there is no final evaluation: " +
                                results_[0].message);
              }
            }
            break;
          }
          case wire::Header::Body::HEARTBEAT: {
            capnp::MallocMessageBuilder b;
            NewHeader(b, rid, -1).getBody().setHeartbeatReply();
            PS_RETURN_IF_ERROR(Send(in->peer, b));
            break;
          }
          case wire::Header::Body::LEASE:
            PS_RETURN_IF_ERROR(OnLease(in->peer, w, rid, header.getBody().getLease()));
            break;
          default:
            ReplyError(in->peer, rid,
                       InvalidArgument("the coordinator does not handle this "
                                       "message type during training"));
        }
      } catch (const kj::Exception& e) {
        ReplyError(in->peer, 0,
                   InvalidArgument(std::string("malformed request: ") + e.getDescription().cStr()));
      }
      PrintProgress(false);
    }
    for (size_t i = 0; i < results_.size(); ++i) {
      if (results_[i].failed) {
        return Internal("worker " + std::to_string(i) + " failed: " + results_[i].message);
      }
    }
    return Status::Ok();
  }

  // A worker finished a chunk and/or wants the next one.
  Status OnLease(const std::string& peer, int w, uint64_t rid, wire::LeaseRequest::Reader req) {
    Status size = leases_.SetDatasetSize(req.getDatasetSize());
    if (!size.ok()) {
      ReplyError(peer, rid, size);
      return Status::Ok();
    }
    if (req.getCompletedEpoch() > 0) {
      Status done = leases_.Complete(w, req.getCompletedEpoch(), req.getCompletedChunk());
      if (!done.ok()) {
        ReplyError(peer, rid, done);
        return Status::Ok();
      }
      for (int e : leases_.TakeCompletedEpochs()) {
        if (e < config_.epochs) evaluations_.push_back(e);  // the last one is the final eval
      }
    }
    if (req.getExamplesPerSec() > 0) rates_[static_cast<size_t>(w)] = req.getExamplesPerSec();
    held_leases_.push_back(HeldLease{peer, rid, w, req.getWait()});
    return AnswerHeldLeases();
  }

  // Answers every lease request that can be answered now: with a chunk, with `finished`
  // once every epoch is done, or (for a request that may not wait) with `wait`.
  Status AnswerHeldLeases() {
    for (auto it = held_leases_.begin(); it != held_leases_.end();) {
      capnp::MallocMessageBuilder b;
      auto reply = NewHeader(b, it->request_id, -1).getBody().initLeaseReply();
      reply.setBatchSize(BatchSizeFor(it->worker));
      if (it->worker == 0 && !evaluations_.empty()) {
        reply.setEvaluateEpoch(evaluations_.front());
        evaluations_.erase(evaluations_.begin());
      }
      if (std::optional<LeaseTable::Lease> lease = leases_.Acquire(it->worker)) {
        auto chunk = reply.initChunk();
        chunk.setEpoch(lease->epoch);
        chunk.setIndex(lease->chunk);
        chunk.setBegin(lease->begin);
        chunk.setEnd(lease->end);
      } else if (leases_.AllDone()) {
        reply.setFinished();
      } else if (!it->may_wait) {
        reply.setWait();
      } else {
        ++it;  // held until a chunk comes back or the job is done
        continue;
      }
      PS_RETURN_IF_ERROR(Send(it->peer, b));
      it = held_leases_.erase(it);
    }
    return Status::Ok();
  }

  // --batch_size=auto: batches proportional to the workers' throughput, batch_size on
  // average, so that every worker's clock ticks at about the same pace.
  uint32_t BatchSizeFor(int w) const {
    const double base = config_.batch_size;
    if (!config_.auto_batch) return static_cast<uint32_t>(base);
    double sum = 0;
    int known = 0;
    for (double r : rates_) {
      if (r > 0) {
        sum += r;
        ++known;
      }
    }
    const double mine = rates_[static_cast<size_t>(w)];
    if (known < static_cast<int>(rates_.size()) || mine <= 0 || sum <= 0) {
      return static_cast<uint32_t>(base);
    }
    const double b = base * known * mine / sum;
    return static_cast<uint32_t>(std::clamp(b, 1.0, base * known));
  }

  void OnReport(const json& report) {
    metrics_->Append(report);
    std::string kind = report.value("kind", "");
    if (kind == "train") {
      uint64_t n = report.value("examples", uint64_t{0});
      examples_total_ += n;
      loss_sum_since_print_ += report.value("loss", 0.0) * static_cast<double>(n);
      loss_examples_since_print_ += n;
      if (report.value("worker", -1) == 0) {
        epoch_ = report.value("epoch", epoch_);
        epoch_fraction_ = report.value("epoch_fraction", epoch_fraction_);
      }
    } else if (kind == "eval") {
      last_eval_ = report;
      bool final_eval = report.value("final", false);
      int epoch = report.value("epoch", 0);
      double elapsed = Elapsed();
      double train_loss =
          loss_examples_since_print_ > 0
              ? loss_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
              : 0.0;
      double rate = examples_total_ / std::max(elapsed, 1e-9);
      std::string auc =
          report.contains("test_auc")
              ? "  test_auc " + std::to_string(report.value("test_auc", 0.0)).substr(0, 6)
              : "";
      std::printf(
          "epoch %d/%d  train_loss %.4f  test_loss %.4f  test_acc %.4f%s  %.0f ex/s  %.1fs%s\n",
          epoch, config_.epochs, train_loss, report.value("test_loss", 0.0),
          report.value("test_accuracy", 0.0), auc.c_str(), rate, elapsed,
          final_eval ? "  (final)" : "");
      std::fflush(stdout);
      loss_sum_since_print_ = 0;
      loss_examples_since_print_ = 0;
      last_print_time_ = elapsed;
      examples_at_last_print_ = examples_total_;
      if (final_eval) final_eval_ = report;
    }
  }

  void PrintProgress(bool force) {
    if (options_.progress_every_seconds <= 0) return;
    double now = Elapsed();
    if (!force && now - last_print_time_ < options_.progress_every_seconds) return;
    double dt = now - last_print_time_;
    double rate = dt > 0 ? (examples_total_ - examples_at_last_print_) / dt : 0;
    double loss = loss_examples_since_print_ > 0
                      ? loss_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
                      : 0.0;
    std::printf("  epoch %d/%d %3.0f%%  %.0f ex/s  train_loss %.4f  %.1fs\n", epoch_,
                config_.epochs, 100.0 * epoch_fraction_, rate, loss, now);
    std::fflush(stdout);
    last_print_time_ = now;
    examples_at_last_print_ = examples_total_;
  }

  Status ShutdownServers(json* out) {
    Status first_error;
    for (size_t s = 0; s < servers_.size(); ++s) {
      json entry = {{"id", s}, {"endpoint", servers_[s].endpoint}};
      Result<CallReply> reply = Unavailable("not contacted");
      Result<std::unique_ptr<ClientSocket>> sock = transport_->Connect(servers_[s].endpoint);
      if (sock.ok()) {
        capnp::MallocMessageBuilder b;
        NewHeader(b, 1, -1).getBody().setShutdown();
        Frames f;
        f.push_back(EncodeFrame(b));
        reply = Call(**sock, std::move(f), options_.shutdown_timeout);
      } else {
        reply = sock.status();
      }
      if (reply.ok() &&
          reply->header.get().getBody().which() == wire::Header::Body::SHUTDOWN_REPLY) {
        auto st = reply->header.get().getBody().getShutdownReply();
        entry["pushes_applied"] = st.getPushesApplied();
        entry["pushes_rejected"] = st.getPushesRejected();
        entry["pulls_served"] = st.getPullsServed();
        entry["bytes_pushed"] = st.getBytesPushed();
        entry["bytes_pulled"] = st.getBytesPulled();
        entry["rows_held"] = st.getRowsHeld();
        entry["pushes_dropped"] = st.getPushesDropped();
        entry["pulls_held"] = st.getPullsHeld();
        entry["max_clock_lag"] = st.getMaxClockLag();
        entry["staleness_sum"] = st.getStalenessSum();
        entry["staleness_max"] = st.getStalenessMax();
        json hist = json::array();
        for (uint64_t c : st.getStalenessHistogram()) hist.push_back(c);
        entry["staleness_histogram"] = hist;
      } else {
        Status e = reply.ok() ? Internal("unexpected reply to shutdown") : reply.status();
        LOG(ERROR) << "server " << s << " did not shut down cleanly: " << e.ToString();
        entry["error"] = e.ToString();
        if (first_error.ok()) first_error = e.WithContext("server " + std::to_string(s));
      }
      out->push_back(entry);
    }
    return first_error;
  }

  Status WriteSummary(const Status& outcome, const json& servers) {
    double wall = std::chrono::duration<double>(Clock::now() - job_start_).count();
    double train_seconds = results_.empty() ? 0.0 : Elapsed();
    json summary;
    summary["status"] = outcome.ok() ? "ok" : "failed";
    if (!outcome.ok()) summary["error"] = outcome.ToString();
    const json& eval = final_eval_ ? *final_eval_ : last_eval_;
    summary["test_accuracy"] = eval.is_object() ? eval.value("test_accuracy", 0.0) : 0.0;
    summary["test_loss"] = eval.is_object() ? eval.value("test_loss", 0.0) : 0.0;
    if (eval.is_object() && eval.contains("test_auc")) summary["test_auc"] = eval["test_auc"];
    summary["epochs"] = config_.epochs;
    summary["wall_seconds"] = wall;
    summary["train_seconds"] = train_seconds;
    uint64_t examples = 0;
    json workers = json::array();
    for (size_t i = 0; i < workers_.size(); ++i) {
      const json& t = i < results_.size() ? results_[i].totals : json::object();
      uint64_t n = t.value("examples", uint64_t{0});
      examples += n;
      double secs = t.value("seconds", 0.0);
      workers.push_back({{"id", i},
                         {"device", workers_[i].device},
                         {"host", workers_[i].host},
                         {"examples", n},
                         {"steps", t.value("steps", int64_t{0})},
                         {"seconds", secs},
                         {"wait_seconds", t.value("wait_seconds", 0.0)},
                         {"compute_seconds", t.value("compute_seconds", 0.0)},
                         {"batch_size", t.value("batch_size", 0)},
                         {"examples_per_sec", secs > 0 ? n / secs : 0.0},
                         {"failed", i < results_.size() && results_[i].failed}});
    }
    summary["examples"] = examples;
    summary["examples_per_epoch"] = leases_.examples_per_epoch();
    summary["batch_size"] = config_.auto_batch ? json("auto") : json(config_.batch_size);
    summary["examples_per_sec"] = train_seconds > 0 ? examples / train_seconds : 0.0;
    uint64_t applied = 0, rejected = 0, dropped = 0, pushed = 0, pulled = 0, held = 0;
    uint64_t staleness_sum = 0, staleness_max = 0;
    int64_t max_lag = 0;
    std::vector<uint64_t> histogram;
    for (const json& s : servers) {
      applied += s.value("pushes_applied", uint64_t{0});
      rejected += s.value("pushes_rejected", uint64_t{0});
      dropped += s.value("pushes_dropped", uint64_t{0});
      pushed += s.value("bytes_pushed", uint64_t{0});
      pulled += s.value("bytes_pulled", uint64_t{0});
      held += s.value("pulls_held", uint64_t{0});
      staleness_sum += s.value("staleness_sum", uint64_t{0});
      staleness_max = std::max(staleness_max, s.value("staleness_max", uint64_t{0}));
      max_lag = std::max(max_lag, s.value("max_clock_lag", int64_t{0}));
      if (s.contains("staleness_histogram")) {
        const json& h = s["staleness_histogram"];
        if (histogram.size() < h.size()) histogram.resize(h.size(), 0);
        for (size_t i = 0; i < h.size(); ++i) histogram[i] += h[i].get<uint64_t>();
      }
    }
    summary["pushes_applied"] = applied;
    summary["pushes_rejected"] = rejected;
    summary["pushes_dropped"] = dropped;
    summary["pulls_held"] = held;
    summary["staleness"] = config_.staleness;
    summary["max_clock_lag_seen"] = max_lag;
    summary["max_staleness_seen"] = staleness_max;
    summary["mean_staleness"] = applied > 0 ? static_cast<double>(staleness_sum) / applied : 0.0;
    {
      // p99 of the gradients' staleness, from the servers' merged histograms.
      uint64_t total = 0, seen = 0;
      for (uint64_t c : histogram) total += c;
      size_t p99 = 0;
      for (size_t i = 0; i < histogram.size(); ++i) {
        seen += histogram[i];
        if (seen * 100 >= total * 99) {
          p99 = i;
          break;
        }
      }
      summary["p99_staleness"] = p99;
    }
    double wait_total = 0;
    for (const json& w : workers) wait_total += w.value("wait_seconds", 0.0);
    summary["wait_seconds"] = wait_total;
    summary["bytes_pushed"] = pushed;
    summary["bytes_pulled"] = pulled;
    summary["workers"] = workers;
    summary["servers"] = servers;
    summary["config"] = config_.ToFlagMap();
    std::string path = options_.run_dir + "/summary.json";
    PS_RETURN_IF_ERROR(WriteJsonFile(path, summary));
    std::printf("%s: test_acc %.4f  test_loss %.4f  %.0f ex/s  %.1fs wall  -> %s\n",
                outcome.ok() ? "done" : "FAILED", summary["test_accuracy"].get<double>(),
                summary["test_loss"].get<double>(), summary["examples_per_sec"].get<double>(), wall,
                path.c_str());
    std::fflush(stdout);
    return Status::Ok();
  }

  double Elapsed() const {
    return std::chrono::duration<double>(Clock::now() - train_start_).count();
  }

  JobConfig config_;
  CoordinatorOptions options_;
  Transport* transport_;
  std::unique_ptr<ServerSocket> socket_;
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<Member> servers_, workers_;
  std::vector<WorkerResult> results_;
  Clock::time_point job_start_, train_start_;

  // Data leases.
  struct HeldLease {
    std::string peer;
    uint64_t request_id;
    int worker;
    bool may_wait;
  };
  LeaseTable leases_;
  std::vector<HeldLease> held_leases_;
  std::vector<double> rates_;     // workers' compute throughput, examples/s
  std::vector<int> evaluations_;  // epochs worker 0 should evaluate

  // Progress, from workers' reports.
  uint64_t examples_total_ = 0;
  uint64_t examples_at_last_print_ = 0;
  double loss_sum_since_print_ = 0;
  uint64_t loss_examples_since_print_ = 0;
  double last_print_time_ = 0;
  int epoch_ = 1;
  double epoch_fraction_ = 0;
  std::optional<json> final_eval_;
  json last_eval_;
};

}  // namespace

Status RunCoordinator(const JobConfig& config, const CoordinatorOptions& options,
                      Transport* transport, const std::atomic<bool>& stop) {
  if (options.run_dir.empty()) return InvalidArgument("the coordinator needs a run directory");
  CoordinatorJob job(config, options, transport);
  return job.Run(stop);
}

}  // namespace ps
