#include "server/coordinator.h"

#include <glog/logging.h>
#include <kj/exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "common/divergence.h"
#include "common/run_files.h"
#include "common/run_summary.h"
#include "common/wire.h"
#include "server/coord_checkpoints.h"
#include "server/coord_failover.h"
#include "server/coord_failures.h"
#include "server/coord_leases.h"
#include "server/coord_membership.h"
#include "server/coord_messages.h"
#include "server/coord_progress.h"
#include "server/coord_summary.h"
#include "server/coordinator_job.h"

namespace ps {
namespace {

using Clock = CoordClock;
using nlohmann::json;

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return Unavailable("cannot write " + tmp);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Unavailable("cannot rename " + tmp);
  return Status::Ok();
}

}  // namespace

Status CoordinatorJob::Run(const std::atomic<bool>& stop) {
  PS_RETURN_IF_ERROR(MakeDirs(options_.run_dir));
  PS_RETURN_IF_ERROR(ResolveRestore());
  job_start_ = Clock::now();
  PS_RETURN_IF_ERROR(OpenJournal());  // with --resume: the job's state is back
  PS_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(options_.run_dir + "/metrics.jsonl"));
  PS_ASSIGN_OR_RETURN(socket_, transport_->Listen(options_.listen));
  LOG(INFO) << "coordinator listening on " << socket_->BoundEndpoint();
  if (!options_.endpoint_file.empty()) {
    PS_RETURN_IF_ERROR(WriteTextFile(options_.endpoint_file, socket_->BoundEndpoint() + "\n"));
  }
  Status outcome = resumed_ ? Status::Ok() : Register(stop);
  if (!outcome.ok()) {
    // Tell whoever did register, so that no process waits on a job that will not start.
    for (const auto* group : {&members_.servers(), &members_.workers()}) {
      for (const Member& m : *group) ReplyError(m.peer, m.register_request, outcome);
    }
    members_.servers().clear();
  } else {
    outcome = Persist();
    if (outcome.ok()) outcome = Train(stop);
    if (!outcome.ok() && stop.load()) SendWorkersHome();
  }
  checkpoints_.RecordWholeSet(members_.Training());  // the workers are done: it waits on nobody
  for (const Member& m : failover_.TakeWaiting()) {
    ReplyError(m.peer, m.register_request,
               FailedPrecondition("the job ended with no dead server to replace"));
  }
  // Servers are shut down whatever happened, so that no process outlives the job.
  std::vector<ServerSummary> servers;
  Status shut = failover_.ShutdownServers(&servers);
  if (outcome.ok()) outcome = shut;
  Status written = WriteSummary(outcome, std::move(servers));
  if (outcome.ok()) outcome = written;
  finished_ = true;  // a coordinator started with --resume now has nothing to resume
  if (Status j = Persist(); !j.ok()) LOG(WARNING) << "coordinator: " << j.ToString();
  return outcome;
}

Status CoordinatorJob::Send(const std::string& peer, capnp::MallocMessageBuilder& b) {
  Frames f;
  f.push_back(EncodeFrame(b));
  Status s = socket_->Send(peer, std::move(f));
  // A process that left between its request and the reply (a worker's last heartbeat as it
  // exits) is not the job's failure: heartbeat expiry deals with a process that died.
  // Only a transport shutting down ends the loop.
  if (!s.ok() && s.code() == StatusCode::kUnavailable) {
    LOG(WARNING) << "coordinator: reply not delivered: " << s.ToString();
    return Status::Ok();
  }
  return s;
}

void CoordinatorJob::ReplyError(const std::string& peer, uint64_t request_id, const Status& error) {
  LOG(WARNING) << "coordinator: rejecting a request: " << error.ToString();
  Status s = socket_->Send(peer, ErrorReply(request_id, -1, error));
  if (!s.ok()) LOG(WARNING) << "coordinator: " << s.ToString();
}

