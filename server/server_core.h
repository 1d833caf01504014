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
// Thread model: not thread-safe; the server's request loop owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/lr_policy.h"
#include "server/optimizer.h"
#include "server/table.h"

namespace ps {

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

class ServerCore {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kStalenessBuckets = 1024;
  // Requests outside these bounds are refused: clocks past 2^40 steps are corrupt, and a
  // gradient beyond 1e18 would overflow optimizer state or weights to infinity.
  static constexpr int64_t kMaxClock = int64_t{1} << 40;
  static constexpr float kMaxAbsGradient = 1e18f;

  static Result<std::unique_ptr<ServerCore>> Create(const JobConfig& config, int server_id);

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
  void set_limits(const RequestLimits& limits) { limits_ = limits; }
  int server_id() const { return server_id_; }
  size_t held_pulls() const { return held_.size(); }
  int64_t worker_clock(int worker) const { return clocks_.at(static_cast<size_t>(worker)); }
  const ShardMap& shard_map() const { return shard_map_; }
  // For tests: the stored values of one row (width floats), or NotFound.
  Result<std::vector<float>> ReadRow(uint32_t table, uint64_t key);

 private:
  ServerCore(const JobConfig& config, int server_id, std::unique_ptr<Optimizer> optimizer,
             LrPolicy lr_policy);
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

  Result<Addressed> Address(uint32_t table_id, wire::Keys::Reader keys, const Frames& request);
  Result<Frames> HandlePush(wire::Header::Reader h, const Frames& request);
  // Answers a pull now, or holds it (returns an empty Frames) while the bound blocks it.
  Result<Frames> HandlePull(const std::string& peer, DecodedHeader& decoded, Frames& request);
  Result<Frames> ServePull(wire::Header::Reader h, const Frames& request,
                           std::chrono::microseconds held);
  Result<Frames> HandleClock(wire::Header::Reader h, std::vector<Outgoing>* out);
  Frames ShutdownReply(uint64_t request_id);
  static Status CheckClock(int64_t clock, const char* what);
  // The slowest live worker's clock (INT64_MAX when none is live) and who it is.
  int64_t MinLiveClock(int* slowest = nullptr) const;
  void ReleaseHeldPulls(std::vector<Outgoing>* out);
  void RecordStaleness(uint64_t staleness);

  JobConfig config_;
  int server_id_;
  ShardMap shard_map_;
  std::unique_ptr<Optimizer> optimizer_;
  LrPolicy lr_policy_;
  std::vector<Table> tables_;
  std::vector<int> table_staleness_;     // bound per table id
  std::vector<uint64_t> shard_version_;  // per table id
  std::vector<int64_t> clocks_;          // per worker
  std::vector<bool> left_;               // per worker
  std::deque<HeldPull> held_;            // in arrival order
  ServerStats stats_;
  RequestLimits limits_;
};

}  // namespace ps
