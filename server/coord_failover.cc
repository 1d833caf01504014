#include "server/coord_failover.h"

#include <glog/logging.h>

#include <cmath>
#include <cstdio>

#include "common/run_files.h"

namespace ps {

Rollback ComputeRollback(int64_t checkpoint_clock, const std::optional<std::string>& set,
                         int64_t clock_at_loss, int64_t workers_clock_at_loss,
                         const ServerLive& before) {
  Rollback r;
  r.checkpoint_clock = checkpoint_clock;
  r.set = set;
  r.clock_at_loss = clock_at_loss;
  r.workers_clock_at_loss = workers_clock_at_loss;
  const int64_t at_loss = std::max(clock_at_loss, workers_clock_at_loss);
  r.clocks_rolled_back = at_loss >= checkpoint_clock ? at_loss - checkpoint_clock : 0;
  // Pushes the dead server applied after that checkpoint, as of its last status report
  // (so at least this many; the ones after that report are not known).
  auto base = before.pushes_at_checkpoint.find(checkpoint_clock);
  if (checkpoint_clock == 0 && base == before.pushes_at_checkpoint.end()) {
    r.pushes_since_checkpoint = before.pushes;
  } else if (base != before.pushes_at_checkpoint.end() && before.pushes >= base->second) {
    r.pushes_since_checkpoint = before.pushes - base->second;
  }
  // An estimate of all of them: the clocks rolled back at the pushes per clock the dead
  // server had served on average.
  if (before.clock > 0 && r.clocks_rolled_back > 0) {
    r.pushes_since_checkpoint_estimate = static_cast<uint64_t>(
        std::llround(static_cast<double>(before.pushes) / static_cast<double>(before.clock) *
                     static_cast<double>(r.clocks_rolled_back)));
  }
  return r;
}

int Failover::ServedBy(int s) const {
  auto it = promoted_.find(s);
  if (it != promoted_.end()) return it->second;
  return members_->servers()[static_cast<size_t>(s)].dead ? -1 : s;
}

nlohmann::json Failover::StatusOf(int s) const {
  if (s < 0 || static_cast<size_t>(s) >= members_->servers().size()) return {{"state", "unknown"}};
  const int by = ServedBy(s);
  nlohmann::json j = {{"state", by == s ? "serving" : "lost"}};
  if (by != s) j["served_by"] = by;
  nlohmann::json serves = nlohmann::json::array();
  for (const auto& [dead, backup] : promoted_) {
    if (backup == s && dead != s) serves.push_back(dead);
  }
  if (!serves.empty()) j["serves_for"] = serves;
  return j;
}

std::vector<std::pair<uint32_t, std::string>> Failover::Redirects() const {
  std::vector<std::pair<uint32_t, std::string>> list;
  const std::vector<Member>& servers = members_->servers();
  for (const auto& [dead, backup] : promoted_) {
    list.emplace_back(static_cast<uint32_t>(dead), servers[static_cast<size_t>(backup)].endpoint);
  }
  for (int s : replaced_) {
    list.emplace_back(static_cast<uint32_t>(s), servers[static_cast<size_t>(s)].endpoint);
  }
  return list;
}

// A request to server `s` (its socket is connected on first use and reset after a failed
// call, so that a late reply cannot answer the next call).
Result<CallReply> Failover::CallServer(int s, Frames f, std::chrono::milliseconds timeout) {
  if (sockets_.size() < members_->servers().size()) sockets_.resize(members_->servers().size());
  std::unique_ptr<ClientSocket>& sock = sockets_[static_cast<size_t>(s)];
  if (!sock) {
    PS_ASSIGN_OR_RETURN(sock,
                        transport_->Connect(members_->servers()[static_cast<size_t>(s)].endpoint));
  }
  Result<CallReply> reply = Call(*sock, std::move(f), timeout);
  if (!reply.ok()) sock.reset();
  return reply;
}

void Failover::PromoteBackup(int s, CoordClock::time_point last_seen, double elapsed,
                             FailureEntry* entry) {
  const std::vector<Member>& servers = members_->servers();
  const int backup = (s + 1) % static_cast<int>(servers.size());
  if (backup == s || servers[static_cast<size_t>(backup)].dead) {
    entry->recovered = "nothing: the backup, server " + std::to_string(backup) + ", is gone too";
    return;
  }
  capnp::MallocMessageBuilder b;
  NewHeader(b, ++request_, -1).getBody().initPromote().setPrimary(s);
  Frames f;
  f.push_back(EncodeFrame(b));
  Result<CallReply> reply = CallServer(backup, std::move(f), options_.evict_timeout);
  Status st = !reply.ok() ? reply.status()
              : reply->header.get().getBody().which() == wire::Header::Body::PROMOTE_REPLY
                  ? Status::Ok()
                  : Internal("server " + std::to_string(backup) + " refused the promotion");
  if (!st.ok()) {
    LOG(ERROR) << "promoting server " << backup << " for server " << s << ": " << st.ToString();
    entry->recovered =
        "nothing: promoting server " + std::to_string(backup) + " failed: " + st.ToString();
    return;
  }
  promoted_[s] = backup;
  entry->promoted = backup;
  entry->promoted_unix_time = UnixSeconds();
  // From the last heartbeat (the server died after it) to the promotion: an upper bound
  // of the time its shards could not be served.
  entry->failover_seconds = std::chrono::duration<double>(CoordClock::now() - last_seen).count();
  entry->recovered = "server " + std::to_string(backup) +
                     " serves its shards from its copy (every acknowledged push); they run "
                     "without a backup from now on";
  std::printf("server %d lost: server %d serves its shards now  %.1fs\n", s, backup, elapsed);
  std::fflush(stdout);
}

void Failover::EvictOnServers(int w) {
  for (size_t s = 0; s < members_->servers().size(); ++s) {
    const int to = ServedBy(static_cast<int>(s));
    if (to < 0) continue;  // its shards are lost: nobody to tell
    capnp::MallocMessageBuilder b;
    auto h = NewHeader(b, ++request_, -1);
    // A failed-over server's shards: its promoted backup drops the worker there too.
    if (to != static_cast<int>(s)) h.setTargetServer(static_cast<int32_t>(s));
    h.getBody().initEvict().setWorker(w);
    Frames f;
    f.push_back(EncodeFrame(b));
    Result<CallReply> reply = CallServer(to, std::move(f), options_.evict_timeout);
    if (!reply.ok()) {
      LOG(ERROR) << "server " << to << " did not confirm the eviction of worker " << w
                 << " from the shards of server " << s << ": " << reply.status().ToString();
    }
  }
}

void Failover::OnServerLost(int s, size_t entry, const ServerLive& last) {
  lost_live_[s] = last;
  lost_event_[s] = entry;
}

void Failover::AddWaiting(Member m) {
  for (Member& w : waiting_) {
    if (w.peer == m.peer) {
      w = std::move(m);  // the same process asking again
      return;
    }
  }
  LOG(INFO) << "server registered while the job runs: " << m.endpoint << " (pid " << m.pid
            << "); it replaces the next dead server";
  waiting_.push_back(std::move(m));
}

std::vector<std::pair<int, Member>> Failover::TakeAssignments(bool replicated) {
  std::vector<std::pair<int, Member>> out;
  const std::vector<Member>& servers = members_->servers();
  for (size_t s = 0; s < servers.size() && !waiting_.empty(); ++s) {
    if (!servers[s].dead || (promoted_.count(static_cast<int>(s)) > 0) != replicated) continue;
    // A failed-over server needs no entry of this coordinator's: one restarted since lost
    // them (EntryFor makes one).
    if (!replicated && lost_event_.count(static_cast<int>(s)) == 0) continue;
    auto pick = waiting_.begin();
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->requested_id == static_cast<int>(s)) {
        pick = it;
        break;
      }
    }
    out.emplace_back(static_cast<int>(s), std::move(*pick));
    waiting_.erase(pick);
  }
  return out;
}