// Decodes a request; on failure answers with an error and returns nullopt.
std::optional<DecodedHeader> CoordinatorJob::Decode(Incoming& in) {
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

// Answers a status request. An asker that left (ps_status gave up) changes nothing.
void CoordinatorJob::ReplyStatus(const std::string& peer, uint64_t rid) {
  capnp::MallocMessageBuilder b;
  json st = progress_.StatusJson(members_, failures_.ToJson(), Elapsed());
  for (json& server : st["servers"]) {
    server.update(failover_.StatusOf(server.value("id", -1)));
  }
  NewHeader(b, rid, -1).getBody().initStatusReply().setJson(st.dump());
  Status s = Send(peer, b);
  if (!s.ok()) LOG(WARNING) << "coordinator: status reply: " << s.ToString();
}

// --restore: every server loads the resolved set (config_.restore becomes its directory);
// the workers resume at its clock and epoch.
Status CoordinatorJob::ResolveRestore() {
  PS_RETURN_IF_ERROR(checkpoints_.ResolveRestore());
  if (!checkpoints_.restored()) return Status::Ok();
  config_.restore = checkpoints_.restored()->set;
  leases_.table().StartAtEpoch(checkpoints_.start_epoch());
  progress_.StartAtEpoch(std::min(checkpoints_.start_epoch(), config_.epochs));
  return Status::Ok();
}

Status CoordinatorJob::Register(const std::atomic<bool>& stop) {
  const auto deadline = Clock::now() + options_.register_timeout;
  std::printf("waiting for %d servers and %d workers to register on %s\n", config_.num_servers,
              config_.num_workers, socket_->BoundEndpoint().c_str());
  std::fflush(stdout);
  while (!members_.complete()) {
    if (stop.load()) return Aborted("coordinator stopped by signal during registration");
    if (Clock::now() > deadline) {
      return DeadlineExceeded("only " + std::to_string(members_.servers().size()) + " of " +
                              std::to_string(config_.num_servers) + " servers and " +
                              std::to_string(members_.workers().size()) + " of " +
                              std::to_string(config_.num_workers) + " workers registered within " +
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
      OnRegistration(in->peer, h->get());
    } catch (const kj::Exception& e) {
      ReplyError(
          in->peer, 0,
          InvalidArgument(std::string("malformed registration: ") + e.getDescription().cStr()));
    }
  }
  return Assemble();
}

// A message while the job assembles: a registration (or a status request).
void CoordinatorJob::OnRegistration(const std::string& peer, wire::Header::Reader header) {
  if (header.getBody().which() == wire::Header::Body::STATUS) {
    ReplyStatus(peer, header.getRequestId());
    return;
  }
  if (header.getBody().which() != wire::Header::Body::REGISTER) {
    ReplyError(peer, header.getRequestId(),
               FailedPrecondition("the job is still assembling: only registrations are "
                                  "accepted now"));
    return;
  }
  auto reg = header.getBody().getRegister();
  Member m = MemberFromRegistration(peer, header.getRequestId(), reg);
  const std::string what = "(pid " + std::to_string(m.pid) + " on " + m.host + ")";
  Status added;
  if (reg.getRole() == wire::Role::SERVER) {
    const std::string endpoint = m.endpoint;
    added = members_.AddServer(std::move(m));
    if (added.ok()) LOG(INFO) << "server registered: " << endpoint << " " << what;
  } else if (reg.getRole() == wire::Role::WORKER) {
    const std::string device = m.device;
    added = members_.AddWorker(std::move(m));
    if (added.ok()) LOG(INFO) << "worker registered: " << device << " " << what;
  } else {
    added = InvalidArgument("unknown role");
  }
  if (!added.ok()) ReplyError(peer, header.getRequestId(), added);
}

// Everyone is here: hand out ids, the config and the shard map.
Status CoordinatorJob::Assemble() {
  train_start_ = Clock::now();
  PS_ASSIGN_OR_RETURN(std::vector<GroupPlan> groups, members_.Assemble(train_start_));
  std::vector<std::pair<int, int>> group_of(members_.workers().size(), {-1, 0});  // group, rank
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t r = 0; r < groups[g].ids.size(); ++r) {
      group_of[groups[g].ids[r]] = {static_cast<int>(g), static_cast<int>(r)};
    }
  }
  for (uint32_t i = 0; i < members_.servers().size(); ++i) {
    PS_RETURN_IF_ERROR(ReplyRegistration(members_.servers()[i], i, true));
  }
  for (uint32_t i = 0; i < members_.workers().size(); ++i) {
    const GroupPlan* plan =
        group_of[i].first >= 0 ? &groups[static_cast<size_t>(group_of[i].first)] : nullptr;
    PS_RETURN_IF_ERROR(ReplyRegistration(members_.workers()[i], i, true, plan, group_of[i].second));
  }
  progress_.Assembled(members_.workers().size(), members_.servers().size());
  train_start_unix_ = UnixSeconds();
  std::printf("job assembled: %d servers, %d workers; training %d epochs\n", config_.num_servers,
              config_.num_workers, config_.epochs);
  std::fflush(stdout);
  return Status::Ok();
}

