// A server's request handling, without sockets: requests in, replies out. Keeping it free
// of I/O makes it testable in process and fuzzable.
//
// Every request is checked completely before anything changes: a malformed header, an
// unknown table, a key this server does not hold, a payload of the wrong length, or a
// NaN/Inf gradient gets an error reply and leaves the model exactly as it was.
//
// Consistency (Ho et al. 2013): the server keeps every worker's clock (steps completed, from
// ClockTick messages). A pull from a worker at clock c of a table whose bound is S >= 0 is
// served once every live worker has completed clock c - S - 1, that is once the slowest
// live worker's clock is >= c - S; until then it is held (not refused, not polled), and
// answered with an error naming the worker it waits on if that takes longer than
// --staleness_wait_seconds. A worker that leaves drops out of the clock table. Pushes,
// clock ticks and pulls of one worker arrive in order on its connection, so a tick means
// that worker's pushes before it are applied.
//
// Staleness of a gradient: each table shard has a version, the number of pushes applied to
// it here; a pull reply carries it, the push computed from that pull carries it back, and
// the difference is the gradient's staleness (exactly the row's version difference for
// dense tables, where every push covers the shard; an upper bound for sparse tables).
//
// Failures (server/coordinator.h): the coordinator evicts a worker it declared dead; the
// worker leaves the clock table and its later requests are refused, so a worker that was
// only stopped (SIGSTOP) cannot change the model after its work went to others. Workers
// that join a running job get ids past num_workers and enter the clock table with their
// first (rejoin) tick, at the slowest live clock. A push whose request id this server
// already applied (a client's retry, server/recent_requests.h) is answered again with the
// first reply and not applied twice.
//
// Thread model: not thread-safe; the server's request loop owns it. With
// StoreOptions::server_threads > 1 it owns a pool of apply threads (server/apply_pool.h)
// that only ever run inside one Handle call: the request thread still does everything else
// (parsing, every check, clocks, versions, stats, held pulls, replication, checkpoints) and
// hands out just the per-row work of a push that passed its checks (Optimizer::Apply) and
// of a pull (the copy into the reply), then waits for all of it before it goes on
// (fork-join), so replies, versions and the all-or-nothing checks read as with one thread.
// Each row belongs to one thread, so no lock guards rows: a dense row r (counted from the
// start of this server's slice of R rows) to block r * N / R, a sparse key to
// SparseKeyPart(key, N); repeated keys in one push thus stay in order on one thread.
// Sparse rows are fetched from their RowStore (not thread-safe, with its LRU cache and
// spill tier) on the request thread, a batch at a time; only the apply/copy of the fetched
// rows runs on the pool, and the next Fetch waits until it is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/job_config.h"
#include "common/lr_policy.h"
#include "common/optimizer.h"
#include "common/shard_map.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "common/wire_dtype.h"
#include "server/apply_pool.h"
#include "server/recent_requests.h"
#include "server/softsync.h"
#include "server/table.h"

