#include "server/coord_failures.h"

#include <algorithm>

namespace ps {
namespace {

using nlohmann::json;

template <typename T>
void Put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

const char* KindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kWorkerLost:
      return "worker_lost";
    case FailureKind::kWorkerLeft:
      return "worker_left";
    case FailureKind::kWorkerFailed:
      return "worker_failed";
    case FailureKind::kServerLost:
      return "server_lost";
    case FailureKind::kServerLeft:
      return "server_left";
    case FailureKind::kCoordinatorRestart:
      return "coordinator_restart";
  }
  return "unknown";
}

json RollbackJson(const Rollback& r) {
  json j = {{"checkpoint_clock", r.checkpoint_clock},
            {"set", r.set ? json(*r.set) : json(nullptr)},
            {"clock_at_loss", r.clock_at_loss},
            {"workers_clock_at_loss", r.workers_clock_at_loss},
            {"clocks_rolled_back", r.clocks_rolled_back},
            {"pushes_since_checkpoint",
             r.pushes_since_checkpoint ? json(*r.pushes_since_checkpoint) : json(nullptr)}};
  Put(j, "pushes_since_checkpoint_estimate", r.pushes_since_checkpoint_estimate);
  return j;
}

}  // namespace

json FailureEntry::ToJson() const {
  const bool server = kind == FailureKind::kServerLost || kind == FailureKind::kServerLeft;
  json j = {{"kind", KindName(kind)}, {"time", time}};
  if (kind == FailureKind::kCoordinatorRestart) {
    j["process"] = "coordinator";
  } else {
    j["process"] = (server ? "server-" : "worker-") + std::to_string(id);
    j[server ? "server" : "worker"] = id;
  }
  Put(j, "pid", pid);
  Put(j, "host", host);
  Put(j, "unix_time", unix_time);
  Put(j, "silent_seconds", silent_seconds);
  Put(j, "recovered", recovered);
  Put(j, "message", message);
  Put(j, "leases_returned", leases_returned);
  Put(j, "completed_chunk_before_leaving", completed_chunk_before_leaving);
  Put(j, "promoted", promoted);
  Put(j, "promoted_unix_time", promoted_unix_time);
  Put(j, "failover_seconds", failover_seconds);
  Put(j, "first_pull_served_unix_time", first_pull_served_unix_time);
  Put(j, "first_pull_served_seconds", first_pull_served_seconds);
  Put(j, "clock_at_loss", clock_at_loss);
  Put(j, "workers_clock_at_loss", workers_clock_at_loss);
  if (rollback) j["rollback"] = RollbackJson(*rollback);
  Put(j, "restarted_at", restarted_at);
  Put(j, "restarted_unix_time", restarted_unix_time);
  Put(j, "new_pid", new_pid);
  Put(j, "new_endpoint", new_endpoint);
  Put(j, "restore_seconds", restore_seconds);
  Put(j, "serving_unix_time", serving_unix_time);
  Put(j, "handback_bytes", handback_bytes);
  Put(j, "handback_pause_seconds", handback_pause_seconds);
  Put(j, "predecessor_copy_bytes", predecessor_copy_bytes);
  Put(j, "rereplicated_unix_time", rereplicated_unix_time);
  Put(j, "rereplication_seconds", rereplication_seconds);
  Put(j, "clock", clock);
  Put(j, "down_seconds", down_seconds);
  return j;
}

size_t FailureLog::Add(FailureEntry entry) {
  entries_.push_back(std::move(entry));
  return entries_.size() - 1;
}

void FailureLog::NoteFirstPullsAfterFailover(const json& served) {
  for (FailureEntry& e : entries_) {
    if (e.kind != FailureKind::kServerLost || e.first_pull_served_unix_time) continue;
    const std::string server = std::to_string(e.id);
    if (!served.contains(server) || !served[server].is_number()) continue;
    const double t = served[server].get<double>();
    e.first_pull_served_unix_time = t;
    // From its last heartbeat: an upper bound of the time from its death.
    const double last_heartbeat = e.unix_time.value_or(0.0) - e.silent_seconds.value_or(0.0);
    e.first_pull_served_seconds = t - last_heartbeat;
  }
}

uint64_t FailureLog::PushesRolledBack(bool* estimated) const {
  uint64_t rolled_back = 0;
  *estimated = false;
  for (const json& e : earlier_) {
    if (!e.is_object() || !e.contains("rollback") || !e["rollback"].is_object()) continue;
    *estimated = true;
    const json& r = e["rollback"];
    const auto count = [&r](const char* key) -> uint64_t {
      return r.contains(key) && r[key].is_number_unsigned() ? r[key].get<uint64_t>() : 0;
    };
    rolled_back +=
        std::max(count("pushes_since_checkpoint"), count("pushes_since_checkpoint_estimate"));
  }
  for (const FailureEntry& e : entries_) {
    if (!e.rollback) continue;
    *estimated = true;
    rolled_back += std::max(e.rollback->pushes_since_checkpoint.value_or(0),
                            e.rollback->pushes_since_checkpoint_estimate.value_or(0));
  }
  return rolled_back;
}

void FailureLog::RestoreEarlier(json entries, json joins) {
  earlier_ = entries.is_array() ? std::move(entries) : json::array();
  earlier_joins_ = joins.is_array() ? std::move(joins) : json::array();
}

json FailureLog::ToJson() const {
  json j = earlier_;
  for (const FailureEntry& e : entries_) j.push_back(e.ToJson());
  return j;
}

json FailureLog::JoinsJson() const {
  json j = earlier_joins_;
  for (const JoinEntry& e : joins_) {
    j.push_back({{"worker", e.worker}, {"pid", e.pid}, {"host", e.host}, {"time", e.time}});
  }
  return j;
}

}  // namespace ps