// Answers a registration: the id, the job config and the shard map. `original`: one of the
// job's own processes (not one that joined later): a restored job starts them at the
// checkpoint's clock and epoch. `plan`: the worker's all-reduce group, its `rank` there.
Status CoordinatorJob::ReplyRegistration(const Member& m, uint32_t id, bool original,
                                         const GroupPlan* plan, int rank) {
  capnp::MallocMessageBuilder b;
  auto r = NewHeader(b, m.register_request, -1).getBody().initRegisterReply();
  r.setId(id);
  if (original) {
    r.setStartClock(checkpoints_.start_clock());
    r.setStartEpoch(checkpoints_.start_epoch());
  }
  SetConfigAndShardMap(r, config_, members_.servers());
  if (plan != nullptr) SetGroup(r, *plan, rank);
  return Send(m.peer, b);
}

// Waits up to a poll interval for one request and handles it. OK when none came or it
// was malformed (its sender is told); an error ends the job.
Status CoordinatorJob::ServeNext() {
  Result<Incoming> in = socket_->Recv(options_.poll_interval);
  if (!in.ok()) {
    if (in.status().code() == StatusCode::kDeadlineExceeded) return Status::Ok();
    return in.status();
  }
  std::optional<DecodedHeader> h = Decode(*in);
  if (!h) return Status::Ok();
  try {
    PS_RETURN_IF_ERROR(Dispatch(in->peer, h->get()));
  } catch (const kj::Exception& e) {
    ReplyError(in->peer, 0,
               InvalidArgument(std::string("malformed request: ") + e.getDescription().cStr()));
    progress_.Print(false, Elapsed());
  }
  return Status::Ok();
}

Status CoordinatorJob::Train(const std::atomic<bool>& stop) {
  while (!progress_.final_eval()) {
    if (stop.load()) PS_RETURN_IF_ERROR(OnStopSignal());
    PS_RETURN_IF_ERROR(CheckHeartbeats());
    PS_RETURN_IF_ERROR(Persist());
    if (barrier_released_ && Clock::now() - barrier_time_ > options_.final_eval_timeout) {
      return DeadlineExceeded("worker 0 sent no final evaluation within " +
                              std::to_string(options_.final_eval_timeout.count()) + " ms");
    }
    PS_RETURN_IF_ERROR(ServeNext());
    if (divergence_) return Aborted("the model diverged: " + divergence_->reason);
  }
  for (size_t i = 0; i < members_.workers().size(); ++i) {
    const WorkerResult& r = members_.workers()[i].result;
    if (r.failed) return Internal("worker " + std::to_string(i) + " failed: " + r.message);
  }
  return Status::Ok();
}