namespace ps {

class CheckpointReader;  // server/checkpoint.h

struct ServerStats {
  uint64_t pushes_applied = 0;
  uint64_t pushes_rejected = 0;  // bad pushes answered with an error
  uint64_t pushes_dropped = 0;   // too stale (--max_grad_staleness), not applied
  uint64_t pulls_served = 0;
  uint64_t pulls_held = 0;    // pulls the staleness bound made wait
  uint64_t bad_requests = 0;  // every request answered with an error
  uint64_t bytes_pushed = 0;  // gradient payload bytes applied
  uint64_t bytes_pulled = 0;  // value payload bytes sent
  uint64_t rows_held = 0;
  int64_t max_clock_lag = 0;  // largest (puller's clock - slowest live clock) served
  // The spill tier, summed over sparse tables (server/row_store.h).
  uint64_t rows_in_memory = 0;
  uint64_t rows_spilled = 0;
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;  // rows read back from the spill tier
  uint64_t spill_bytes_read = 0;
  uint64_t spill_bytes_written = 0;
  uint64_t peak_rss_bytes = 0;  // the process's (VmHWM), 0 where unknown
  uint64_t checkpoints_written = 0;
  int64_t restored_clock = -1;    // the checkpoint this server started from, -1: none
  uint64_t pushes_duplicate = 0;  // retried pushes answered again, not applied twice
  uint64_t workers_evicted = 0;
  // Applied pushes by staleness; the last bucket counts everything at or above its index.
  std::vector<uint64_t> staleness_histogram;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
};

// A reply and who it goes to.
// Bounds on one push or pull, checked before a row is touched or a reply allocated (the
// transport already bounds frame sizes and counts).
struct RequestLimits {
  // Rows one request may address (range or key list).
  uint64_t max_rows = uint64_t{1} << 22;
  // Bytes of values one push may carry or one pull may return (rows x width x 4).
  uint64_t max_value_bytes = uint64_t{256} << 20;
};

struct Outgoing {
  std::string peer;
  Frames frames;
};

// Where a server keeps its rows. Local settings of one server, not of the job.
struct StoreOptions {
  // Bytes this server's rows (values and optimizer state, dense and sparse) may take in
  // memory: dense tables stay resident, the rest is split evenly among sparse tables,
  // whose colder rows spill to disk. -1: the job's --memory_budget; 0: no limit.
  int64_t memory_budget = -1;
  // The parent directory of the spill tier (one directory per sparse table); empty: fresh
  // directories under the system's temp directory.
  std::string spill_dir;
  // What holds the spilled rows (server/row_store.h).
  SpillEngine spill_engine = SpillEngine::kRocksDB;
  // Threads that apply pushes and gather pulls, the request thread included
  // (--server_threads; see the thread model above). 1, the default: everything on the
  // request thread, as before threads existed. 0: one per core this process may use
  // (sched_getaffinity), at most kMaxAutoServerThreads; -1: a quarter of those
  // (SharedServerThreads, ps_server's default; server/apply_pool.h).
  int server_threads = 1;
  // A request (or a batch of fetched sparse rows) with fewer bytes of row values than this
  // is done inline on the request thread: waking the pool costs more than it saves.
  uint64_t parallel_min_bytes = uint64_t{64} << 10;
};

// The process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 where unknown.
uint64_t PeakRssBytes();

class ServerCore {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kStalenessBuckets = 1024;
  // Requests with clocks past 2^40 steps are corrupt and refused (gradients: see
  // common/gradient_check.h).
  static constexpr int64_t kMaxClock = int64_t{1} << 40;
  // Worker ids past num_workers belong to workers that joined a running job.
  static constexpr int kMaxWorkers = 1 << 16;

  static Result<std::unique_ptr<ServerCore>> Create(const JobConfig& config, int server_id,
                                                    const StoreOptions& store = {});

  // What the request loop should do after sending the replies.
  enum class After { kContinue, kShutdown };

  // Handles one request from `peer`, appending the replies to send to *out: usually one
  // to `peer`; none when a pull is held; several when a clock tick releases held pulls.
  // Never throws.
  void Handle(const std::string& peer, Frames& request, std::vector<Outgoing>* out, After* after);

  // Fails held pulls whose wait passed --staleness_wait_seconds (as of `now`).
  void ExpireHeldPulls(Clock::time_point now, std::vector<Outgoing>* out);

  // Convenience for tests: handles a request and returns the one reply to it.
  // REQUIRES: the request is not a pull that gets held.
  Frames HandleOne(Frames& request, After* after = nullptr);

