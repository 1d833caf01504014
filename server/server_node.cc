#include "server/server_node.h"

#include <glog/logging.h>

#include <deque>
#include <map>
#include <optional>
#include <set>

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

// One ServeUntilShutdown call. A turn of the loop takes care of reports and metrics,
// receives at most one request (a batch's requests come one turn each), handles it, expires
// held pulls, and sends the replies (held until the backup acknowledged what they answer).
class RequestLoop {
 public:
  RequestLoop(ServerSocket& socket, ServerCore& core, const ServeOptions& options)
      : socket_(socket),
        core_(core),
        options_(options),
        link_(options.backup_link),
        awaiting_seed_(options.awaiting_seed) {
    // Pull replies are built where the socket sends them from (a peer's shared-memory ring
    // on ipc://); every reply goes out through `socket` on this thread.
    core_.set_frame_allocator(
        [&socket](const std::string& peer, size_t bytes) { return socket.NewFrame(peer, bytes); });
    next_report_ = ServerCore::Clock::now();
    next_metrics_ = next_report_;
    reported_checkpoint_ = core_.last_checkpoint_clock();
  }
  ~RequestLoop() { core_.set_frame_allocator(nullptr); }
  RequestLoop(const RequestLoop&) = delete;
  RequestLoop& operator=(const RequestLoop&) = delete;

  Status Run(const std::atomic<bool>& stop);

 private:
  // A reply held until the backup acknowledged forward number `need` (0: none needed).
  struct HeldReply {
    uint64_t need;
    Outgoing reply;
  };

  // The heartbeat's verdict, metrics, and the coordinator's reports, before a request.
  Status Housekeep();
  // The next request, or DeadlineExceeded when none came within the poll interval.
  Result<Incoming> Receive();
  // Handles one request: the core's replies go to *out, the others are sent here. False
  // when the request was refused, which ends the turn.
  bool Dispatch(Incoming& in, std::vector<Outgoing>* out, ServerCore::After* after);
  // A request for shards this server does not serve (another server's, not promoted here).
  void RefuseForeign(const Incoming& in, int target);
  void Promote(Incoming& in);
  // Re-replication (server/replication.h): the coordinator's `rereplicate`, and a restarted
  // server's own shards arriving (`seed`).
  void Rereplicate(Incoming& in);
  Result<Frames> RereplicateReply(const Frames& request);
  Status HandBack(int primary, const std::string& endpoint, size_t* bytes);
  Status Relink(int primary, const std::string& endpoint, size_t* bytes);
  void SeedSelf(Incoming& in);
  // After a failover: a request for the shards of dead primary `target`, promoted here.
  void ServePromoted(ServerCore& promoted, int target, Incoming& in);
  void ExpireHeldPulls(std::vector<Outgoing>* out);
  // Sends `out` (emptied), each reply once the backup has everything applied before it,
  // then flushes the socket.
  void SendReplies(std::vector<Outgoing>& out, ServerCore::After after);
  void Send(std::vector<Outgoing>& replies);
  void ReleaseAcknowledged();
  std::string Who() const { return "server " + std::to_string(core_.server_id()); }

  ServerSocket& socket_;
  ServerCore& core_;
  const ServeOptions& options_;
  BackupLink* link_;  // replaced by Relink
  bool awaiting_seed_;
  Status seed_failed_;          // a seed that did not load ends the loop
  std::set<int> handed_back_;   // primaries whose shards this server handed back
  std::deque<HeldReply> held_;  // in arrival order
  std::vector<Outgoing> ready_;
  uint64_t report_id_ = 0;
  int64_t checkpoint_asked_ = -1;
  // Failover: when the first pull of each promoted primary's shards was served here.
  std::map<int, double> first_pull_after_promotion_;
  ServerCore::Clock::time_point next_report_, next_metrics_;
  int64_t reported_checkpoint_ = 0;
};

