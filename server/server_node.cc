#include "server/server_node.h"

#include <glog/logging.h>

#include <optional>

#include "common/heartbeat.h"
#include "common/registration.h"
#include "common/run_files.h"
#include "common/wire.h"

namespace ps {

nlohmann::json ServerStatusJson(const ServerCore& core, ServerCore::Clock::time_point now) {
  const ServerStats st = core.stats();
  nlohmann::json held = nlohmann::json::array();
  for (const ServerCore::HeldPullInfo& h : core.HeldPulls(now)) {
    held.push_back({{"worker", h.worker}, {"waits_on", h.waits_on}, {"seconds", h.seconds}});
  }
  return {{"kind", "server"},
          {"server", core.server_id()},
          {"shards", core.shards_held()},
          {"rows", st.rows_held},
          {"rows_in_memory", st.rows_in_memory},
          {"rows_spilled", st.rows_spilled},
          {"cache_hits", st.cache_hits},
          {"cache_misses", st.cache_misses},
          {"pushes", st.pushes_applied},
          {"pushes_rejected", st.pushes_rejected},
          {"pulls", st.pulls_served},
          {"bytes_pushed", st.bytes_pushed},
          {"bytes_pulled", st.bytes_pulled},
          {"queue_depth", held.size()},
          // The latest checkpoint this server committed (or restored): the coordinator
          // records a set once every server has it (server/checkpoint.h).
          {"checkpoint_clock", core.last_checkpoint_clock()},
          {"held", held}};
}

namespace {

// Sends the server's status to the coordinator (a `report` it answers with reportReply,
// which is drained here without waiting: the request loop must not block on it).
void ReportToCoordinator(ClientSocket& coordinator, const ServerCore& core, uint64_t* request_id) {
  for (;;) {
    Result<std::optional<Frames>> reply = coordinator.TryRecv();
    if (!reply.ok() || !reply->has_value()) break;
  }
  capnp::MallocMessageBuilder b;
  NewHeader(b, ++*request_id, core.server_id())
      .getBody()
      .initReport()
      .setJson(ServerStatusJson(core, ServerCore::Clock::now()).dump());
  Frames f;
  f.push_back(EncodeFrame(b));
  Status s = coordinator.Send(std::move(f));
  if (!s.ok()) LOG(WARNING) << "server " << core.server_id() << ": status report: " << s.ToString();
}

}  // namespace

Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          std::chrono::milliseconds poll_interval, ClientSocket* coordinator,
                          std::chrono::milliseconds report_interval, ServerMetrics* metrics) {
  std::vector<Outgoing> out;
  uint64_t report_id = 0;
  auto next_report = ServerCore::Clock::now();
  auto next_metrics = next_report;
  int64_t reported_checkpoint = core.last_checkpoint_clock();
  while (!stop.load(std::memory_order_relaxed)) {
    if (core.last_checkpoint_clock() != reported_checkpoint) {
      // A new checkpoint: report now, so that the coordinator records the set soon after.
      reported_checkpoint = core.last_checkpoint_clock();
      next_report = ServerCore::Clock::now();
    }
    if (metrics != nullptr && ServerCore::Clock::now() >= next_metrics) {
      metrics->Update(core);
      next_metrics = ServerCore::Clock::now() + std::chrono::milliseconds(250);
    }
    if (coordinator != nullptr && report_interval.count() > 0 &&
        ServerCore::Clock::now() >= next_report) {
      ReportToCoordinator(*coordinator, core, &report_id);
      next_report = ServerCore::Clock::now() + report_interval;
    }
    Result<Incoming> in = socket.Recv(poll_interval);
    ServerCore::After after = ServerCore::After::kContinue;
    out.clear();
    if (in.ok() && in->too_many_frames) {
      out.push_back(Outgoing{in->peer, ErrorReply(0, core.server_id(),
                                                  InvalidArgument("message has too many frames "
                                                                  "(see --max_frames)"))});
    } else if (in.ok()) {
      core.Handle(in->peer, in->frames, &out, &after);
    } else if (in.status().code() != StatusCode::kDeadlineExceeded) {
      return in.status();
    }
    core.ExpireHeldPulls(ServerCore::Clock::now(), &out);
    for (Outgoing& o : out) {
      Status sent = socket.Send(o.peer, std::move(o.frames));
      if (!sent.ok()) {
        // The peer left before its reply; nothing to do for it, keep serving the others.
        LOG(WARNING) << "server " << core.server_id() << ": " << sent.ToString();
      }
    }
    if (after == ServerCore::After::kShutdown) {
      LOG(INFO) << "server " << core.server_id() << ": shutdown requested";
      return Status::Ok();
    }
  }
  return Aborted("server stopped by signal");
}

Status RunServer(const ServerOptions& options, Transport* transport,
                 const std::atomic<bool>& stop) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerSocket> socket, transport->Listen(options.listen));
  LOG(INFO) << "server listening on " << socket->BoundEndpoint();
  RegisterRequest req;
  req.is_server = true;
  req.endpoint = socket->BoundEndpoint();
  req.requested_id = options.requested_id;
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, options.coordinator, req,
                                                                options.register_timeout));
  LOG(INFO) << "registered as server " << reg.id << " of " << reg.config.num_servers;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerCore> core,
                      ServerCore::Create(reg.config, reg.id, options.store));
  core->set_limits(options.limits);
  // Heartbeats from a thread of their own while serving (common/heartbeat.h).
  HeartbeatOptions hopt;
  hopt.coordinator = options.coordinator;
  hopt.is_server = true;
  hopt.id = reg.id;
  hopt.interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(reg.config.heartbeat_timeout * 1000 / 4)));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<HeartbeatSender> heartbeat,
                      HeartbeatSender::Start(transport, hopt));
  std::optional<ServerMetrics> metrics;
  if (options.metrics != nullptr) metrics.emplace(options.metrics);
  Status s = ServeUntilShutdown(*socket, *core, stop, options.poll_interval, reg.coordinator.get(),
                                options.report_interval, metrics ? &*metrics : nullptr);
  if (s.code() == StatusCode::kAborted && !reg.config.checkpoint_dir.empty()) {
    // Stopped by a signal: keep what was trained since the last checkpoint, unless one at
    // this clock already stands (it is the consistent one).
    const int64_t clock = core->CheckpointClock();
    if (clock > core->last_checkpoint_clock()) {
      Status c = core->WriteCheckpoint(clock);
      if (!c.ok()) LOG(ERROR) << "server " << reg.id << ": checkpoint on stop: " << c.ToString();
    }
  }
  if (s.ok() && !options.export_dir.empty()) {
    std::string path = options.export_dir + "/server-" + std::to_string(reg.id) + ".safetensors";
    Status e = MakeDirs(options.export_dir);
    if (e.ok()) e = core->ExportSafetensors(path);
    if (e.ok()) {
      LOG(INFO) << "server " << reg.id << ": model written to " << path;
    } else {
      LOG(ERROR) << "server " << reg.id << ": export failed: " << e.ToString();
      s = e;
    }
  }
  ServerStats st = core->stats();
  LOG(INFO) << "server " << reg.id << " done: pushes applied " << st.pushes_applied << ", rejected "
            << st.pushes_rejected << ", pulls " << st.pulls_served << ", rows held " << st.rows_held
            << " (in memory " << st.rows_in_memory << ", spilled " << st.rows_spilled
            << "), cache hits " << st.cache_hits << ", misses " << st.cache_misses
            << ", RocksDB bytes read " << st.spill_bytes_read << ", written "
            << st.spill_bytes_written << ", peak RSS " << st.peak_rss_bytes;
  return s;
}

}  // namespace ps