void Failover::Replace(int s, Member m, const std::optional<JobSet>& set, double elapsed,
                       FailureLog* log) {
  FailureEntry& entry = log->at(lost_event_[s]);
  const int64_t restored = set ? set->clock : 0;
  entry.rollback = ComputeRollback(
      restored, set ? std::optional<std::string>(set->set) : std::nullopt,
      entry.clock_at_loss.value_or(-1), entry.workers_clock_at_loss.value_or(-1), lost_live_[s]);
  entry.restarted_at = elapsed;
  entry.restarted_unix_time = UnixSeconds();
  entry.new_pid = m.pid;
  entry.new_endpoint = m.endpoint;
  const std::string pid = std::to_string(m.pid);
  entry.recovered =
      set ? "restarted (pid " + pid + ") from the checkpoint at clock " + std::to_string(restored) +
                ": the updates to its shards after that clock are lost (a rollback of " +
                std::to_string(entry.rollback->clocks_rolled_back) +
                " clocks); the workers go on from their clocks"
          : "restarted (pid " + pid +
                ") from the initial values: no checkpoint set was recorded, so every update "
                "to its shards is lost";
  LOG(WARNING) << "server " << s << " replaced: " << entry.ToJson().dump();
  std::printf(
      "server %d restarted (pid %u) from %s  %.1fs\n", s, m.pid,
      set ? ("the checkpoint at clock " + std::to_string(restored)).c_str() : "the initial values",
      elapsed);
  std::fflush(stdout);
  m.last_seen = CoordClock::now();
  members_->servers()[static_cast<size_t>(s)] = std::move(m);
  if (static_cast<size_t>(s) < sockets_.size()) sockets_[static_cast<size_t>(s)].reset();
  replaced_.insert(s);
  awaiting_first_report_[s] = lost_event_[s];
}