Status RequestLoop::Run(const std::atomic<bool>& stop) {
  std::vector<Outgoing> out;
  while (!stop.load(std::memory_order_relaxed)) {
    // Not between the messages of one batch: a worker's step arrives as one batch of ~10-20
    // requests, and Housekeep polls the coordinator's socket (two system calls) each time.
    if (!socket_.HasQueued()) PS_RETURN_IF_ERROR(Housekeep());
    Result<Incoming> in = Receive();
    ServerCore::After after = ServerCore::After::kContinue;
    out.clear();
    if (in.ok()) {
      if (!Dispatch(*in, &out, &after)) continue;
      if (!seed_failed_.ok()) return seed_failed_;
    } else if (in.status().code() != StatusCode::kDeadlineExceeded) {
      return in.status();
    }
    ExpireHeldPulls(&out);
    SendReplies(out, after);
    if (link_ != nullptr && link_->fenced()) {
      LOG(ERROR) << Who() << ": the backup was promoted (this server was declared dead); stopping";
      return FailedPrecondition(Who() + " was declared dead and its backup promoted");
    }
    if (after == ServerCore::After::kShutdown) {
      LOG(INFO) << Who() << ": shutdown requested";
      return Status::Ok();
    }
  }
  return Aborted("server stopped by signal");
}

Status RequestLoop::Housekeep() {
  if (options_.heartbeat != nullptr && options_.heartbeat->evicted()) {
    LOG(ERROR) << Who() << ": declared dead and replaced by another process; stopping";
    return FailedPrecondition(Who() + " was declared dead and replaced");
  }
  if (core_.last_checkpoint_clock() != reported_checkpoint_) {
    // A new checkpoint: report now, so that the coordinator records the set soon after.
    reported_checkpoint_ = core_.last_checkpoint_clock();
    next_report_ = ServerCore::Clock::now();
  }
  if (options_.metrics != nullptr && ServerCore::Clock::now() >= next_metrics_) {
    options_.metrics->Update(core_);
    next_metrics_ = ServerCore::Clock::now() + std::chrono::milliseconds(250);
  }
  if (options_.coordinator == nullptr) return Status::Ok();
  if (options_.report_interval.count() > 0 && ServerCore::Clock::now() >= next_report_) {
    ReportToCoordinator(*options_.coordinator, core_, &report_id_, first_pull_after_promotion_);
    next_report_ = ServerCore::Clock::now() + options_.report_interval;
  }
  DrainReportReplies(*options_.coordinator, core_, &checkpoint_asked_);
  return Status::Ok();
}

Result<Incoming> RequestLoop::Receive() {
  if (socket_.HasQueued()) return socket_.Recv(std::chrono::milliseconds(0));  // rest of a batch
  if (link_ == nullptr || link_->down()) return socket_.Recv(options_.poll_interval);
  // Wake for a request or for the backup's acknowledgements, whichever comes first.
  zmq::pollitem_t items[] = {{socket_.PollHandle().handle(), 0, ZMQ_POLLIN, 0},
                             {link_->PollHandle().handle(), 0, ZMQ_POLLIN, 0}};
  const auto wait = held_.empty() ? options_.poll_interval : std::chrono::milliseconds(10);
  PollSockets(items, 2, wait);
  if (items[0].revents & ZMQ_POLLIN) return socket_.Recv(std::chrono::milliseconds(0));
  return DeadlineExceeded("");
}