// A request while the job runs: status, server reports and heartbeats, joins; the rest
// must come from a live worker of the job.
Status CoordinatorJob::Dispatch(const std::string& peer, wire::Header::Reader header) {
  const uint64_t rid = header.getRequestId();
  const auto which = header.getBody().which();
  int w = members_.WorkerIndex(peer);
  if (w < 0 && resumed_ && members_.ServerIndex(peer) < 0 && Reattach(peer, header)) {
    w = members_.WorkerIndex(peer);  // -1 again for a server
  }
  if (which == wire::Header::Body::STATUS) {
    ReplyStatus(peer, rid);
    return Status::Ok();
  }
  if (int srv = members_.ServerIndex(peer);
      w < 0 && which == wire::Header::Body::REPORT && srv >= 0) {
    // A server declared dead (stopped, now awake) changes nothing any more.
    if (!members_.servers()[static_cast<size_t>(srv)].dead) {
      OnServerReport(srv, header.getBody().getReport().getJson().cStr());
    }
    capnp::MallocMessageBuilder b;
    NewHeader(b, rid, -1).getBody().initReportReply().setCheckpointAt(checkpoints_.checkpoint_at());
    // The server may be gone by now; that is for its own failure to tell.
    if (Status s = Send(peer, b); !s.ok()) LOG(WARNING) << "server " << srv << ": " << s.ToString();
    return Status::Ok();
  }
  if (which == wire::Header::Body::ALIVE) return OnAlive(peer, rid, header.getBody().getAlive());
  if (w < 0 && which == wire::Header::Body::REGISTER) {
    return OnJoin(peer, rid, header.getBody().getRegister());
  }
  if (w >= 0 && members_.Gone(static_cast<size_t>(w))) {
    ReplyError(peer, rid,
               FailedPrecondition("worker " + std::to_string(w) +
                                  (members_.workers()[static_cast<size_t>(w)].dead
                                       ? " was declared dead (silent for more than "
                                         "--heartbeat_timeout); its work went to others"
                                       : " has left the job")));
    return Status::Ok();
  }
  if (w < 0) {
    ReplyError(peer, rid,
               FailedPrecondition("the job is running and full; this peer is not one of its "
                                  "workers"));
    return Status::Ok();
  }
  members_.Touch(w, Clock::now());
  ++messages_during_training_;
  return DispatchWorker(peer, w, header);
}

Status CoordinatorJob::DispatchWorker(const std::string& peer, int w, wire::Header::Reader header) {
  const uint64_t rid = header.getRequestId();
  switch (header.getBody().which()) {
    case wire::Header::Body::REPORT:
      return OnWorkerReport(peer, w, rid, header.getBody().getReport().getJson().cStr());
    case wire::Header::Body::DONE:
      PS_RETURN_IF_ERROR(OnDone(peer, w, rid, header.getBody().getDone()));
      break;
    case wire::Header::Body::HEARTBEAT: {
      capnp::MallocMessageBuilder b;
      NewHeader(b, rid, -1).getBody().setHeartbeatReply();
      PS_RETURN_IF_ERROR(Send(peer, b));
      break;
    }
    case wire::Header::Body::LEASE:
      PS_RETURN_IF_ERROR(OnLease(peer, w, rid, header.getBody().getLease()));
      break;
    default:
      ReplyError(peer, rid,
                 InvalidArgument("the coordinator does not handle this message type during "
                                 "training"));
  }
  progress_.Print(false, Elapsed());
  return Status::Ok();
}

// A worker joins the running job: the next id, the config and the shard map. Its
// parameters come from the servers with its first pull; it enters the clock table at the
// slowest live clock (ServerCore) and leases data like the others. With --replicas=1 a
// server may register too: it replaces a dead one.
Status CoordinatorJob::OnJoin(const std::string& peer, uint64_t rid, wire::Register::Reader reg) {
  if (reg.getRole() == wire::Role::SERVER) return OnServerJoin(peer, rid, reg);
  if (reg.getRole() != wire::Role::WORKER) {
    ReplyError(peer, rid, FailedPrecondition("the job is running: only workers may join it"));
    return Status::Ok();
  }
  if (progress_.final_eval() || barrier_released_) {
    ReplyError(peer, rid, FailedPrecondition("the job is finishing: nothing left to train"));
    return Status::Ok();
  }
  const uint32_t id = members_.Join(MemberFromRegistration(peer, rid, reg), Clock::now());
  const Member& joined = members_.workers().back();
  LOG(INFO) << "worker " << id << " joined: " << joined.device << " (pid " << joined.pid << " on "
            << joined.host << ")";
  std::printf("worker %u joined (pid %u on %s)  %.1fs\n", id, joined.pid, joined.host.c_str(),
              Elapsed());
  std::fflush(stdout);
  failures_.AddJoin({id, joined.pid, joined.host, Elapsed()});
  return ReplyRegistration(joined, id, false);
}