  ServerStats stats() const;
  // A held pull as `ps_status` shows it: whose pull, the slowest live worker it waits on
  // (-1 when none is live), and for how long so far.
  struct HeldPullInfo {
    int worker = -1;
    int waits_on = -1;
    double seconds = 0;
  };
  std::vector<HeldPullInfo> HeldPulls(Clock::time_point now) const;
  // Tables of which this server holds at least one row (its shards).
  size_t shards_held() const;
  void set_limits(const RequestLimits& limits) { limits_ = limits; }
  int server_id() const { return server_id_; }
  // Pushes applied to this server's shard of table `table` (0 for an unknown table).
  uint64_t shard_version(uint32_t table) const {
    return table < shard_version_.size() ? shard_version_[table] : 0;
  }
  size_t held_pulls() const { return held_.size(); }
  int64_t worker_clock(int worker) const { return clocks_.at(static_cast<size_t>(worker)); }
  // The batches the job has trained (each clock a worker ticked, times the batches it
  // covers): the job's progress, for the lr schedule. A rejoining worker's jump to the
  // slowest clock adds nothing. Restored from a checkpoint, it starts where the checkpoint's
  // job was (from the sum of its clocks for a file of format 1, which kept no count).
  int64_t JobSteps() const { return job_batches_; }
  const ShardMap& shard_map() const { return shard_map_; }
  // Writes this server's rows (values only) to a safetensors file (server/export.h):
  // dense tables as "<name>" [rows held, width], sparse ones as "<name>.ids" and
  // "<name>.values". Spilled rows are read from the spill tier; the file's data passes through
  // memory once, so an export may exceed the memory budget.
  Status ExportSafetensors(const std::string& path);
  // Writes this server's shard at `clock` (server/checkpoint.h) under --checkpoint_dir
  // (or `dir`).
  Status WriteCheckpoint(int64_t clock) { return WriteCheckpointTo(config_.checkpoint_dir, clock); }
  Status WriteCheckpointTo(const std::string& dir, int64_t clock);
  // Loads this server's file of a checkpoint set (a clock-C directory).
  Status RestoreCheckpoint(const std::string& set_dir);
  // The slowest live worker's clock, or the last known one when none is live.
  int64_t CheckpointClock() const;
  // Writes a checkpoint when the slowest live clock reaches `clock` exactly (the coordinator
  // names it, so that every server's file of the set stands at one clock). False, with
  // nothing asked, when this server is already past it; a clock at or before the last
  // checkpoint, or already asked for, is ignored (true).
  bool RequestCheckpointAt(int64_t clock);
  int64_t checkpoint_requested() const { return checkpoint_requested_; }
  // Pushes applied since the latest checkpoint this server wrote or restored (what a
  // restart from that checkpoint would roll back).
  uint64_t pushes_since_checkpoint() const { return stats_.pushes_applied - pushes_at_checkpoint_; }
  // This server replaces a dead one of a running job (--replicas=1, server/coordinator.h),
  // after RestoreCheckpoint (or from the initial values). The restored clock table is a
  // lower bound of the workers' clocks: each live worker's tick on being redirected brings
  // it to its current clock, so pulls wait for that rather than being served early.
  // `evicted` workers were declared dead (refused from now on); `idle` ones finished
  // training (out of the clock table). Checkpoints by --checkpoint_every=N clocks stay at
  // the clocks the other servers write (the restored clock plus multiples of N) although
  // this table jumps from the restored clock to the workers' clocks.
  void BecomeReplacement(const std::vector<int>& evicted, const std::vector<int>& idle,
                         double restore_seconds);
  bool replacement() const { return replacement_; }
  double restore_seconds() const { return restore_seconds_; }
  int64_t last_checkpoint_clock() const { return last_checkpoint_clock_; }
  bool evicted(int worker) const {
    return worker >= 0 && static_cast<size_t>(worker) < evicted_.size() &&
           evicted_[static_cast<size_t>(worker)];
  }
  // Replica snapshots (server/replication.h): everything that decides how this core answers
  // and applies the requests to come, as bytes: the rows with their optimizer state
  // (spilled rows included), the clock table, the shard versions, the job's progress for
  // the lr schedule, the exactly-once table, the evicted workers. Pending --softsync sums
  // are applied first, short of c pushes or not (a smaller update here too). Held pulls are not in
  // it: their senders resend them to wherever the copy is served. Counters (stats) stay with each
  // process.
  Status SaveReplica(std::string* out);
  // Takes on the state of a snapshot. REQUIRES of the caller: this core is fresh (it has
  // applied nothing). A snapshot of another server or of another job's shape, or a
  // truncated one, is refused (InvalidArgument); a core that refused one may hold part of
  // it and is to be discarded.
  Status LoadReplica(std::string_view snapshot);
  // Forgets the held pulls without answering them (their shards are served elsewhere from
  // now on, and the workers resend them there); returns how many.
  size_t DropHeldPulls();