bool RequestLoop::Dispatch(Incoming& in, std::vector<Outgoing>* out, ServerCore::After* after) {
  if (in.too_many_frames) {
    out->push_back(Outgoing{
        in.peer, ErrorReply(0, core_.server_id(),
                            InvalidArgument("message has too many frames (see --max_frames)"))});
    return true;
  }
  if (!in.bad_frame.ok()) {
    out->push_back(Outgoing{in.peer, ErrorReply(0, core_.server_id(), in.bad_frame)});
    return true;
  }
  BackupStore* backups = options_.backups;
  const RequestKind kind =
      (backups != nullptr || link_ != nullptr) ? Classify(in.frames) : RequestKind::kOther;
  if (kind == RequestKind::kRereplicate) {
    Rereplicate(in);
    return true;
  }
  if (kind == RequestKind::kSeed) {
    SeedSelf(in);
    return true;
  }
  // A restarted server serves none of its shards until their copy has loaded: a worker's
  // request that reaches it first (one queued for the old server's port) would see fresh
  // rows, or be applied and then lost under the copy. Unanswered, it is sent again when
  // the coordinator redirects the worker here, after the load.
  if (awaiting_seed_ && IsShardRequest(in.frames)) {
    LOG_EVERY_N(WARNING, 100) << Who()
                              << ": dropped a worker's request that came before the "
                                 "copy of its shards ("
                              << google::COUNTER << " so far)";
    return false;
  }
  // After a failover, requests for a dead primary's shards go to its promoted core.
  ServerCore* promoted = nullptr;
  int target = -1;
  if (backups != nullptr && kind != RequestKind::kReplicate) {
    target = TargetServer(in.frames);
    if (target >= 0 && target != core_.server_id()) {
      promoted = backups->promoted(target);
      if (promoted == nullptr) {
        // Handed back: the sender is redirected to the restarted server and resends it there.
        if (handed_back_.count(target) > 0) return false;
        RefuseForeign(in, target);
        return false;
      }
    }
  }
  if (kind == RequestKind::kPromote) {
    Promote(in);
  } else if (promoted != nullptr) {
    ServePromoted(*promoted, target, in);
  } else if (kind == RequestKind::kReplicate) {
    // Acknowledged at once, never held behind this server's own forwards: with two
    // servers backing up each other, holding would make each wait on the other.
    std::vector<Outgoing> ack;
    ack.push_back(Outgoing{
        in.peer, backups != nullptr
                     ? backups->Handle(in.frames)
                     : ErrorReply(0, core_.server_id(), FailedPrecondition("not a backup"))});
    Send(ack);
  } else if (kind == RequestKind::kChangesState && link_ != nullptr && !link_->down()) {
    // Chain replication: apply here, then have the backup apply the same request; the
    // replies wait (SendReplies) until the backup acknowledged it.
    // The forward shares the request's payload buffers (the core only reads a push).
    Frames forward = ShareFrames(in.frames);
    core_.Handle(in.peer, in.frames, out, after);
    (void)link_->Send(std::move(forward));  // a failure marks the link down, logged
  } else {
    core_.Handle(in.peer, in.frames, out, after);
  }
  return true;
}

void RequestLoop::RefuseForeign(const Incoming& in, int target) {
  Result<DecodedHeader> h = DecodedHeader::Decode(in.frames[0]);
  uint64_t rid = 0;
  try {
    if (h.ok()) rid = h->get().getRequestId();
  } catch (const std::exception&) {
  }
  std::vector<Outgoing> refused;
  refused.push_back(
      Outgoing{in.peer, ErrorReply(rid, core_.server_id(),
                                   Unavailable(Who() + " does not serve the shards of server " +
                                               std::to_string(target)))});
  Send(refused);
}

void RequestLoop::Promote(Incoming& in) {
  BackupStore* backups = options_.backups;
  std::vector<Outgoing> ack;
  ack.push_back(Outgoing{
      in.peer, backups != nullptr
                   ? backups->HandlePromote(in.frames)
                   : ErrorReply(0, core_.server_id(), FailedPrecondition("not a backup"))});
  // The dead primary may be this server's own backup (S = 2): stop waiting on it.
  if (backups != nullptr && link_ != nullptr) {
    for (int p : backups->primaries()) {
      if (p == backups->backup_of_self() && backups->is_promoted(p)) {
        link_->Abandon(
            Unavailable("server " + std::to_string(p) + " was declared dead by the coordinator"));
      }
    }
  }
  Send(ack);
}

void RequestLoop::Rereplicate(Incoming& in) {
  std::vector<Outgoing> reply;
  Result<Frames> answer = RereplicateReply(in.frames);
  if (!answer.ok()) {
    LOG(ERROR) << Who() << ": re-replication failed: " << answer.status().ToString();
    answer = ErrorReply(0, core_.server_id(), answer.status());
  }
  reply.push_back(Outgoing{in.peer, std::move(answer).value()});
  Send(reply);
}