// A heartbeat (common/heartbeat.h), on the sender's own connection. A worker's reply
// lists where the dead servers' shards are served now; its KVClient reconnects and
// resends what they had not answered (a redirect to the endpoint it uses changes nothing).
Status CoordinatorJob::OnAlive(const std::string& peer, uint64_t rid, wire::Alive::Reader alive) {
  const bool server = alive.getRole() == wire::Role::SERVER;
  const bool evicted = members_.OnAlive(server, alive.getId(), alive.getPid(), Clock::now());
  capnp::MallocMessageBuilder b;
  auto reply = NewHeader(b, rid, -1).getBody().initAliveReply();
  reply.setEvicted(evicted);
  reply.setIncarnation(incarnation_);
  reply.setJobStopping(stopping_ && !server);
  if (failover_.any_redirects() && alive.getRole() == wire::Role::WORKER) {
    SetRedirects(reply, failover_.Redirects());
  }
  return Send(peer, b);
}

// Declares dead every live worker silent past --heartbeat_timeout (after the barrier,
// only the evaluator matters), and every silent server.
Status CoordinatorJob::CheckHeartbeats() {
  const auto now = Clock::now();
  // Beats that arrived while this loop was held up (a blocking call to a server, such as a
  // re-replication, or the process descheduled) are still queued: not silence.
  const auto stall = now - last_heartbeat_check_ - options_.poll_interval;
  if (last_heartbeat_check_ != Clock::time_point{} && stall > std::chrono::seconds(1)) {
    LOG(WARNING) << "coordinator: read no message for "
                 << std::chrono::duration<double>(stall).count()
                 << " s; that time does not count towards anyone's heartbeat timeout";
    members_.ForgiveStall(stall);
  }
  last_heartbeat_check_ = now;
  for (int w : members_.SilentWorkers(now, barrier_released_ ? final_evaluator_ : -1)) {
    if (members_.Gone(static_cast<size_t>(w)) || (barrier_released_ && w != final_evaluator_)) {
      continue;  // a removal before it changed the picture
    }
    PS_RETURN_IF_ERROR(RemoveWorker(w, true, std::nullopt));
  }
  for (int s : members_.TakeSilentServers(now)) {
    OnSilentServer(s, now);
    PS_RETURN_IF_ERROR(AssignWaitingServers());
  }
  return Status::Ok();
}

// Worker `w` is gone (dead: silent too long; or left on SIGTERM): its leases go back to
// the queue, the servers drop it, and the event is in the failure log.
Status CoordinatorJob::RemoveWorker(int w, bool dead, std::optional<bool> completed_chunk) {
  Member& m = members_.workers()[static_cast<size_t>(w)];
  const double silent = members_.SilentSeconds(m, Clock::now());
  (dead ? m.dead : m.left) = true;
  const int returned = leases_.Release(w);
  failover_.EvictOnServers(w);
  FailureEntry e;
  e.kind = dead ? FailureKind::kWorkerLost : FailureKind::kWorkerLeft;
  e.id = w;
  e.pid = m.pid;
  e.host = m.host;
  e.time = Elapsed();
  e.unix_time = UnixSeconds();  // of the detection, so that a test can measure it
  e.leases_returned = returned;
  e.completed_chunk_before_leaving = completed_chunk;
  e.recovered = std::to_string(returned) +
                " data leases back to the queue; removed from the servers' clock tables";
  if (dead) e.silent_seconds = silent;
  LOG(WARNING) << "worker " << w << (dead ? " declared dead" : " left") << ": "
               << e.ToJson().dump();
  if (dead) {
    std::printf("worker %d lost: silent for %.1f s; %d leases back to the queue  %.1fs\n", w,
                silent, returned, Elapsed());
  } else {
    std::printf("worker %d left; %d leases back to the queue  %.1fs\n", w, returned, Elapsed());
  }
  std::fflush(stdout);
  progress_.CountFailure();
  failures_.Add(std::move(e));
  if (barrier_released_ && w == final_evaluator_) {
    return Internal("worker " + std::to_string(w) +
                    " was lost during the final evaluation; the others have finished");
  }
  PS_RETURN_IF_ERROR(AnswerHeldLeases());
  return MaybeReleaseBarrier();
}