FailureEntry& Failover::EntryFor(int s, FailureLog* log) {
  auto it = lost_event_.find(s);
  if (it != lost_event_.end()) return log->at(it->second);
  // Lost before this coordinator was restarted: the entry of then is in the journal's
  // earlier entries, which are not kept as values.
  FailureEntry e;
  e.kind = FailureKind::kServerLost;
  e.id = s;
  e.recovered = "failed over before the coordinator was restarted";
  const size_t index = log->Add(std::move(e));
  lost_event_[s] = index;
  return log->at(index);
}

void Failover::Rejoin(int s, Member m, double elapsed, FailureLog* log) {
  FailureEntry& entry = EntryFor(s, log);
  entry.restarted_at = elapsed;
  entry.restarted_unix_time = UnixSeconds();
  entry.new_pid = m.pid;
  entry.new_endpoint = m.endpoint;
  LOG(WARNING) << "server " << s << " restarted (pid " << m.pid << " at " << m.endpoint
               << "); server " << promoted_[s] << " will hand its shards back";
  m.last_seen = CoordClock::now();
  members_->servers()[static_cast<size_t>(s)] = std::move(m);
  if (static_cast<size_t>(s) < sockets_.size()) sockets_[static_cast<size_t>(s)].reset();
  awaiting_rejoin_.insert(s);
}

Result<CallReply> Failover::CallRereplicate(int to, int primary, const std::string& endpoint,
                                            bool hand_back) {
  capnp::MallocMessageBuilder b;
  auto r = NewHeader(b, ++request_, -1).getBody().initRereplicate();
  r.setPrimary(primary);
  r.setEndpoint(endpoint);
  r.setHandBack(hand_back);
  Frames f;
  f.push_back(EncodeFrame(b));
  // The server pauses to copy the shards (and, for a hand back, waits for the restarted
  // one to load them): longer than an eviction may take.
  Result<CallReply> reply = CallServer(to, std::move(f), options_.rereplicate_timeout);
  if (reply.ok() &&
      reply->header.get().getBody().which() != wire::Header::Body::REREPLICATE_REPLY) {
    return Internal("server " + std::to_string(to) + " answered rereplicate with another message");
  }
  return reply;
}

