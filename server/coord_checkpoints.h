// The coordinator's record of checkpoint sets (server/checkpoint.h writes the files).
//
// Recording: servers report the clock of each checkpoint they commit. A set is whole once
// every server committed one at that clock; it is recorded (appended to
// --checkpoint_dir/checkpoints.json) once, besides, every worker still training has sent a
// lease request at or past that clock: a chunk ends with a lease request, so by then it is
// known which epochs were wholly trained by the clock. The entry says the epoch to resume
// at (the first not wholly trained by the clock; its part trained before the checkpoint is
// trained again) and the LR iteration.
//
// Restoring (--restore): ResolveRestore picks the set (latest: the latest recorded set
// whose files are whole, else the latest complete set on disk) and where the workers
// resume: the record's clock and epoch, or the set's clock and epoch 1 without a record.
// A set named by its directory is looked up in the job's record, then in the record beside
// it (a set of another run's --checkpoint_dir, or a copy of one).
//
// Naming (--checkpoint_every=<N>s, and on SIGTERM): every period the coordinator names a
// clock ahead of every server, which the servers learn from their report replies; a set
// some server refused (its clock passed before the name reached it) is removed.
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/run_summary.h"
#include "common/status.h"
#include "server/coord_progress.h"

namespace ps {

// A recorded set: its directory and clock.
struct JobSet {
  std::string set;
  int64_t clock = 0;
};

class CheckpointBook {
 public:
  // Reads config.checkpoint_dir, restore, num_servers, num_workers, epochs and
  // checkpoint_every_seconds.
  explicit CheckpointBook(const JobConfig& config) : config_(config) {}

  // ---- restore ----
  // --restore: resolves the set; afterwards restore_set() is its directory (what every
  // server loads), and start_clock()/start_epoch() where the workers resume.
  Status ResolveRestore();
  const std::optional<RestoredFrom>& restored() const { return restored_; }
  int64_t start_clock() const { return start_clock_; }
  int start_epoch() const { return start_epoch_; }

  // ---- recording ----
  // Worker `w` asked for a lease at `clock`.
  void OnLeaseRequest(int w, int64_t clock);
  // A chunk of `epoch` was completed at `clock`; every chunk of `epoch` is done.
  void OnChunkCompleted(int epoch, int64_t clock);
  void OnEpochCompleted(int epoch);
  // Server `s` of `num_servers` committed its checkpoint at `clock`. `training[w]`: worker
  // w is neither done nor gone.
  void OnServerCheckpoint(size_t s, size_t num_servers, int64_t clock,
                          const std::vector<bool>& training);
  // Records the latest whole set if every training worker passed its clock.
  void RecordWholeSet(const std::vector<bool>& training);
  // checkpoints.json, or {"sets": []} when there is none yet.
  Result<nlohmann::json> ReadRecord() const { return ReadRecordIn(config_.checkpoint_dir); }
  // The latest set of this job (or the one it restored from) whose files are whole.
  std::optional<JobSet> LatestJobSet() const;
  int64_t recorded_clock() const { return recorded_clock_; }
  uint64_t checkpoints_recorded() const { return checkpoints_recorded_; }

  // ---- restart (server/coord_resume.h) ----
  // What the book knows of this job, for the coordinator's journal, and back.
  nlohmann::json StateJson() const;
  void RestoreState(const nlohmann::json& state);

  // ---- naming ----
  // The clock named for the next set (-1: none yet).
  int64_t checkpoint_at() const { return checkpoint_at_; }
  // After a server report at `now` (seconds into training).
  void MaybeNameClock(double now, const std::vector<ServerLive>& servers);
  // The job was asked to stop (SIGTERM) at `now`. OK: keep training until the set named
  // now is recorded; Aborted: stop (at once without a --checkpoint_dir, a positive
  // `timeout`, or a worker `training`; after the set; or after `timeout`).
  Status OnStop(CoordClock::time_point now, double elapsed, bool training,
                std::chrono::milliseconds timeout, const std::vector<ServerLive>& servers);

 private:
  void NameClock(double now, const std::vector<ServerLive>& servers);
  void DropAbandonedSet(double now, const std::vector<ServerLive>& servers);
  int ResumeEpoch(int64_t clock) const;
  Status FindRestoreEntry(const nlohmann::json& record, std::string* set,
                          nlohmann::json* entry) const;
  // DIR/checkpoints.json, or {"sets": []} when there is none.
  static Result<nlohmann::json> ReadRecordIn(const std::string& dir);

  JobConfig config_;
  int64_t start_clock_ = 0;
  int start_epoch_ = 1;
  std::optional<RestoredFrom> restored_;
  std::vector<JobSet> job_sets_;  // sets of this job (and the restored one), oldest first
  int64_t recorded_clock_ = 0;    // no set is taken at clock 0
  uint64_t checkpoints_recorded_ = 0;
  int64_t whole_clock_ = 0;                   // the latest set every server committed
  std::vector<int64_t> lease_clock_;          // per worker: its clock at its latest request
  std::vector<std::set<int64_t>> committed_;  // per server: clocks of its committed files
  std::map<int, int64_t> epoch_last_clock_;   // epoch -> largest clock a chunk of it ended at
  std::map<int, int64_t> epoch_done_clock_;   // epoch -> that clock, once the epoch is done
  int64_t checkpoint_at_ = -1;
  int64_t abandoned_checkpoint_at_ = -1;  // the named clock whose set was dropped
  double next_checkpoint_time_ = -1;      // seconds into training; -1: at the first report
  // Stopping: the set waited for, and until when.
  int64_t stop_checkpoint_at_ = -1;
  std::optional<CoordClock::time_point> stop_checkpoint_deadline_;
};

}  // namespace ps