// A metrics line from a worker: appended to metrics.jsonl with its id, and taken into the
// progress (an eval line prints the epoch's line; the final one ends the job).
Status CoordinatorJob::OnWorkerReport(const std::string& peer, int w, uint64_t rid,
                                      const char* text) {
  json report = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!report.is_object()) {
    ReplyError(peer, rid, InvalidArgument("a report must be one JSON object"));
    return Status::Ok();
  }
  report["worker"] = w;
  if (Status fields = CheckReportFields(report); !fields.ok()) {
    ReplyError(peer, rid, fields);
    return Status::Ok();
  }
  // A report sent again after a restart was appended already.
  const bool again = resumed_ && last_report_.count(w) > 0 && last_report_[w] == rid;
  last_report_[w] = rid;
  if (!again) metrics_->Append(report);
  switch (KindOf(report)) {
    case MetricsLineKind::kTrain: {
      TrainLine line = TrainLine::FromJson(report);
      if (std::optional<std::string> why = loss_watch_.OnLoss(line.loss)) {
        Divergence d;
        d.reason = *why;
        d.worker = w;
        d.clock = line.clock;
        d.loss = line.loss;
        OnDiverged(std::move(d));
      }
      progress_.OnTrain(line, members_, Elapsed());
      break;
    }
    case MetricsLineKind::kEval:
      progress_.OnEval(EvalLine::FromJson(report), Elapsed());
      break;
    case MetricsLineKind::kOther:
      break;
  }
  PS_RETURN_IF_ERROR(Persist());  // the report's id: it is not appended twice
  capnp::MallocMessageBuilder b;
  NewHeader(b, rid, -1).getBody().initReportReply();
  PS_RETURN_IF_ERROR(Send(peer, b));
  progress_.Print(false, Elapsed());
  return Status::Ok();
}

// A worker is done (or failed). Its answer waits for the barrier; a failed worker's
// unfinished chunks go back to the queue for the others.
Status CoordinatorJob::OnDone(const std::string& peer, int w, uint64_t rid,
                              wire::Done::Reader done) {
  WorkerResult& r = members_.workers()[static_cast<size_t>(w)].result;
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
  if (r.failed && r.totals.contains("divergence")) {
    if (std::optional<Divergence> d = Divergence::FromJson(r.totals["divergence"])) {
      d->worker = w;
      OnDiverged(std::move(*d));
      ReplyError(peer, rid, Aborted("the job stopped: the model diverged"));
      return Status::Ok();
    }
  }
  if (r.failed) {
    LOG(ERROR) << "worker " << w << " failed: " << r.message;
    progress_.CountFailure();
    FailureEntry e;
    e.kind = FailureKind::kWorkerFailed;
    e.id = w;
    e.time = Elapsed();
    e.message = r.message;
    failures_.Add(std::move(e));
    if (int returned = leases_.table().Release(w); returned > 0) {
      LOG(INFO) << "returned " << returned << " chunks of worker " << w;
      PS_RETURN_IF_ERROR(AnswerHeldLeases());
    }
  }
  if (barrier_released_) {
    // A worker that joined late and found nothing left to train.
    capnp::MallocMessageBuilder b;
    NewHeader(b, rid, -1).getBody().setDoneReply();
    PS_RETURN_IF_ERROR(Send(peer, b));
  }
  return MaybeReleaseBarrier();
}