Result<Frames> RequestLoop::RereplicateReply(const Frames& request) {
  uint64_t rid = 0;
  int primary = -1;
  std::string endpoint;
  bool hand_back = false;
  PS_ASSIGN_OR_RETURN(DecodedHeader h, DecodedHeader::Decode(request[0]));
  try {
    rid = h.get().getRequestId();
    auto r = h.get().getBody().getRereplicate();
    primary = r.getPrimary();
    endpoint = r.getEndpoint().cStr();
    hand_back = r.getHandBack();
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("bad rereplicate message: ") + e.what());
  }
  const auto start = ServerCore::Clock::now();
  size_t bytes = 0;
  Status s = hand_back ? HandBack(primary, endpoint, &bytes) : Relink(primary, endpoint, &bytes);
  if (!s.ok()) return ErrorReply(rid, core_.server_id(), s);
  const double seconds = std::chrono::duration<double>(ServerCore::Clock::now() - start).count();
  LOG(WARNING) << Who() << ": sent a whole copy of server " << primary << "'s shards (" << bytes
               << " bytes, " << seconds << " s; own table 0 at version " << core_.shard_version(0)
               << ") to " << endpoint;
  capnp::MallocMessageBuilder b;
  auto r = NewHeader(b, rid, core_.server_id()).getBody().initRereplicateReply();
  r.setBytes(bytes);
  r.setSeconds(seconds);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// The restarted primary loads the copy this server served from; then this server holds it
// as that primary's backup again (server/replication.h).
Status RequestLoop::HandBack(int primary, const std::string& endpoint, size_t* bytes) {
  BackupStore* backups = options_.backups;
  if (backups == nullptr || options_.transport == nullptr) {
    return FailedPrecondition(Who() + " runs without replication");
  }
  ServerCore* copy = backups->promoted(primary);
  if (copy == nullptr) {
    return FailedPrecondition(Who() + " does not serve the shards of server " +
                              std::to_string(primary));
  }
  PS_ASSIGN_OR_RETURN(Frames seed, SeedMessage(*copy, 1, bytes));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> to, options_.transport->Connect(endpoint));
  PS_ASSIGN_OR_RETURN(CallReply reply, Call(*to, std::move(seed), options_.seed_timeout));
  if (reply.header.get().getBody().which() != wire::Header::Body::SEED_REPLY) {
    return Internal("the restarted server " + endpoint + " answered a seed with another message");
  }
  backups->Unpromote(primary);
  handed_back_.insert(primary);
  return Status::Ok();
}

// This server's backup was restarted: a new link to it, whose first forward is the whole
// state of this server's shards.
Status RequestLoop::Relink(int primary, const std::string& endpoint, size_t* bytes) {
  if (primary != core_.server_id()) {
    return InvalidArgument(Who() + " was asked to send server " + std::to_string(primary) +
                           "'s shards to their backup: only a primary sends its own");
  }
  if (options_.relink == nullptr || options_.transport == nullptr) {
    return FailedPrecondition(Who() + " runs without replication");
  }
  if (link_ != nullptr) {
    // The coordinator restarted the backup, so the old one is dead, whether or not this
    // link has noticed yet (it notices only with a forward left unacknowledged): what the
    // old link held back goes out, as when a backup is lost.
    link_->Abandon(Unavailable("the backup was restarted at " + endpoint));
    ReleaseAcknowledged();
  }
  PS_ASSIGN_OR_RETURN(Frames seed, SeedMessage(core_, 0, bytes));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> to, options_.transport->Connect(endpoint));
  const auto timeout = link_ != nullptr ? link_->timeout() : options_.seed_timeout;
  auto link = std::make_unique<BackupLink>(std::move(to), core_.server_id(), timeout);
  PS_ASSIGN_OR_RETURN(const uint64_t seed_seq, link->Send(std::move(seed)));
  // The shards have two copies only once the backup has loaded this one: until its
  // acknowledgement the copy may still sit in this process's send queue, and if this server
  // died then, its backup would be promoted with no copy at all (an empty model). So the
  // coordinator hears of the new copy only after the acknowledgement (or the link's timeout).
  while (link->Poll(ServerCore::Clock::now()) < seed_seq && !link->down()) {
    zmq::pollitem_t item = {link->PollHandle().handle(), 0, ZMQ_POLLIN, 0};
    PollSockets(&item, 1, std::chrono::milliseconds(50));
  }
  if (link->down()) {
    return Unavailable("the restarted backup at " + endpoint + " did not acknowledge the copy of " +
                       Who() + "'s shards");
  }
  *options_.relink = std::move(link);
  link_ = options_.relink->get();
  return Status::Ok();
}

