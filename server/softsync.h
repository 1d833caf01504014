// n-softsync (Gupta et al., "Model Accuracy and Runtime Tradeoff in Distributed Deep
// Learning", 2016): a server sums the gradients of `--softsync=c` pushes to a dense table
// and applies their mean as one update, instead of applying each push at the full rate.
// c counts batches: an all-reduce group's leader pushes its G members' batch gradients
// summed, so its push counts G (the batches its clock ticks say it covers).
// With c = the number of workers, every update is one "global batch" of all workers and a
// gradient is at most about one update stale, whatever the staleness bound lets the
// workers' clocks drift; c = 1 is plain asynchronous SGD.
//
// When the sum is applied (SoftSync::Due): once it holds c batches, and whenever the
// slowest live worker's clock passes the clock of a push in it. The second rule keeps the
// consistency model: a pull at clock t is served once the slowest clock reaches t - S, and
// must then see every push from clocks below that, so those pushes cannot wait in the sum.
// Under ASP no pull waits, so an ASP table (bound < 0) has no second rule: its sum waits for
// c batches (or for no worker to be live), and ServerCore applies it before a checkpoint.
// Both rules read only pushes and clock-table changes (ticks, leaves, evictions), which
// replication forwards in order, so a backup's shadow applies the same sums at the same
// points. A checkpoint at clock C holds what was applied: pushes of clocks below C always
// are (second rule; under ASP, everything is applied first); later ones wait in the sum,
// as they belong after C.
//
// Versions and staleness: a table's version counts updates (sums applied), so a gradient's
// staleness is in updates. The lr of a sum is the schedule's at the job's steps so far
// (ServerCore::JobSteps); under --staleness_lr each push joins the sum weighted by its own
// staleness (LrPolicy::StalenessWeight), so a sum's fresh gradients count for more than its
// stale ones. Sparse tables are not summed: their pushes touch different rows and are applied as
// they come.
//
// Thread model: owned by one ServerCore, used on its request thread; Rows() may be read by
// its apply threads inside a fork-join while nothing is added.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"

namespace ps {

class SoftSync {
 public:
  // `batches_per_update` is c (<= 1: off). `held[t]` is this server's row range of table t
  // and `width[t]` its row width; ranges of sparse tables are ignored (`dense[t]` false).
  // `staleness[t]` is table t's staleness bound (-1: ASP, no clock rule); empty: all SSP.
  SoftSync(int batches_per_update, const std::vector<RowRange>& held,
           const std::vector<uint32_t>& width, const std::vector<bool>& dense,
           const std::vector<int>& staleness = {});
  // The same for the dense tables of `tables` as server `server_id` of `shards` holds them.
  SoftSync(int batches_per_update, const std::vector<TableSpec>& tables, const ShardMap& shards,
           int server_id, const std::vector<int>& staleness);

  bool enabled() const { return per_update_ > 1; }
  // Whether table t's pushes are summed here.
  bool sums(uint32_t table) const { return enabled() && table < sums_.size() && sums_[table].on; }
  // Whether table t's sum is applied when the slowest live clock passes a push in it (SSP and
  // BSP tables; not ASP ones).
  bool clock_rule(uint32_t table) const { return sums_[table].clock_rule; }

  // Adds one push's (or one chunk's) gradient, a sum of `batches` batch gradients, for rows
  // [range.begin, range.end) of table t, times `weight` (its --staleness_lr share; the
  // batches count whole towards c whatever the weight). `last_chunk`: the push is complete
  // (its batches count towards c). REQUIRES: sums(t), batches >= 1, and the range inside the
  // held range with grads.size() == range.size() * width.
  void Add(uint32_t table, RowRange range, std::span<const float> grads, int64_t clock,
           bool last_chunk, uint32_t batches = 1, float weight = 1.0f);

  // Whether table t's sum must be applied now: c batches of complete pushes, a push of a clock
  // below `min_live_clock` (the clock rule), or anything when `min_live_clock` is INT64_MAX (no
  // worker is live).
  bool Due(uint32_t table, int64_t min_live_clock) const;
  size_t tables() const { return sums_.size(); }

  // The sum to apply, divided in place by c (or by a row's contributions when more): a sum
  // of c pushes is their mean, one applied early is that share of it. `counts[i]` is 0 for
  // rows to leave alone.
  struct Pending {
    RowRange held;
    std::span<float> mean;             // held.size() x width, meaningful where count > 0
    std::span<const uint32_t> counts;  // per held row
    uint64_t batches = 0;              // batches of complete pushes in it
  };
  // Turns table t's sum into means and returns it; call Clear(t) once it was applied.
  // REQUIRES: sums(t) and something was added.
  Pending TakeMean(uint32_t table);
  void Clear(uint32_t table);
  bool empty(uint32_t table) const { return sums_[table].contributions == 0; }

 private:
  struct TableSum {
    bool on = false;
    bool clock_rule = true;
    RowRange held;
    uint32_t width = 0;
    std::vector<float> sum;        // held rows x width
    std::vector<uint32_t> counts;  // batches added per held row
    uint64_t contributions = 0;    // chunks added
    uint64_t batches = 0;          // batches of complete pushes added
    int64_t oldest_clock = INT64_MAX;
  };
  int per_update_;
  std::vector<TableSum> sums_;
};

}  // namespace ps
