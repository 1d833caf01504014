// The job's failure log: every process lost, gone or failed, what was recovered, and the
// workers that joined the running job. summary.json's `failures` and `joins`, and
// ps_status's `failures`, are its JSON (ToJson, JoinsJson): typed entries here, JSON made
// in one place.
//
// Kinds: `worker_lost` (silent past --heartbeat_timeout), `worker_left` (SIGTERM),
// `worker_failed` (sent done with an error), `server_lost` (silent; failed over to its
// backup with --replicas=2, or restarted from a checkpoint set with --replicas=1, which
// fills the entry's restart and `rollback` fields when the replacement arrives),
// `server_left` (SIGTERM with --replicas=2: it handed its shards to its backup, promoted
// before it exited, with nothing to roll back),
// `coordinator_restart` (the coordinator died and a new one resumed the job from its
// journal, server/coord_journal.h: `clock` is the fastest live worker's clock it knew,
// `down_seconds` the time from its last journal write to the restart).
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ps {

enum class FailureKind {
  kWorkerLost,
  kWorkerLeft,
  kWorkerFailed,
  kServerLost,
  kServerLeft,
  kCoordinatorRestart
};

// What a server restarted from a checkpoint set lost (--replicas=1).
struct Rollback {
  int64_t checkpoint_clock = 0;        // the set's clock (0: the initial values)
  std::optional<std::string> set;      // the set's directory; none: the initial values
  int64_t clock_at_loss = -1;          // the slowest live clock the dead server reported
  int64_t workers_clock_at_loss = -1;  // the fastest live worker's clock then
  int64_t clocks_rolled_back = 0;
  // Pushes it applied after the set's clock, as of its last report (a lower bound);
  // none when not known.
  std::optional<uint64_t> pushes_since_checkpoint;
  // The clocks rolled back at its mean pushes per clock.
  std::optional<uint64_t> pushes_since_checkpoint_estimate;
};

struct FailureEntry {
  FailureKind kind = FailureKind::kWorkerLost;
  int id = -1;  // the worker's or server's id
  std::optional<uint32_t> pid;
  std::optional<std::string> host;
  double time = 0;                       // seconds into training
  std::optional<double> unix_time;       // of the detection
  std::optional<double> silent_seconds;  // since its last message
  std::optional<std::string> recovered;  // what the job did about it
  std::optional<std::string> message;    // worker_failed: its error
  // worker_lost / worker_left
  std::optional<int> leases_returned;
  std::optional<bool> completed_chunk_before_leaving;
  // server_lost, failed over (--replicas=2)
  std::optional<int> promoted;
  std::optional<double> promoted_unix_time, failover_seconds;
  std::optional<double> first_pull_served_unix_time, first_pull_served_seconds;
  // server_lost, restarted (--replicas=1)
  std::optional<int64_t> clock_at_loss, workers_clock_at_loss;
  std::optional<Rollback> rollback;
  std::optional<double> restarted_at, restarted_unix_time;
  std::optional<uint32_t> new_pid;
  std::optional<std::string> new_endpoint;
  std::optional<double> restore_seconds, serving_unix_time;
  // server_lost / server_left, restarted (--replicas=2): its shards handed back to it (the
  // snapshot's size, and how long the server that served them paused to send it), its
  // predecessor's copy sent to it, and when every shard had two copies again (seconds from
  // the detection).
  std::optional<uint64_t> handback_bytes, predecessor_copy_bytes;
  std::optional<double> handback_pause_seconds, rereplicated_unix_time, rereplication_seconds;
  // coordinator_restart
  std::optional<int64_t> clock;
  std::optional<double> down_seconds;

  nlohmann::json ToJson() const;
};

// A worker that joined the running job.
struct JoinEntry {
  uint32_t worker = 0;
  uint32_t pid = 0;
  std::string host;
  double time = 0;  // seconds into training
};

class FailureLog {
 public:
  // Appends an entry; returns its index (stable: entries are never removed).
  size_t Add(FailureEntry entry);
  FailureEntry& at(size_t i) { return entries_[i]; }
  const std::vector<FailureEntry>& entries() const { return entries_; }
  void AddJoin(JoinEntry join) { joins_.push_back(std::move(join)); }

  // A promoted backup served its first pull of a dead server's shards at `served`
  // (server id as a string -> Unix time): each failed-over entry gets it once, with the
  // time from the dead server's last heartbeat.
  void NoteFirstPullsAfterFailover(const nlohmann::json& served);

  // Pushes that restarted servers rolled back: per rollback the larger of the reported
  // count and the estimate. *estimated: some server was restarted.
  uint64_t PushesRolledBack(bool* estimated) const;

  nlohmann::json ToJson() const;
  nlohmann::json JoinsJson() const;

  // A restarted coordinator: the entries and joins an earlier one logged (ToJson and
  // JoinsJson as journaled) come first. They are kept as JSON; rollbacks among them still
  // count in PushesRolledBack.
  void RestoreEarlier(nlohmann::json entries, nlohmann::json joins);

 private:
  std::vector<FailureEntry> entries_;
  std::vector<JoinEntry> joins_;
  nlohmann::json earlier_ = nlohmann::json::array(), earlier_joins_ = nlohmann::json::array();
};

}  // namespace ps