void RequestLoop::SeedSelf(Incoming& in) {
  std::vector<Outgoing> reply;
  if (!awaiting_seed_) {
    reply.push_back(Outgoing{
        in.peer, ErrorReply(0, core_.server_id(),
                            FailedPrecondition(Who() + " serves its shards already: a seed is "
                                                       "for a restarted server"))});
  } else {
    Frames loaded = LoadSeed(core_, core_.server_id(), in.frames);
    Result<DecodedHeader> h = DecodedHeader::Decode(loaded[0]);
    if (h.ok() && h->get().getBody().which() == wire::Header::Body::SEED_REPLY) {
      awaiting_seed_ = false;
      LOG(WARNING) << Who() << ": serves its shards again (a whole copy of "
                   << in.frames.back().size() << " bytes from its backup)";
    } else {
      seed_failed_ = FailedPrecondition(Who() + ": the copy of its shards did not load");
    }
    reply.push_back(Outgoing{in.peer, std::move(loaded)});
  }
  Send(reply);
}

void RequestLoop::ServePromoted(ServerCore& promoted, int target, Incoming& in) {
  // Served without a backup (the backup was the dead primary's only copy); replies go at
  // once. A held pull's reply comes out of a later clock tick or ExpireHeldPulls.
  std::vector<Outgoing> replies;
  ServerCore::After ignored = ServerCore::After::kContinue;
  promoted.Handle(in.peer, in.frames, &replies, &ignored);
  Send(replies);
  // stats() sums over tables: asked only until the first pull was served.
  if (first_pull_after_promotion_.count(target) == 0 && promoted.stats().pulls_served > 0) {
    first_pull_after_promotion_[target] = UnixSeconds();
    next_report_ = ServerCore::Clock::now();  // tell the coordinator now
    LOG(WARNING) << Who() << ": served the first pull of server " << target
                 << "'s shards since the promotion";
  }
}

void RequestLoop::ExpireHeldPulls(std::vector<Outgoing>* out) {
  core_.ExpireHeldPulls(ServerCore::Clock::now(), out);
  if (options_.backups == nullptr || !options_.backups->any_promoted()) return;
  std::vector<Outgoing> expired;
  for (ServerCore* p : options_.backups->promoted_cores()) {
    p->ExpireHeldPulls(ServerCore::Clock::now(), &expired);
  }
  Send(expired);
}

void RequestLoop::SendReplies(std::vector<Outgoing>& out, ServerCore::After after) {
  if (link_ != nullptr) {
    // Replies leave in order, each once the backup has everything applied before it.
    const uint64_t need = link_->down() ? 0 : link_->sent();
    for (Outgoing& o : out) held_.push_back(HeldReply{need, std::move(o)});
    out.clear();
    ReleaseAcknowledged();
    if (after == ServerCore::After::kShutdown) {
      // Send the last replies once the backup has them, or it is gone.
      while (!held_.empty()) {
        zmq::pollitem_t item = {link_->PollHandle().handle(), 0, ZMQ_POLLIN, 0};
        if (!link_->down()) PollSockets(&item, 1, std::chrono::milliseconds(10));
        ReleaseAcknowledged();
      }
    }
  }
  Send(out);
  // Replies to a batch leave together once its last request was handled.
  if (Status s = socket_.Flush(); !s.ok()) LOG(WARNING) << Who() << ": " << s.ToString();
}

