// The rows one server holds of one table. A row is `width` values followed by the
// optimizer's state for them (`state_floats` floats: see Optimizer::StateFloats). Dense tables hold
// a contiguous block of their server's row range; sparse tables create a row on first touch with
// the table's initializer.
//
// Thread model: not thread-safe; owned by the server's request loop.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "common/status.h"

namespace ps {

class Table {
 public:
  // `held` is the server's row range for a dense table (ignored for sparse ones).
  Table(const TableSpec& spec, RowRange held, uint64_t seed, size_t state_floats);

  const TableSpec& spec() const { return spec_; }
  size_t width() const { return spec_.width; }
  // Floats per stored row (values + state).
  size_t stride() const { return stride_; }
  uint64_t rows_held() const;

  // OK when every key may be served here: dense keys inside the held range. Sparse keys
  // are always fine (placement is the client's business; a misrouted key just lives here).
  Status CheckKeys(std::span<const uint64_t> keys) const;
  Status CheckRange(RowRange rows) const;

  // The row's storage (stride() floats). Creates a sparse row on first touch.
  // REQUIRES: the key passed CheckKeys / CheckRange.
  float* Row(uint64_t key);

 private:
  TableSpec spec_;
  RowRange held_;
  uint64_t seed_;
  size_t stride_;
  std::vector<float> dense_;  // held_.size() rows

  // Sparse rows live in fixed-size blocks so that growth never moves a row.
  static constexpr size_t kRowsPerBlock = 4096;
  std::unordered_map<uint64_t, float*> sparse_index_;
  std::vector<std::unique_ptr<float[]>> blocks_;
  size_t rows_in_last_block_ = kRowsPerBlock;
};

}  // namespace ps
