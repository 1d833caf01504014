#include "server/server_node.h"

#include <glog/logging.h>

#include <deque>
#include <map>
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
          // The slowest live worker's clock here: the coordinator names checkpoint clocks
          // ahead of it (--checkpoint_every=<N>s).
          {"clock", core.CheckpointClock()},
          // What a restart from that checkpoint would roll back (--replicas=1).
          {"pushes_since_checkpoint", core.pushes_since_checkpoint()},
          // A server that replaced a dead one: the clock it restored (-1: the initial
          // values) and how long loading it took.
          {"replacement", core.replacement()},
          {"restored_clock", st.restored_clock},
          {"restore_seconds", core.restore_seconds()},
          {"held", held}};
}

namespace {

// Takes the coordinator's answers to status reports without waiting (the request loop
// must not block on them). Called on every turn of the loop, not only when the next report
// goes out: a clock named for a checkpoint set must reach the core before the workers pass
// it, and a report interval of delay is most of the coordinator's lead.
void DrainReportReplies(ClientSocket& coordinator, ServerCore& core, int64_t* checkpoint_asked) {
  for (;;) {
    Result<std::optional<Frames>> reply = coordinator.TryRecv();
    if (!reply.ok() || !reply->has_value()) break;
    // A reply may name the clock of the next checkpoint set (--checkpoint_every=<N>s).
    Frames& frames = **reply;
    if (frames.empty()) continue;
    Result<DecodedHeader> decoded = DecodedHeader::Decode(frames[0]);
    if (!decoded.ok()) continue;
    try {
      wire::Header::Reader h = decoded->get();
      if (h.getBody().which() != wire::Header::Body::REPORT_REPLY) continue;
      const int64_t at = h.getBody().getReportReply().getCheckpointAt();
      if (at > 0 && at < ServerCore::kMaxClock && at != *checkpoint_asked) {
        *checkpoint_asked = at;  // every reply repeats it: ask once
        core.RequestCheckpointAt(at);
      }
    } catch (const std::exception& e) {
      LOG(WARNING) << "server " << core.server_id() << ": bad report reply: " << e.what();
    }
  }
}

// Sends the server's status to the coordinator (a `report` it answers with reportReply).
// `first_pulls`: for each dead primary this server was promoted for, when (Unix seconds)
// it served the first pull of its shards: the coordinator adds it to the failure entry.
void ReportToCoordinator(ClientSocket& coordinator, ServerCore& core, uint64_t* request_id,
                         const std::map<int, double>& first_pulls) {
  nlohmann::json status = ServerStatusJson(core, ServerCore::Clock::now());
  if (!first_pulls.empty()) {
    nlohmann::json served = nlohmann::json::object();
    for (const auto& [primary, unix_time] : first_pulls) {
      served[std::to_string(primary)] = unix_time;
    }
    status["promoted_first_pull_unix_time"] = std::move(served);
  }
  capnp::MallocMessageBuilder b;
  NewHeader(b, ++*request_id, core.server_id()).getBody().initReport().setJson(status.dump());
  Frames f;
  f.push_back(EncodeFrame(b));
  Status s = coordinator.Send(std::move(f));
  if (!s.ok()) LOG(WARNING) << "server " << core.server_id() << ": status report: " << s.ToString();
}

}  // namespace

Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          std::chrono::milliseconds poll_interval, ClientSocket* coordinator,
                          std::chrono::milliseconds report_interval, ServerMetrics* metrics,
                          BackupStore* backups, BackupLink* backup_link,
                          const HeartbeatSender* heartbeat) {
  // Pull replies are built where the socket sends them from (a peer's shared-memory ring
  // on ipc://); every reply goes out through `socket` on this thread.
  core.set_frame_allocator(
      [&socket](const std::string& peer, size_t bytes) { return socket.NewFrame(peer, bytes); });
  struct Unset {
    ServerCore& core;
    ~Unset() { core.set_frame_allocator(nullptr); }
  } unset{core};
  std::vector<Outgoing> out;
  auto send = [&](std::vector<Outgoing>& replies) {
    for (Outgoing& o : replies) {
      Status sent = socket.Send(o.peer, std::move(o.frames));
      if (!sent.ok()) {
        // The peer left before its reply; nothing to do for it, keep serving the others.
        LOG(WARNING) << "server " << core.server_id() << ": " << sent.ToString();
      }
    }
    replies.clear();
  };
  // Replies held until the backup acknowledged forward number `need` (0: none needed).
  struct HeldReply {
    uint64_t need;
    Outgoing reply;
  };
  std::deque<HeldReply> held;
  std::vector<Outgoing> ready;
  auto release_acknowledged = [&] {
    const uint64_t acked = backup_link->Poll(ServerCore::Clock::now());
    const bool fenced = backup_link->fenced();
    while (!held.empty() && ((backup_link->down() && !fenced) || held.front().need <= acked)) {
      ready.push_back(std::move(held.front().reply));
      held.pop_front();
    }
    send(ready);
    // Declared dead and replaced: what the backup did not acknowledge is never answered
    // (the workers resend it to the promoted backup).
    if (fenced) held.clear();
  };
  uint64_t report_id = 0;
  int64_t checkpoint_asked = -1;
  // Failover: when the first pull of each promoted primary's shards was served here.
  std::map<int, double> first_pull_after_promotion;
  auto next_report = ServerCore::Clock::now();
  auto next_metrics = next_report;
  int64_t reported_checkpoint = core.last_checkpoint_clock();
  while (!stop.load(std::memory_order_relaxed)) {
    if (heartbeat != nullptr && heartbeat->evicted()) {
      LOG(ERROR) << "server " << core.server_id()
                 << ": declared dead and replaced by another process; stopping";
      return FailedPrecondition("server " + std::to_string(core.server_id()) +
                                " was declared dead and replaced");
    }
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
      ReportToCoordinator(*coordinator, core, &report_id, first_pull_after_promotion);
      next_report = ServerCore::Clock::now() + report_interval;
    }
    if (coordinator != nullptr) DrainReportReplies(*coordinator, core, &checkpoint_asked);
    Result<Incoming> in = DeadlineExceeded("");
    if (socket.HasQueued()) {
      in = socket.Recv(std::chrono::milliseconds(0));  // the rest of a batch
    } else if (backup_link != nullptr && !backup_link->down()) {
      // Wake for a request or for the backup's acknowledgements, whichever comes first.
      zmq::pollitem_t items[] = {{socket.PollHandle().handle(), 0, ZMQ_POLLIN, 0},
                                 {backup_link->PollHandle().handle(), 0, ZMQ_POLLIN, 0}};
      const auto wait = held.empty() ? poll_interval : std::chrono::milliseconds(10);
      PollSockets(items, 2, wait);
      if (items[0].revents & ZMQ_POLLIN) in = socket.Recv(std::chrono::milliseconds(0));
    } else {
      in = socket.Recv(poll_interval);
    }
    ServerCore::After after = ServerCore::After::kContinue;
    out.clear();
    if (in.ok() && in->too_many_frames) {
      out.push_back(Outgoing{in->peer, ErrorReply(0, core.server_id(),
                                                  InvalidArgument("message has too many frames "
                                                                  "(see --max_frames)"))});
    } else if (in.ok() && !in->bad_frame.ok()) {
      out.push_back(Outgoing{in->peer, ErrorReply(0, core.server_id(), in->bad_frame)});
    } else if (in.ok()) {
      const RequestKind kind = (backups != nullptr || backup_link != nullptr) ? Classify(in->frames)
                                                                              : RequestKind::kOther;
      // After a failover, requests for a dead primary's shards go to its promoted core.
      ServerCore* promoted = nullptr;
      int target = -1;
      if (backups != nullptr && kind != RequestKind::kReplicate) {
        target = TargetServer(in->frames);
        if (target >= 0 && target != core.server_id()) {
          promoted = backups->promoted(target);
          if (promoted == nullptr) {
            Result<DecodedHeader> h = DecodedHeader::Decode(in->frames[0]);
            uint64_t rid = 0;
            try {
              if (h.ok()) rid = h->get().getRequestId();
            } catch (const std::exception&) {
            }
            std::vector<Outgoing> refused;
            refused.push_back(Outgoing{
                in->peer, ErrorReply(rid, core.server_id(),
                                     Unavailable("server " + std::to_string(core.server_id()) +
                                                 " does not serve the shards of server " +
                                                 std::to_string(target)))});
            send(refused);
            continue;
          }
        }
      }
      if (kind == RequestKind::kPromote) {
        std::vector<Outgoing> ack;
        ack.push_back(Outgoing{
            in->peer, backups != nullptr
                          ? backups->HandlePromote(in->frames)
                          : ErrorReply(0, core.server_id(), FailedPrecondition("not a backup"))});
        // The dead primary may be this server's own backup (S = 2): stop waiting on it.
        if (backups != nullptr && backup_link != nullptr) {
          for (int p : backups->primaries()) {
            if (p == backups->backup_of_self() && backups->is_promoted(p)) {
              backup_link->Abandon(Unavailable("server " + std::to_string(p) +
                                               " was declared dead by the coordinator"));
            }
          }
        }
        send(ack);
      } else if (promoted != nullptr) {
        // Served without a backup (the backup was the dead primary's only copy); replies go
        // at once. A held pull's reply comes out of a later clock tick or the expiry below.
        std::vector<Outgoing> replies;
        ServerCore::After ignored = ServerCore::After::kContinue;
        promoted->Handle(in->peer, in->frames, &replies, &ignored);
        send(replies);
        // stats() sums over tables: asked only until the first pull was served.
        if (first_pull_after_promotion.count(target) == 0 && promoted->stats().pulls_served > 0) {
          const double t = UnixSeconds();
          first_pull_after_promotion[target] = t;
          next_report = ServerCore::Clock::now();  // tell the coordinator now
          LOG(WARNING) << "server " << core.server_id() << ": served the first pull of server "
                       << target << "'s shards since the promotion";
        }
      } else if (kind == RequestKind::kReplicate) {
        // Acknowledged at once, never held behind this server's own forwards: with two
        // servers backing up each other, holding would make each wait on the other.
        std::vector<Outgoing> ack;
        ack.push_back(Outgoing{
            in->peer, backups != nullptr
                          ? backups->Handle(in->frames)
                          : ErrorReply(0, core.server_id(), FailedPrecondition("not a backup"))});
        send(ack);
      } else if (kind == RequestKind::kChangesState && backup_link != nullptr &&
                 !backup_link->down()) {
        // Chain replication: apply here, then have the backup apply the same request; the
        // replies wait (below) until the backup acknowledged it.
        // The forward shares the request's payload buffers (the core only reads a push).
        Frames forward = ShareFrames(in->frames);
        core.Handle(in->peer, in->frames, &out, &after);
        (void)backup_link->Send(std::move(forward));  // a failure marks the link down, logged
      } else {
        core.Handle(in->peer, in->frames, &out, &after);
      }
    } else if (in.status().code() != StatusCode::kDeadlineExceeded) {
      return in.status();
    }
    core.ExpireHeldPulls(ServerCore::Clock::now(), &out);
    if (backups != nullptr && backups->any_promoted()) {
      std::vector<Outgoing> expired;
      for (ServerCore* p : backups->promoted_cores()) {
        p->ExpireHeldPulls(ServerCore::Clock::now(), &expired);
      }
      send(expired);
    }
    if (backup_link != nullptr) {
      // Replies leave in order, each once the backup has everything applied before it.
      const uint64_t need = backup_link->down() ? 0 : backup_link->sent();
      for (Outgoing& o : out) held.push_back(HeldReply{need, std::move(o)});
      out.clear();
      release_acknowledged();
      if (after == ServerCore::After::kShutdown) {
        // Send the last replies once the backup has them, or it is gone.
        while (!held.empty()) {
          zmq::pollitem_t item = {backup_link->PollHandle().handle(), 0, ZMQ_POLLIN, 0};
          if (!backup_link->down()) PollSockets(&item, 1, std::chrono::milliseconds(10));
          release_acknowledged();
        }
      }
    }
    send(out);
    // Replies to a batch leave together once its last request was handled.
    if (Status s = socket.Flush(); !s.ok()) {
      LOG(WARNING) << "server " << core.server_id() << ": " << s.ToString();
    }
    if (backup_link != nullptr && backup_link->fenced()) {
      LOG(ERROR) << "server " << core.server_id()
                 << ": the backup was promoted (this server was declared dead); stopping";
      return FailedPrecondition("server " + std::to_string(core.server_id()) +
                                " was declared dead and its backup promoted");
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
  if (reg.replacement) {
    // Replacing a dead server (--replicas=1): its shards come from the coordinator's latest
    // recorded checkpoint set, not from the job's own --restore.
    reg.config.restore = reg.restore_set;
    LOG(WARNING) << "server " << reg.id << " replaces a dead server; restoring "
                 << (reg.restore_set.empty() ? std::string("nothing (initial values)")
                                             : reg.restore_set);
  }
  const auto restore_start = ServerCore::Clock::now();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerCore> core,
                      ServerCore::Create(reg.config, reg.id, options.store));
  if (reg.replacement) {
    core->BecomeReplacement(
        reg.evicted_workers, reg.idle_workers,
        std::chrono::duration<double>(ServerCore::Clock::now() - restore_start).count());
  }
  core->set_limits(options.limits);
  // Heartbeats from a thread of their own while serving (common/heartbeat.h).
  HeartbeatOptions hopt;
  hopt.coordinator = options.coordinator;
  hopt.is_server = true;
  hopt.id = reg.id;
  hopt.interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(reg.config.heartbeat_timeout * 1000 / 4)));
  hopt.coordinator_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(reg.config.heartbeat_timeout * 3000));
  hopt.on_coordinator_lost = options.on_coordinator_lost;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<HeartbeatSender> heartbeat,
                      HeartbeatSender::Start(transport, hopt));
  std::optional<ServerMetrics> metrics;
  if (options.metrics != nullptr) metrics.emplace(options.metrics);
  // Replication (server/replication.h): this server backs up its predecessor's shards and
  // forwards its own state changes to its successor.
  std::optional<BackupStore> backups;
  std::unique_ptr<BackupLink> backup_link;
  const int backup = BackupOf(reg.config, reg.id);
  if (backup >= 0) {
    backups.emplace(reg.config, reg.id, options.store);
    if (static_cast<size_t>(backup) >= reg.server_endpoints.size()) {
      return Internal("no endpoint for backup server " + std::to_string(backup));
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> link,
                        transport->Connect(reg.server_endpoints[static_cast<size_t>(backup)]));
    // A backup that does not answer within the heartbeat timeout is dead to the
    // coordinator too.
    backup_link = std::make_unique<BackupLink>(
        std::move(link), reg.id,
        std::chrono::milliseconds(static_cast<int64_t>(reg.config.heartbeat_timeout * 1000)));
    LOG(INFO) << "server " << reg.id << ": replicating to server " << backup;
  }
  Status s = ServeUntilShutdown(*socket, *core, stop, options.poll_interval, reg.coordinator.get(),
                                options.report_interval, metrics ? &*metrics : nullptr,
                                backups ? &*backups : nullptr, backup_link.get(), heartbeat.get());
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
    // The copies this server holds as a backup, so that they can be checked against their
    // primaries' exports (equal bit for bit: they applied the same requests in order).
    for (int p : backups ? backups->primaries() : std::vector<int>{}) {
      // A promoted copy is that server's model now.
      std::string copy = options.export_dir + "/server-" + std::to_string(p) +
                         (backups->is_promoted(p) ? ".safetensors" : ".backup.safetensors");
      Status b = backups->shadow(p)->ExportSafetensors(copy);
      if (!b.ok()) LOG(ERROR) << "server " << reg.id << ": backup export failed: " << b.ToString();
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