void RequestLoop::Send(std::vector<Outgoing>& replies) {
  for (Outgoing& o : replies) {
    Status sent = socket_.Send(o.peer, std::move(o.frames));
    if (!sent.ok()) {
      // The peer left before its reply; nothing to do for it, keep serving the others.
      LOG(WARNING) << Who() << ": " << sent.ToString();
    }
  }
  replies.clear();
}

void RequestLoop::ReleaseAcknowledged() {
  const uint64_t acked = link_->Poll(ServerCore::Clock::now());
  const bool fenced = link_->fenced();
  while (!held_.empty() && ((link_->down() && !fenced) || held_.front().need <= acked)) {
    ready_.push_back(std::move(held_.front().reply));
    held_.pop_front();
  }
  Send(ready_);
  // Declared dead and replaced: what the backup did not acknowledge is never answered
  // (the workers resend it to the promoted backup).
  if (fenced) held_.clear();
}

}  // namespace

Status ServeUntilShutdown(ServerSocket& socket, ServerCore& core, const std::atomic<bool>& stop,
                          const ServeOptions& options) {
  RequestLoop loop(socket, core, options);
  return loop.Run(stop);
}

namespace {

// Registers the server listening on `socket` with the coordinator.
Result<Registration> RegisterServer(const ServerOptions& options, Transport* transport,
                                    const ServerSocket& socket) {
  RegisterRequest req;
  req.is_server = true;
  req.endpoint = socket.BoundEndpoint();
  req.requested_id = options.requested_id;
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterWithCoordinator(transport, options.coordinator, req,
                                                                options.register_timeout));
  LOG(INFO) << "registered as server " << reg.id << " of " << reg.config.num_servers;
  if (reg.rejoin) {
    // Restarting a dead server whose backup serves its shards (--replicas=2): they come
    // from that backup (a seed), not from a checkpoint.
    reg.config.restore.clear();
    LOG(WARNING) << "server " << reg.id
                 << " restarts a dead server; its backup sends it its shards";
  } else if (reg.replacement) {
    // Replacing a dead server (--replicas=1): its shards come from the coordinator's latest
    // recorded checkpoint set, not from the job's own --restore.
    reg.config.restore = reg.restore_set;
    LOG(WARNING) << "server " << reg.id << " replaces a dead server; restoring "
                 << (reg.restore_set.empty() ? std::string("nothing (initial values)")
                                             : reg.restore_set);
  }
  return reg;
}

Result<std::unique_ptr<ServerCore>> MakeCore(const Registration& reg,
                                             const ServerOptions& options) {
  const auto restore_start = ServerCore::Clock::now();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerCore> core,
                      ServerCore::Create(reg.config, reg.id, options.store));
  if (reg.replacement) {
    core->BecomeReplacement(
        reg.evicted_workers, reg.idle_workers,
        std::chrono::duration<double>(ServerCore::Clock::now() - restore_start).count());
  }
  core->set_limits(options.limits);
  return core;
}

HeartbeatOptions ServerHeartbeat(const Registration& reg, const ServerOptions& options) {
  HeartbeatOptions hopt;
  hopt.coordinator = options.coordinator;
  hopt.is_server = true;
  hopt.id = reg.id;
  hopt.interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(reg.config.heartbeat_timeout * 1000 / 4)));
  // A dead coordinator may be restarted (server/coordinator.h): serve on meanwhile.
  hopt.coordinator_timeout = std::chrono::milliseconds(static_cast<int64_t>(
      (reg.config.heartbeat_timeout * 3 + reg.config.coordinator_restart_timeout) * 1000));
  hopt.on_coordinator_lost = options.on_coordinator_lost;
  return hopt;
}

