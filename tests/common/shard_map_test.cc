#include "common/shard_map.h"

#include <gtest/gtest.h>

#include <set>

#include "common/row_init.h"

namespace ps {
namespace {

std::vector<TableSpec> Tables() {
  std::vector<TableSpec> t(4);
  t[0] = {0, "w", 1000, 8, InitKind::kNormal, 0.1f};
  t[1] = {1, "b", 1, 8, InitKind::kZeros, 0};
  t[2] = {2, "emb", 0, 4, InitKind::kUniform, 0.5f};
  t[3] = {3, "odd", 7, 3, InitKind::kZeros, 0};
  return t;
}

TEST(ShardMapTest, DenseRowsHaveExactlyOneServer) {
  for (int servers : {1, 2, 3, 5, 8}) {
    ShardMap map(Tables(), servers);
    for (uint32_t table : {0u, 1u, 3u}) {
      const uint64_t rows = map.tables()[table].rows;
      std::vector<int> owner(rows, -1);
      uint64_t covered = 0;
      for (int s = 0; s < servers; ++s) {
        RowRange r = map.DenseRangeOf(table, s);
        covered += r.size();
        for (uint64_t k = r.begin; k < r.end; ++k) {
          EXPECT_EQ(owner[k], -1) << "row " << k << " held twice";
          owner[k] = s;
        }
      }
      EXPECT_EQ(covered, rows);
      for (uint64_t k = 0; k < rows; ++k) {
        EXPECT_EQ(map.ServerOf(table, k), owner[k]) << "table " << table << " row " << k;
      }
    }
  }
}

TEST(ShardMapTest, SmallTablesSpreadOverServers) {
  // One-row tables should not all land on the same server.
  std::vector<TableSpec> t;
  for (uint32_t i = 0; i < 8; ++i)
    t.push_back({i, "b" + std::to_string(i), 1, 4, InitKind::kZeros, 0});
  ShardMap map(t, 4);
  std::set<int> used;
  for (uint32_t i = 0; i < 8; ++i) used.insert(map.ServerOf(i, 0));
  EXPECT_EQ(used.size(), 4u);
}

TEST(ShardMapTest, SplitRangeCoversTheRequestOnce) {
  ShardMap map(Tables(), 3);
  RowRange req{123, 877};
  uint64_t total = 0;
  uint64_t prev_end = 0;
  std::vector<RangeSlice> slices = map.SplitRange(0, req);
  std::sort(slices.begin(), slices.end(),
            [](const RangeSlice& a, const RangeSlice& b) { return a.rows.begin < b.rows.begin; });
  for (const RangeSlice& s : slices) {
    EXPECT_FALSE(s.rows.empty());
    if (total > 0) {
      EXPECT_EQ(s.rows.begin, prev_end);
    }
    for (uint64_t k : {s.rows.begin, s.rows.end - 1}) EXPECT_EQ(map.ServerOf(0, k), s.server);
    total += s.rows.size();
    prev_end = s.rows.end;
  }
  EXPECT_EQ(total, req.size());
  EXPECT_TRUE(map.SplitRange(0, RowRange{5, 5}).empty());
}

TEST(ShardMapTest, SplitKeysPartitionsPositions) {
  ShardMap map(Tables(), 4);
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 5000; ++i) keys.push_back(i * 2654435761ull ^ (i << 40));
  std::vector<int> seen(keys.size(), 0);
  std::vector<size_t> per_server(4, 0);
  for (const KeySlice& s : map.SplitKeys(2, keys)) {
    for (uint32_t p : s.positions) {
      ++seen[p];
      EXPECT_EQ(map.ServerOf(2, keys[p]), s.server);
    }
    per_server[static_cast<size_t>(s.server)] = s.positions.size();
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  // Hashing spreads keys: each of 4 servers gets 25% +- 5%.
  for (size_t n : per_server) {
    EXPECT_GT(n, 1000u);
    EXPECT_LT(n, 1500u);
  }
}

TEST(ShardMapTest, InitializationIsAFunctionOfSeedTableAndKey) {
  std::vector<TableSpec> t = Tables();
  std::vector<float> a(8), b(8), c(8);
  InitializeRow(t[0], 1, 17, a);
  InitializeRow(t[0], 1, 17, b);
  InitializeRow(t[0], 2, 17, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  InitializeRow(t[1], 1, 0, a);
  for (float x : a) EXPECT_EQ(x, 0.0f);
  std::vector<float> u(4);
  InitializeRow(t[2], 1, 1ull << 63, u);
  for (float x : u) {
    EXPECT_GE(x, -0.5f);
    EXPECT_LE(x, 0.5f);
  }
}

}  // namespace
}  // namespace ps