void Failover::OnRejoinedServing(int s, double elapsed, FailureLog* log) {
  if (awaiting_rejoin_.erase(s) == 0) return;
  FailureEntry& entry = EntryFor(s, log);
  const int holder = promoted_.count(s) > 0 ? promoted_[s] : -1;
  const std::string endpoint = members_->servers()[static_cast<size_t>(s)].endpoint;
  Result<CallReply> back = holder < 0 ? Result<CallReply>(FailedPrecondition("no copy is served"))
                                      : CallRereplicate(holder, s, endpoint, true);
  if (!back.ok()) {
    LOG(ERROR) << "server " << s
               << "'s restart: its shards were not handed back: " << back.status().ToString();
    entry.recovered = entry.recovered.value_or("") + "; the restarted server got no copy (" +
                      back.status().ToString() + "): its shards keep one copy";
    return;
  }
  auto copied = back->header.get().getBody().getRereplicateReply();
  entry.handback_bytes = copied.getBytes();
  entry.handback_pause_seconds = copied.getSeconds();
  promoted_.erase(s);
  replaced_.insert(s);  // the workers are redirected to the restarted server
  // Its predecessor's shards lost their copy with it (BackupOf(p) = s).
  const int n = static_cast<int>(members_->servers().size());
  const int pred = (s + n - 1) % n;
  std::string pred_note;
  if (pred != s && ServedBy(pred) == pred) {
    Result<CallReply> copy = CallRereplicate(pred, pred, endpoint, false);
    if (copy.ok()) {
      entry.predecessor_copy_bytes = copy->header.get().getBody().getRereplicateReply().getBytes();
    } else {
      pred_note = "; server " + std::to_string(pred) + " did not send it a copy of its shards (" +
                  copy.status().ToString() + ")";
      LOG(ERROR) << "server " << s << "'s restart" << pred_note;
    }
  } else if (pred != s) {
    pred_note = "; server " + std::to_string(pred) + "'s shards are served by server " +
                std::to_string(ServedBy(pred)) + " and keep one copy";
  }
  entry.rereplicated_unix_time = UnixSeconds();
  if (entry.unix_time)
    entry.rereplication_seconds = *entry.rereplicated_unix_time - *entry.unix_time;
  entry.recovered = entry.recovered.value_or("") + "; restarted (pid " +
                    std::to_string(entry.new_pid.value_or(0)) +
                    ") and given its shards back: two copies again" + pred_note;
  LOG(WARNING) << "server " << s << " re-replicated: " << entry.ToJson().dump();
  std::printf(
      "server %d restarted: its shards are back from server %d (%.1f MB, %.2f s pause)%s, "
      "%.1f s after it was lost  %.1fs\n",
      s, holder, static_cast<double>(*entry.handback_bytes) / 1e6, *entry.handback_pause_seconds,
      pred_note.empty() ? "; every shard has two copies again" : pred_note.c_str(),
      entry.rereplication_seconds.value_or(0), elapsed);
  std::fflush(stdout);
}

void Failover::OnReplacementServing(int s, double restore_seconds, FailureLog* log) {
  auto it = awaiting_first_report_.find(s);
  if (it == awaiting_first_report_.end()) return;
  FailureEntry& entry = log->at(it->second);
  awaiting_first_report_.erase(it);
  entry.restore_seconds = restore_seconds;
  entry.serving_unix_time = UnixSeconds();
  LOG(INFO) << "server " << s << "'s replacement serves (restore took " << restore_seconds << " s)";
}