// A worker finished a chunk and/or wants the next one (or leaves, on SIGTERM: it flushed
// its pushes and left the clock tables).
Status CoordinatorJob::OnLease(const std::string& peer, int w, uint64_t rid,
                               wire::LeaseRequest::Reader req) {
  if (resumed_) {
    PS_ASSIGN_OR_RETURN(bool resent, OnLeaseResent(peer, w, rid, req));
    if (resent) return Status::Ok();
  }
  lease_seen_[w] = LeaseSeen{rid, std::nullopt};
  if (Status size = leases_.table().SetDatasetSize(req.getDatasetSize()); !size.ok()) {
    ReplyError(peer, rid, size);
    return Status::Ok();
  }
  checkpoints_.OnLeaseRequest(w, req.getClock());
  if (req.getCompletedEpoch() > 0) {
    Result<std::vector<int>> completed =
        leases_.Complete(w, req.getCompletedEpoch(), req.getCompletedChunk());
    if (!completed.ok()) {
      ReplyError(peer, rid, completed.status());
      return Status::Ok();
    }
    checkpoints_.OnChunkCompleted(req.getCompletedEpoch(), req.getClock());
    for (int e : *completed) checkpoints_.OnEpochCompleted(e);
  }
  checkpoints_.RecordWholeSet(members_.Training());
  if (req.getExamplesPerSec() > 0) leases_.SetRate(w, req.getExamplesPerSec());
  if (req.getLeave()) {
    capnp::MallocMessageBuilder b;
    NewHeader(b, rid, -1).getBody().initLeaseReply().setFinished();
    PS_RETURN_IF_ERROR(Send(peer, b));
    return RemoveWorker(w, false, req.getCompletedEpoch() > 0);
  }
  leases_.Hold({peer, rid, w, req.getWait()});
  return AnswerHeldLeases();
}

// Sends every lease answer that can be given now.
Status CoordinatorJob::AnswerHeldLeases() {
  const std::vector<LeaseAnswer> answers = leases_.Answer(members_.Evaluator(), members_.Live());
  for (const LeaseAnswer& a : answers) {
    auto seen = lease_seen_.find(a.worker);
    if (seen != lease_seen_.end() && seen->second.request_id == a.request_id) {
      seen->second.answer = a;
    }
  }
  // What a worker is told is in the journal first: a restarted coordinator must not lease
  // its chunk to another.
  if (!answers.empty()) PS_RETURN_IF_ERROR(Persist());
  for (const LeaseAnswer& a : answers) {
    capnp::MallocMessageBuilder b;
    SetLeaseReply(NewHeader(b, a.request_id, -1).getBody().initLeaseReply(), a);
    PS_RETURN_IF_ERROR(Send(a.peer, b));
  }
  return Status::Ok();
}

// Once every live worker is done: answers their `done` (the barrier before the final
// evaluation). The evaluator (worker 0, or the lowest live worker when 0 is gone) gets
// `evaluateFinal` instead of `doneReply` unless it is worker 0.
Status CoordinatorJob::MaybeReleaseBarrier() {
  if (barrier_released_ || stopping_ || !members_.AllLiveDone()) return Status::Ok();
  barrier_released_ = true;
  barrier_time_ = Clock::now();
  const int evaluator = members_.Evaluator();
  final_evaluator_ = evaluator;
  const std::vector<Member>& workers = members_.workers();
  for (size_t i = 0; i < workers.size(); ++i) {
    if (members_.Gone(i)) continue;
    capnp::MallocMessageBuilder b;
    auto body = NewHeader(b, workers[i].result.done_request, -1).getBody();
    if (static_cast<int>(i) == evaluator && evaluator != 0) {
      body.setEvaluateFinal();
    } else {
      body.setDoneReply();
    }
    Status s = Send(workers[i].peer, b);
    if (!s.ok()) LOG(WARNING) << "worker " << i << ": " << s.ToString();
  }
  const WorkerResult& r = workers[static_cast<size_t>(evaluator)].result;
  if (r.failed) {
    return Internal("worker " + std::to_string(evaluator) +
                    " failed, so there is no final evaluation: " + r.message);
  }
  return Status::Ok();
}