  // For tests: the stored values of one row (width floats), or NotFound.
  Result<std::vector<float>> ReadRow(uint32_t table, uint64_t key);

  // Where the values frame of a pull reply to `peer` comes from (default: an ordinary
  // frame). The server loop points it at its socket, so that a reply is built in the peer's
  // shared-memory ring and sent without a copy (ServerSocket::NewFrame).
  using FrameAllocator = std::function<zmq::message_t(const std::string& peer, size_t bytes)>;
  void set_frame_allocator(FrameAllocator a) { frame_allocator_ = std::move(a); }

 private:
  ServerCore(const JobConfig& config, int server_id, std::unique_ptr<Optimizer> optimizer,
             LrPolicy lr_policy);
  Status CreateTables(const StoreOptions& store);
  // The rows a push or pull addresses, validated against the table and the frames.
  struct Addressed {
    Table* table = nullptr;
    bool is_range = false;
    RowRange range;
    std::span<const uint64_t> keys;
    size_t rows = 0;
    size_t next_frame = 1;  // index of the first frame after the keys
  };
  struct HeldPull {
    std::string peer;
    Frames request;
    DecodedHeader header;
    int worker;
    int64_t clock;
    int64_t needed;  // the slowest live clock must reach this
    Clock::time_point since;
  };

  // Calls fn(i, row) for each addressed row i in order, fetching sparse rows from the store
  // in batches it can hold at once.
  template <typename Fn>
  Status ForEachRow(const Addressed& a, bool for_write, Fn fn);
  // ForEachRow with the rows split among the apply threads (each row on its own thread, see
  // the thread model above), not in order across threads; returns once every call returned.
  // Falls back to ForEachRow with one thread or below parallel_min_bytes. REQUIRES: fn may
  // run concurrently for different rows, and is called once per (i, row).
  template <typename Fn>
  Status ParallelForEachRow(const Addressed& a, bool for_write, Fn fn);
  Result<Addressed> Address(uint32_t table_id, wire::Keys::Reader keys, const Frames& request);
  // A push from a worker: refused from an evicted one; a retry of one applied already is
  // answered again with the first reply (RecentRequests), not applied twice.
  Result<Frames> HandlePushOnce(wire::Header::Reader h, const Frames& request);
  // Checks a push in full, then applies it (ApplyPush).
  Result<Frames> HandlePush(wire::Header::Reader h, const Frames& request);
  // A push that passed every check of HandlePush.
  struct CheckedPush {
    const Addressed& rows;
    std::span<const float> grads;  // rows x width, widened to fp32
    uint64_t staleness = 0;        // shard versions behind
    size_t wire_bytes = 0;         // the values frame as it travelled
  };
  // Applies `checked` (or drops it as too stale, --max_grad_staleness) and builds the reply.
  Result<Frames> ApplyPush(wire::Header::Reader h, const CheckedPush& checked);
  // Answers a pull now, or holds it (returns an empty Frames) while the bound blocks it.
  Result<Frames> HandlePull(const std::string& peer, DecodedHeader& decoded, Frames& request);
  Result<Frames> ServePull(const std::string& peer, wire::Header::Reader h, const Frames& request,
                           std::chrono::microseconds held);
  Result<Frames> HandleClock(wire::Header::Reader h, std::vector<Outgoing>* out);
  Result<Frames> HandleEvict(wire::Header::Reader h, std::vector<Outgoing>* out);
  // InvalidArgument unless `worker` is a worker id; FailedPrecondition when it was evicted.
  // Grows the clock table for workers that joined (they start out of it).
  Status CheckWorker(int worker, const char* what);
  // RestoreCheckpoint's clock table and schedule progress, from r (positioned after the
  // header) of the set at `clock`.
  Status RestoreClockTable(CheckpointReader& r, const std::string& path, int64_t clock);
  Frames ShutdownReply(uint64_t request_id);
  Frames HeartbeatReply(uint64_t request_id);
  static Status CheckClock(int64_t clock, const char* what);
  // The slowest live worker's clock (INT64_MAX when none is live) and who it is.
  int64_t MinLiveClock(int* slowest = nullptr) const;
  // Batches one clock of `worker` covers (1 for a sender the clock table does not know).
  uint32_t BatchesPerClock(int worker) const {
    return worker >= 0 && static_cast<size_t>(worker) < batches_per_clock_.size()
               ? batches_per_clock_[static_cast<size_t>(worker)]
               : 1u;
  }
  void ReleaseHeldPulls(std::vector<Outgoing>* out);
  // --softsync (server/softsync.h): applies table t's sum of pushes when it is due.
  Status ApplySoftSyncIfDue(uint32_t table_id, int64_t min_live_clock);
  // Every table's, after a change of the clock table. `asynchronous_now`: also every ASP
  // table's sum whatever it holds (before a checkpoint, which must hold every acknowledged
  // push; under SSP and BSP the clock rule already applied the pushes below its clock).
  void ApplyDueSoftSyncs(bool asynchronous_now = false);
  void RecordStaleness(uint32_t table_id, uint64_t staleness);
  // Reads the tables section a checkpoint and a replica snapshot share (the table count;
  // per table its id, version, stride and row count, then each row's key and stride floats)
  // into the tables and their versions. `read` fills bytes from the source; `bytes_left`
  // (SIZE_MAX: unknown) bounds a row count before it is trusted; `source` names the source
  // in errors.
  Status ReadTables(const std::function<Status(void*, size_t)>& read, size_t bytes_left,
                    const std::string& source);
  // --pull_lookahead: the updates a pull of table t looks ahead (0: serve the stored values).
  double LookaheadUpdates(uint32_t table_id) const;

