// The coordinator and its servers during training (server/coordinator.h): servers that
// die, leave (SIGTERM), report, and register while the job runs, to replace a dead one
// (--replicas=1, from a checkpoint set) or to restart it and take its shards back from its
// backup (--replicas=2, re-replication: server/replication.h).
#include <glog/logging.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "common/run_files.h"
#include "common/wire.h"
#include "server/coord_messages.h"
#include "server/coordinator_job.h"

namespace ps {

using Clock = CoordClock;
using nlohmann::json;

// A ps_server registered while the job runs: it replaces a dead server (--replicas=1) or
// restarts one whose backup serves its shards (--replicas=2), or waits (its registration
// unanswered) until one is declared dead, so that a server restarted before the
// coordinator noticed the death is not turned away.
Status CoordinatorJob::OnServerJoin(const std::string& peer, uint64_t rid,
                                    wire::Register::Reader reg) {
  Member m = MemberFromRegistration(peer, rid, reg);
  if (Status ep = ValidateEndpoint(m.endpoint); !ep.ok()) {
    ReplyError(peer, rid, ep);
    return Status::Ok();
  }
  failover_.AddWaiting(std::move(m));
  return AssignWaitingServers();
}

// Gives each dead server's slot to a waiting replacement, restored from the latest set
// this job recorded (--replicas=1), or sent its shards by the backup that serves them once
// it reports (--replicas=2, OnServerReport).
Status CoordinatorJob::AssignWaitingServers() {
  const bool replicated = config_.replicas >= 2;
  for (auto& [s, m] : failover_.TakeAssignments(replicated)) {
    if (replicated) {
      failover_.Rejoin(s, std::move(m), Elapsed(), &failures_);
      progress_.servers()[static_cast<size_t>(s)] = ServerLive{};
      ReplyReplacement(s, std::nullopt);
      continue;
    }
    const std::optional<JobSet> set = checkpoints_.LatestJobSet();
    failover_.Replace(s, std::move(m), set, Elapsed(), &failures_);
    progress_.servers()[static_cast<size_t>(s)] = ServerLive{};
    ReplyReplacement(s, set);
  }
  return Status::Ok();
}

// The replacement's registration reply: the dead server's id, the set to restore, and the
// workers that are gone (evicted) or done (idle); with --replicas=2, `rejoin`.
void CoordinatorJob::ReplyReplacement(int s, const std::optional<JobSet>& set) {
  const Member& server = members_.servers()[static_cast<size_t>(s)];
  capnp::MallocMessageBuilder b;
  auto r = NewHeader(b, server.register_request, -1).getBody().initRegisterReply();
  r.setId(static_cast<uint32_t>(s));
  SetConfigAndShardMap(r, config_, members_.servers());
  std::vector<uint32_t> evicted, idle;
  members_.GoneAndIdle(&evicted, &idle);
  if (config_.replicas >= 2) {
    r.setRejoin(true);  // its shards come from its backup, with their clock table
  } else {
    SetReplacement(r, set ? set->set : std::string(), evicted, idle);
  }
  if (Status sent = Send(server.peer, b); !sent.ok()) {
    LOG(ERROR) << "server " << s << "'s replacement: " << sent.ToString();
  }
}

// Server `s` is silent: it is dead to the job (not shut down, not asked again). With
// --replicas=2 its backup is promoted; with --replicas=1 its slot waits for a replacement
// (OnServerJoin), which restores the latest recorded checkpoint set.
void CoordinatorJob::OnSilentServer(int s, Clock::time_point now) {
  Member& m = members_.servers()[static_cast<size_t>(s)];
  LOG(ERROR) << "server " << s << " is silent (no heartbeat for " << config_.heartbeat_timeout
             << " s)";
  m.dead = true;
  FailureEntry e;
  e.kind = FailureKind::kServerLost;
  e.id = s;
  e.pid = m.pid;
  e.silent_seconds = members_.SilentSeconds(m, now);
  if (config_.replicas >= 2) {
    failover_.PromoteBackup(s, m.last_seen, Elapsed(), &e);
  } else {
    // Where the workers stood: the slowest live clock the server last reported, and the
    // fastest worker's clock in the workers' last reports.
    e.clock_at_loss = progress_.servers()[static_cast<size_t>(s)].clock;
    e.workers_clock_at_loss = progress_.FastestLiveClock(members_);
    e.recovered = "nothing yet: waiting for a replacement ps_server (--replicas=1)";
  }
  e.time = Elapsed();
  // Wall-clock time of the detection, so that a test can measure it from the kill.
  e.unix_time = UnixSeconds();
  LOG(WARNING) << "server " << s << " declared dead: " << e.ToJson().dump();
  if (config_.replicas < 2) {
    std::printf("server %d lost: waiting for a replacement server  %.1fs\n", s, Elapsed());
    std::fflush(stdout);
  }
  progress_.CountFailure();
  const size_t index = failures_.Add(std::move(e));
  failover_.OnServerLost(s, index, progress_.servers()[static_cast<size_t>(s)]);
}

void CoordinatorJob::OnServerLeaving(int s) {
  Member& m = members_.servers()[static_cast<size_t>(s)];
  if (config_.replicas < 2) return;  // it stops as on a death; a replacement restores
  m.dead = true;
  FailureEntry e;
  e.kind = FailureKind::kServerLeft;
  e.id = s;
  e.pid = m.pid;
  e.time = Elapsed();
  e.unix_time = UnixSeconds();
  failover_.PromoteBackup(s, Clock::now(), Elapsed(), &e);
  LOG(WARNING) << "server " << s << " left (SIGTERM): " << e.ToJson().dump();
  progress_.CountFailure();
  const size_t index = failures_.Add(std::move(e));
  failover_.OnServerLost(s, index, progress_.servers()[static_cast<size_t>(s)]);
}

// A server's periodic status (server/server_node.h: ServerStatusJson): the live view,
// the checkpoints it committed, a replacement's first report, a failover's first pull.
void CoordinatorJob::OnServerReport(int s, const char* text) {
  std::optional<json> j = ParseServerReport(text);
  if (!j) return;
  if (j->contains("leaving") && (*j)["leaving"].is_boolean() && (*j)["leaving"].get<bool>()) {
    OnServerLeaving(s);
    return;
  }
  if (j->contains("promoted_first_pull_unix_time") &&
      (*j)["promoted_first_pull_unix_time"].is_object()) {
    failures_.NoteFirstPullsAfterFailover((*j)["promoted_first_pull_unix_time"]);
  }
  const bool committed =
      j->contains("checkpoint_clock") && (*j)["checkpoint_clock"].is_number_integer();
  const double restore_seconds = j->value("restore_seconds", 0.0);
  const double now = Elapsed();
  ServerLive& live = progress_.servers()[static_cast<size_t>(s)];
  live.Apply(std::move(*j), now);
  if (committed) {
    checkpoints_.OnServerCheckpoint(static_cast<size_t>(s), members_.servers().size(),
                                    live.checkpoint_clock, members_.Training());
  }
  failover_.OnReplacementServing(s, restore_seconds, &failures_);
  failover_.OnRejoinedServing(s, Elapsed(), &failures_);
  checkpoints_.MaybeNameClock(now, progress_.servers());
}

}  // namespace ps
