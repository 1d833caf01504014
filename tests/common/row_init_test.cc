// A row's starting value: its values depend only on (seed, table, key), and a block of rows
// with optimizer state holds exactly InitializeRow's values followed by zeros.
#include "common/row_init.h"

#include <gtest/gtest.h>

#include <span>
#include <vector>

namespace ps {
namespace {

TableSpec Normal(uint32_t id, uint32_t width) {
  TableSpec t;
  t.id = id;
  t.name = "w" + std::to_string(id);
  t.rows = 100;
  t.width = width;
  t.init = InitKind::kNormal;
  t.init_scale = 0.1f;
  return t;
}

TEST(RowInitTest, ValuesAreAFunctionOfSeedTableAndKey) {
  std::vector<float> a(6), b(6), c(6), d(6), e(6);
  InitializeRow(Normal(0, 6), 1, 17, a);
  InitializeRow(Normal(0, 6), 1, 17, b);
  InitializeRow(Normal(0, 6), 2, 17, c);
  InitializeRow(Normal(1, 6), 1, 17, d);
  InitializeRow(Normal(0, 6), 1, 18, e);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_NE(a, e);
  TableSpec zeros = Normal(0, 6);
  zeros.init_scale = 0;  // any initializer with scale 0 is zeros
  InitializeRow(zeros, 1, 17, a);
  for (float x : a) EXPECT_EQ(x, 0.0f);
}

TEST(RowInitTest, RowsHoldValuesThenZeroState) {
  const TableSpec t = Normal(3, 5);
  const size_t stride = 5 + 11;  // e.g. adam: 2 * width + 1 floats of state
  const uint64_t first = 40;
  std::vector<float> block(4 * stride, 7.0f);  // stale contents must be overwritten
  InitializeRows(t, 9, first, stride, block);
  for (uint64_t i = 0; i < 4; ++i) {
    std::vector<float> want(5);
    InitializeRow(t, 9, first + i, want);
    std::span<const float> row(block.data() + i * stride, stride);
    EXPECT_EQ(std::vector<float>(row.begin(), row.begin() + 5), want) << "row " << first + i;
    for (size_t j = 5; j < stride; ++j) EXPECT_EQ(row[j], 0.0f) << "row " << i << " float " << j;
  }
}

}  // namespace
}  // namespace ps
