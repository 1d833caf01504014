#include "common/row_init.h"

#include <glog/logging.h>

#include <algorithm>
#include <random>

#include "common/shard_map.h"

namespace ps {

void InitializeRow(const TableSpec& table, uint64_t seed, uint64_t key, std::span<float> out) {
  InitKind init = table.init_scale > 0 ? table.init : InitKind::kZeros;
  switch (init) {
    case InitKind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case InitKind::kUniform: {
      std::mt19937_64 rng(HashKey(seed, table.id, key));
      std::uniform_real_distribution<float> d(-table.init_scale, table.init_scale);
      for (float& x : out) x = d(rng);
      return;
    }
    case InitKind::kNormal: {
      std::mt19937_64 rng(HashKey(seed, table.id, key));
      std::normal_distribution<float> d(0.0f, table.init_scale);
      for (float& x : out) x = d(rng);
      return;
    }
  }
}

void InitializeRows(const TableSpec& table, uint64_t seed, uint64_t first_key, size_t stride,
                    std::span<float> out) {
  CHECK_GE(stride, table.width);
  CHECK_EQ(out.size() % stride, 0u);
  for (size_t i = 0; i < out.size() / stride; ++i) {
    std::span<float> row = out.subspan(i * stride, stride);
    InitializeRow(table, seed, first_key + i, row.first(table.width));
    std::fill(row.begin() + table.width, row.end(), 0.0f);
  }
}

}  // namespace ps