// The job was asked to stop (SIGTERM): OK means train on until the stop's checkpoint set
// is recorded (server/coord_checkpoints.h).
Status CoordinatorJob::OnStopSignal() {
  // Training is over and the final evaluation runs: nothing is left to save, so the job
  // ends as it would have (within --final_eval_timeout); stopping now would throw the
  // evaluation away and leave the evaluator waiting on a coordinator that is gone.
  if (barrier_released_) {
    if (!stop_after_eval_noted_) {
      std::printf("stopping: training is over; the job ends after its final evaluation\n");
      std::fflush(stdout);
      stop_after_eval_noted_ = true;
    }
    return Status::Ok();
  }
  bool training = false;
  for (bool t : members_.Training()) training |= t;
  return checkpoints_.OnStop(Clock::now(), Elapsed(), training, options_.stop_checkpoint_timeout,
                             progress_.servers());
}

// Every worker still training hears that the job stops with its next heartbeat reply and
// leaves as on its own SIGTERM: it ends its step, flushes its pushes to the servers (still
// up) and returns its chunk. Without this it would wait on a coordinator that is gone for
// 3 x --heartbeat_timeout plus --coordinator_restart_timeout. A worker waiting in the
// barrier (done) is answered at once. A worker that has not left within
// 2 x --heartbeat_timeout (a beat every quarter of it) is left to notice on its own.
void CoordinatorJob::SendWorkersHome() {
  stopping_ = true;
  const std::vector<Member>& workers = members_.workers();
  std::vector<bool> told(workers.size());
  auto answer_done = [&] {
    for (size_t i = 0; i < workers.size(); ++i) {
      if (told[i] || members_.Gone(i) || !workers[i].result.done) continue;
      told[i] = true;
      ReplyError(workers[i].peer, workers[i].result.done_request,
                 Aborted("the job was stopped (SIGTERM to its coordinator) before every worker "
                         "finished training"));
    }
  };
  auto training = [&] {
    const std::vector<bool> t = members_.Training();
    return static_cast<int>(std::count(t.begin(), t.end(), true));
  };
  const auto deadline = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(2000 * config_.heartbeat_timeout));
  answer_done();
  while (training() > 0 && Clock::now() < deadline) {
    if (Status s = ServeNext(); !s.ok()) {
      LOG(WARNING) << "stopping: " << s.ToString();
      break;
    }
    answer_done();
  }
  if (int left = training(); left > 0) {
    LOG(WARNING) << "stopping: " << left << " workers did not leave within "
                 << 2 * config_.heartbeat_timeout << " s; shutting the servers down anyway";
  }
}

void CoordinatorJob::OnDiverged(Divergence d) {
  if (divergence_) return;  // the first sign is the one to report
  d.advice = DivergenceAdvice(config_);
  divergence_ = std::move(d);
  LOG(ERROR) << divergence_->Describe();
  std::printf("%s\n", divergence_->Describe().c_str());
  std::fflush(stdout);
}

Status CoordinatorJob::WriteSummary(const Status& outcome, std::vector<ServerSummary> servers) {
  SummaryInputs in;
  in.outcome = outcome;
  in.divergence = divergence_;
  in.config = &config_;
  in.wall_seconds = std::chrono::duration<double>(Clock::now() - job_start_).count();
  in.train_seconds = members_.assembled() ? Elapsed() : 0.0;
  in.train_start_time = train_start_unix_;
  in.cpu_seconds = ProcessCpuSeconds();
  in.messages_during_training = messages_during_training_;
  in.eval = progress_.final_eval() ? progress_.final_eval() : progress_.last_eval();
  in.restored = checkpoints_.restored();
  in.checkpoints_recorded = checkpoints_.checkpoints_recorded();
  in.recorded_clock = checkpoints_.recorded_clock();
  in.workers = members_.workers();
  in.servers = std::move(servers);
  in.examples_per_epoch = leases_.table().examples_per_epoch();
  in.failures = failures_.ToJson();
  in.joins = failures_.JoinsJson();
  in.pushes_rolled_back = failures_.PushesRolledBack(&in.rollback_estimated);
  return WriteRunSummary(BuildSummary(in), options_.run_dir);
}

Status RunCoordinator(const JobConfig& config, const CoordinatorOptions& options,
                      Transport* transport, const std::atomic<bool>& stop) {
  if (options.run_dir.empty()) return InvalidArgument("the coordinator needs a run directory");
  CoordinatorJob job(config, options, transport);
  return job.Run(stop);
}

}  // namespace ps