// Replication (server/replication.h): this server backs up its predecessor's shards and
// forwards its own state changes to its successor. Nothing without --replicas=2.
Status StartReplication(const Registration& reg, const ServerOptions& options, Transport* transport,
                        std::optional<BackupStore>* backups,
                        std::unique_ptr<BackupLink>* backup_link) {
  const int backup = BackupOf(reg.config, reg.id);
  if (backup < 0) return Status::Ok();
  backups->emplace(reg.config, reg.id, options.store);
  if (static_cast<size_t>(backup) >= reg.server_endpoints.size()) {
    return Internal("no endpoint for backup server " + std::to_string(backup));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> link,
                      transport->Connect(reg.server_endpoints[static_cast<size_t>(backup)]));
  // A backup that does not answer within the heartbeat timeout is dead to the
  // coordinator too.
  *backup_link = std::make_unique<BackupLink>(
      std::move(link), reg.id,
      std::chrono::milliseconds(static_cast<int64_t>(reg.config.heartbeat_timeout * 1000)));
  LOG(INFO) << "server " << reg.id << ": replicating to server " << backup;
  return Status::Ok();
}

// Stopped by a signal: keeps what was trained since the last checkpoint, unless one at
// this clock already stands (it is the consistent one).
void CheckpointOnStop(ServerCore& core) {
  const int64_t clock = core.CheckpointClock();
  if (clock <= core.last_checkpoint_clock()) return;
  Status c = core.WriteCheckpoint(clock);
  if (!c.ok())
    LOG(ERROR) << "server " << core.server_id() << ": checkpoint on stop: " << c.ToString();
}

// Waits until the backup acknowledged every request forwarded to it (what this server
// applied is then all there), or `deadline`.
Status DrainBackupLink(BackupLink& link, ServerCore::Clock::time_point deadline) {
  while (!link.down() && link.Poll(ServerCore::Clock::now()) < link.sent()) {
    if (ServerCore::Clock::now() > deadline) {
      return DeadlineExceeded(std::to_string(link.sent() - link.acked()) +
                              " requests forwarded to the backup are not acknowledged");
    }
    zmq::pollitem_t item = {link.PollHandle().handle(), 0, ZMQ_POLLIN, 0};
    PollSockets(&item, 1, std::chrono::milliseconds(10));
  }
  if (link.down()) return Unavailable("the backup stopped answering");
  return Status::Ok();
}

// SIGTERM with --replicas=2 (a preemption notice): hands this server's shards to its
// backup before it exits. It serves nothing more; once the backup has acknowledged every
// forwarded request, the coordinator is told (a report with "leaving") and promotes the
// backup before it answers; the workers are redirected there and send again what this
// server left unanswered (same request ids: applied once). Nothing is rolled back.
Status HandOffShards(const Registration& reg, ServerCore& core, BackupLink* link,
                     BackupStore* backups) {
  if (backups != nullptr && backups->any_promoted()) {
    return FailedPrecondition("it also serves a dead server's shards, which have no other copy");
  }
  if (link == nullptr || link->down()) return FailedPrecondition("it has no live backup");
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(reg.config.heartbeat_timeout * 1000) + 10000);
  const auto deadline = ServerCore::Clock::now() + timeout;
  PS_RETURN_IF_ERROR(DrainBackupLink(*link, deadline));
  nlohmann::json status = ServerStatusJson(core, ServerCore::Clock::now());
  status["leaving"] = true;
  constexpr uint64_t kLeaving = uint64_t{1} << 40;
  capnp::MallocMessageBuilder b;
  NewHeader(b, kLeaving, core.server_id()).getBody().initReport().setJson(status.dump());
  Frames f;
  f.push_back(EncodeFrame(b));
  PS_RETURN_IF_ERROR(reg.coordinator->Send(std::move(f)));
  while (ServerCore::Clock::now() < deadline) {  // earlier reports' answers come first
    Result<Frames> reply = reg.coordinator->Recv(std::chrono::milliseconds(100));
    if (!reply.ok() || reply->empty()) continue;
    Result<DecodedHeader> h = DecodedHeader::Decode((*reply)[0]);
    if (h.ok() && h->get().getRequestId() == kLeaving) return Status::Ok();
  }
  return DeadlineExceeded("the coordinator did not confirm the hand-off");
}

