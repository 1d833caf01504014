#include "common/shard_map.h"

#include <glog/logging.h>
#include <xxhash.h>

#include <algorithm>

namespace ps {

ShardMap::ShardMap(std::vector<TableSpec> tables, int num_servers)
    : tables_(std::move(tables)), num_servers_(num_servers) {
  CHECK_GT(num_servers_, 0);
}

uint64_t HashKey(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t words[2] = {a, b};
  return XXH3_64bits_withSeed(words, sizeof(words), seed);
}

RowRange ShardMap::DenseRangeOf(uint32_t table, int server) const {
  CHECK_LT(table, tables_.size());
  const TableSpec& t = tables_[table];
  CHECK(t.dense());
  // Server s holds slice i = (s - t) mod S.
  uint64_t S = static_cast<uint64_t>(num_servers_);
  uint64_t i = (static_cast<uint64_t>(server) + S - table % S) % S;
  return RowRange{t.rows * i / S, t.rows * (i + 1) / S};
}

int ShardMap::ServerOf(uint32_t table, uint64_t key) const {
  CHECK_LT(table, tables_.size());
  const TableSpec& t = tables_[table];
  uint64_t S = static_cast<uint64_t>(num_servers_);
  if (t.dense()) {
    CHECK_LT(key, t.rows);
    // The slice i with rows*i/S <= key < rows*(i+1)/S.
    uint64_t i = static_cast<uint64_t>((static_cast<unsigned __int128>(key) * S + S - 1) / t.rows);
    while (i > 0 && t.rows * i / S > key) --i;
    while (t.rows * (i + 1) / S <= key) ++i;
    return static_cast<int>((i + table) % S);
  }
  return static_cast<int>(HashKey(0x5eed, table, key) % S);
}

std::vector<RangeSlice> ShardMap::SplitRange(uint32_t table, RowRange rows) const {
  std::vector<RangeSlice> out;
  for (int s = 0; s < num_servers_; ++s) {
    RowRange held = DenseRangeOf(table, s);
    RowRange part{std::max(held.begin, rows.begin), std::min(held.end, rows.end)};
    if (!part.empty()) out.push_back(RangeSlice{s, part});
  }
  return out;
}

std::vector<KeySlice> ShardMap::SplitKeys(uint32_t table, std::span<const uint64_t> keys) const {
  std::vector<KeySlice> per_server(static_cast<size_t>(num_servers_));
  for (uint32_t i = 0; i < keys.size(); ++i) {
    per_server[static_cast<size_t>(ServerOf(table, keys[i]))].positions.push_back(i);
  }
  std::vector<KeySlice> out;
  for (int s = 0; s < num_servers_; ++s) {
    if (per_server[s].positions.empty()) continue;
    per_server[s].server = s;
    out.push_back(std::move(per_server[s]));
  }
  return out;
}

}  // namespace ps