  JobConfig config_;
  int server_id_;
  ShardMap shard_map_;
  std::unique_ptr<Optimizer> optimizer_;
  LrPolicy lr_policy_;
  std::vector<Table> tables_;
  std::vector<int> table_staleness_;  // bound per table id
  // Per table id: a moving average of its pushes' staleness (--pull_lookahead's measure).
  std::vector<double> recent_staleness_;
  std::vector<uint64_t> shard_version_;  // per table id
  std::vector<int64_t> clocks_;          // per worker
  // Per worker: batches one of its clocks covers (its ticks say; a group leader's is the
  // group's size). job_batches_ adds up the clocks ticked, each times its worker's batches.
  std::vector<uint32_t> batches_per_clock_;
  int64_t job_batches_ = 0;
  std::vector<bool> left_;     // per worker
  std::vector<bool> evicted_;  // per worker
  RecentRequests recent_pushes_;
  std::unique_ptr<SoftSync> softsync_;  // set by CreateTables; off unless --softsync > 1
  std::deque<HeldPull> held_;           // in arrival order
  ServerStats stats_;
  std::vector<float*> fetched_;      // scratch of ForEachRow
  std::unique_ptr<ApplyPool> pool_;  // null: one thread
  uint64_t parallel_min_bytes_ = 0;
  int64_t last_checkpoint_clock_ = 0;
  int64_t checkpoint_requested_ = -1;  // RequestCheckpointAt's clock, -1: none
  uint64_t pushes_at_checkpoint_ = 0;  // stats_.pushes_applied at the latest checkpoint
  bool replacement_ = false;           // BecomeReplacement was called
  int64_t checkpoint_base_ = 0;        // --checkpoint_every=N clocks fall on base + k N
  double restore_seconds_ = 0;
  RequestLimits limits_;
  FrameAllocator frame_allocator_;
};

}  // namespace ps