namespace {

ServerCounters CountersFrom(wire::ServerStats::Reader st) {
  ServerCounters c;
  c.pushes_applied = st.getPushesApplied();
  c.pushes_rejected = st.getPushesRejected();
  c.pulls_served = st.getPullsServed();
  c.bytes_pushed = st.getBytesPushed();
  c.bytes_pulled = st.getBytesPulled();
  c.rows_held = st.getRowsHeld();
  c.pushes_dropped = st.getPushesDropped();
  c.pulls_held = st.getPullsHeld();
  c.max_clock_lag = st.getMaxClockLag();
  c.staleness_sum = st.getStalenessSum();
  c.staleness_max = st.getStalenessMax();
  c.rows_in_memory = st.getRowsInMemory();
  c.rows_spilled = st.getRowsSpilled();
  c.cache_hits = st.getCacheHits();
  c.cache_misses = st.getCacheMisses();
  c.spill_bytes_read = st.getSpillBytesRead();
  c.spill_bytes_written = st.getSpillBytesWritten();
  c.peak_rss_bytes = st.getPeakRssBytes();
  c.pushes_duplicate = st.getPushesDuplicate();
  c.workers_evicted = st.getWorkersEvicted();
  for (uint64_t n : st.getStalenessHistogram()) c.staleness_histogram.push_back(n);
  return c;
}

// What a lost server last reported (server/server_node.h: ServerStatusJson): its counters
// and when. The report came from the network and passed ParseServerReport; only its known
// counters are copied, as they are.
nlohmann::json BeforeLoss(const ServerLive& last) {
  nlohmann::json j = {{"seconds", last.time}};
  for (const char* key : {"pushes", "pushes_rejected", "pulls", "bytes_pushed", "bytes_pulled",
                          "rows", "rows_in_memory", "rows_spilled", "cache_hits", "cache_misses",
                          "checkpoint_clock", "clock"}) {
    if (last.report.contains(key)) j[key] = last.report[key];
  }
  return j;
}

}  // namespace

Status Failover::ShutdownServers(std::vector<ServerSummary>* out) {
  Status first_error;
  const std::vector<Member>& servers = members_->servers();
  for (size_t s = 0; s < servers.size(); ++s) {
    ServerSummary entry;
    entry.id = s;
    entry.endpoint = servers[s].endpoint;
    if (auto lost = lost_live_.find(static_cast<int>(s));
        lost != lost_live_.end() && lost->second.report.is_object()) {
      entry.before_loss = BeforeLoss(lost->second);
    }
    if (servers[s].dead) {
      // Failed over, or dead and never replaced: its counters died with it.
      entry.state = "lost";
      entry.served_by = ServedBy(static_cast<int>(s));
      out->push_back(std::move(entry));
      continue;
    }
    Result<CallReply> reply = Unavailable("not contacted");
    Result<std::unique_ptr<ClientSocket>> sock = transport_->Connect(servers[s].endpoint);
    if (sock.ok()) {
      capnp::MallocMessageBuilder b;
      NewHeader(b, 1, -1).getBody().setShutdown();
      Frames f;
      f.push_back(EncodeFrame(b));
      reply = Call(**sock, std::move(f), options_.shutdown_timeout);
    } else {
      reply = sock.status();
    }
    if (reply.ok() && reply->header.get().getBody().which() == wire::Header::Body::SHUTDOWN_REPLY) {
      entry.counters = CountersFrom(reply->header.get().getBody().getShutdownReply());
    } else {
      Status e = reply.ok() ? Internal("unexpected reply to shutdown") : reply.status();
      LOG(ERROR) << "server " << s << " did not shut down cleanly: " << e.ToString();
      entry.error = e.ToString();
      if (first_error.ok()) first_error = e.WithContext("server " + std::to_string(s));
    }
    out->push_back(std::move(entry));
  }
  return first_error;
}

nlohmann::json Failover::StateJson() const {
  nlohmann::json promoted = nlohmann::json::array();
  for (const auto& [dead, backup] : promoted_) promoted.push_back({dead, backup});
  return {{"promoted", promoted}, {"replaced", replaced_}, {"rejoining", awaiting_rejoin_}};
}

void Failover::RestoreState(const nlohmann::json& state) {
  promoted_.clear();
  replaced_.clear();
  awaiting_rejoin_.clear();
  try {
    for (const auto& [dead, backup] :
         state.at("promoted").get<std::vector<std::pair<int, int>>>()) {
      promoted_[dead] = backup;
    }
    replaced_ = state.at("replaced").get<std::set<int>>();
    // Restarted servers still waiting for their shards: handed back on their next report.
    awaiting_rejoin_ = state.value("rejoining", std::set<int>{});
  } catch (const nlohmann::json::exception&) {
    LOG(WARNING) << "coordinator journal: no failover state; none restored";
  }
}

}  // namespace ps
