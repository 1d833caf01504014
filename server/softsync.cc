#include "server/softsync.h"

#include <glog/logging.h>

#include <algorithm>
#include <climits>

namespace ps {

SoftSync::SoftSync(int batches_per_update, const std::vector<RowRange>& held,
                   const std::vector<uint32_t>& width, const std::vector<bool>& dense,
                   const std::vector<int>& staleness)
    : per_update_(batches_per_update), sums_(held.size()) {
  CHECK_EQ(held.size(), width.size());
  CHECK_EQ(held.size(), dense.size());
  CHECK(staleness.empty() || staleness.size() == held.size());
  if (!enabled()) return;
  for (size_t t = 0; t < held.size(); ++t) {
    if (!dense[t] || held[t].size() == 0) continue;
    TableSum& s = sums_[t];
    s.on = true;
    s.clock_rule = staleness.empty() || staleness[t] >= 0;
    s.held = held[t];
    s.width = width[t];
    s.sum.assign(held[t].size() * width[t], 0.0f);
    s.counts.assign(held[t].size(), 0);
  }
}

namespace {

std::vector<RowRange> HeldRanges(const std::vector<TableSpec>& tables, const ShardMap& shards,
                                 int server_id) {
  std::vector<RowRange> held;
  for (const TableSpec& t : tables) {
    held.push_back(t.dense() ? shards.DenseRangeOf(t.id, server_id) : RowRange{});
  }
  return held;
}

template <typename T, typename Fn>
std::vector<T> Each(const std::vector<TableSpec>& tables, Fn fn) {
  std::vector<T> out;
  for (const TableSpec& t : tables) out.push_back(fn(t));
  return out;
}

}  // namespace

SoftSync::SoftSync(int batches_per_update, const std::vector<TableSpec>& tables,
                   const ShardMap& shards, int server_id, const std::vector<int>& staleness)
    : SoftSync(batches_per_update, HeldRanges(tables, shards, server_id),
               Each<uint32_t>(tables, [](const TableSpec& t) { return t.width; }),
               Each<bool>(tables, [](const TableSpec& t) { return t.dense(); }), staleness) {}

void SoftSync::Add(uint32_t table, RowRange range, std::span<const float> grads, int64_t clock,
                   bool last_chunk, uint32_t batches, float weight) {
  TableSum& s = sums_[table];
  CHECK(s.on);
  CHECK(range.begin >= s.held.begin && range.end <= s.held.end);
  CHECK_EQ(grads.size(), range.size() * s.width);
  CHECK_GE(batches, 1u);
  const size_t first = range.begin - s.held.begin;
  float* dst = s.sum.data() + first * s.width;
  if (weight == 1.0f) {
    for (size_t i = 0; i < grads.size(); ++i) dst[i] += grads[i];
  } else {
    for (size_t i = 0; i < grads.size(); ++i) dst[i] += weight * grads[i];
  }
  for (size_t r = 0; r < range.size(); ++r) s.counts[first + r] += batches;
  ++s.contributions;
  s.oldest_clock = std::min(s.oldest_clock, clock);
  if (last_chunk) {
    s.batches += batches;
  }
}

bool SoftSync::Due(uint32_t table, int64_t min_live_clock) const {
  const TableSum& s = sums_[table];
  if (!s.on || s.contributions == 0) return false;
  return s.batches >= static_cast<uint64_t>(per_update_) || min_live_clock == INT64_MAX ||
         (s.clock_rule && s.oldest_clock < min_live_clock);
}

SoftSync::Pending SoftSync::TakeMean(uint32_t table) {
  TableSum& s = sums_[table];
  CHECK(s.on && s.contributions > 0);
  // Divided by c, not by the batches in it: a sum applied early (the clock rule) with fewer
  // is a proportionally smaller step, as its share of one global batch.
  for (size_t r = 0; r < s.counts.size(); ++r) {
    const uint32_t divisor = std::max<uint32_t>(s.counts[r], static_cast<uint32_t>(per_update_));
    if (s.counts[r] == 0 || divisor <= 1) continue;
    const float scale = 1.0f / static_cast<float>(divisor);
    float* row = s.sum.data() + r * s.width;
    for (uint32_t k = 0; k < s.width; ++k) row[k] *= scale;
  }
  Pending p;
  p.held = s.held;
  p.mean = s.sum;
  p.counts = s.counts;
  p.batches = s.batches;
  return p;
}

void SoftSync::Clear(uint32_t table) {
  TableSum& s = sums_[table];
  std::fill(s.sum.begin(), s.sum.end(), 0.0f);
  std::fill(s.counts.begin(), s.counts.end(), 0u);
  s.contributions = 0;
  s.batches = 0;
  s.oldest_clock = INT64_MAX;
}

}  // namespace ps