// Writes the model to --export_dir; the copies this server holds as a backup go beside it,
// so that they can be checked against their primaries' exports (equal bit for bit: they
// applied the same requests in order). Only the server's own export decides the outcome.
Status ExportModel(const std::string& dir, ServerCore& core, BackupStore* backups) {
  const std::string id = std::to_string(core.server_id());
  std::string path = dir + "/server-" + id + ".safetensors";
  Status e = MakeDirs(dir);
  if (e.ok()) e = core.ExportSafetensors(path);
  if (e.ok()) {
    LOG(INFO) << "server " << id << ": model written to " << path;
  } else {
    LOG(ERROR) << "server " << id << ": export failed: " << e.ToString();
  }
  for (int p : backups != nullptr ? backups->primaries() : std::vector<int>{}) {
    // A promoted copy is that server's model now.
    std::string copy = dir + "/server-" + std::to_string(p) +
                       (backups->is_promoted(p) ? ".safetensors" : ".backup.safetensors");
    Status b = backups->shadow(p)->ExportSafetensors(copy);
    if (!b.ok()) LOG(ERROR) << "server " << id << ": backup export failed: " << b.ToString();
  }
  return e;
}

void LogDone(const ServerCore& core) {
  ServerStats st = core.stats();
  LOG(INFO) << "server " << core.server_id() << " done: pushes applied " << st.pushes_applied
            << ", rejected " << st.pushes_rejected << ", pulls " << st.pulls_served
            << ", rows held " << st.rows_held << " (in memory " << st.rows_in_memory << ", spilled "
            << st.rows_spilled << "), cache hits " << st.cache_hits << ", misses "
            << st.cache_misses << ", RocksDB bytes read " << st.spill_bytes_read << ", written "
            << st.spill_bytes_written << ", peak RSS " << st.peak_rss_bytes;
}

}  // namespace

Status RunServer(const ServerOptions& options, Transport* transport,
                 const std::atomic<bool>& stop) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerSocket> socket, transport->Listen(options.listen));
  LOG(INFO) << "server listening on " << socket->BoundEndpoint();
  PS_ASSIGN_OR_RETURN(Registration reg, RegisterServer(options, transport, *socket));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerCore> core, MakeCore(reg, options));
  // Heartbeats from a thread of their own while serving (common/heartbeat.h).
  PS_ASSIGN_OR_RETURN(std::unique_ptr<HeartbeatSender> heartbeat,
                      HeartbeatSender::Start(transport, ServerHeartbeat(reg, options)));
  std::optional<ServerMetrics> metrics;
  if (options.metrics != nullptr) metrics.emplace(options.metrics);
  std::optional<BackupStore> backups;
  std::unique_ptr<BackupLink> backup_link;
  PS_RETURN_IF_ERROR(StartReplication(reg, options, transport, &backups, &backup_link));
  ServeOptions serve;
  serve.poll_interval = options.poll_interval;
  serve.coordinator = reg.coordinator.get();
  serve.report_interval = options.report_interval;
  serve.metrics = metrics ? &*metrics : nullptr;
  serve.backups = backups ? &*backups : nullptr;
  serve.backup_link = backup_link.get();
  serve.transport = transport;
  serve.relink = &backup_link;
  serve.awaiting_seed = reg.rejoin;
  serve.heartbeat = heartbeat.get();
  Status s = ServeUntilShutdown(*socket, *core, stop, serve);
  if (s.code() == StatusCode::kAborted && reg.config.replicas >= 2 && stop.load()) {
    Status handed = HandOffShards(reg, *core, backup_link.get(), backups ? &*backups : nullptr);
    if (handed.ok()) {
      LOG(WARNING) << "server " << reg.id << ": stopped by a signal; its backup serves its shards";
      LogDone(*core);
      return Status::Ok();
    } else {
      LOG(ERROR) << "server " << reg.id << ": cannot hand its shards over: " << handed.ToString();
    }
  }
  if (s.code() == StatusCode::kAborted && !reg.config.checkpoint_dir.empty()) {
    CheckpointOnStop(*core);
  }
  if (s.ok() && !options.export_dir.empty()) {
    s = ExportModel(options.export_dir, *core, backups ? &*backups : nullptr);
  }
  LogDone(*core);
  return s;
}

}  // namespace ps
