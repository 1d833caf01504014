// The rows one server holds of one table. A row is `width` values followed by the
// optimizer's state for them (`state_floats` floats: see Optimizer::StateFloats). Dense tables hold
// a contiguous block of their server's row range; sparse tables create a row on first touch with
// the table's initializer, and keep them in a RowStore: in memory, or past a memory budget
// partly in RocksDB (server/row_store.h).
//
// Thread model: not thread-safe; owned by the server's request loop.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "common/status.h"
#include "server/row_store.h"

namespace ps {

class Table {
 public:
  // `held` is the server's row range for a dense table (ignored for sparse ones); `store`
  // says where a sparse table's rows live (ignored for dense ones, always in memory).
  static Result<Table> Create(const TableSpec& spec, RowRange held, uint64_t seed,
                              size_t state_floats, const RowStoreOptions& store = {});

  const TableSpec& spec() const { return spec_; }
  size_t width() const { return spec_.width; }
  // Floats per stored row (values + state).
  size_t stride() const { return stride_; }
  uint64_t rows_held() const;

  // OK when every key may be served here: dense keys inside the held range. Sparse keys
  // are always fine (placement is the client's business; a misrouted key just lives here).
  Status CheckKeys(std::span<const uint64_t> keys) const;
  Status CheckRange(RowRange rows) const;

  // A dense row's storage (stride() floats).
  // REQUIRES: dense, and the key passed CheckKeys / CheckRange.
  float* DenseRow(uint64_t key) { return dense_.data() + (key - held_.begin) * stride_; }

  // The storage of each key's row (stride() floats each), valid until the next Fetch;
  // sparse rows are created on first touch and brought in from the spill tier. With
  // `for_write` the rows will be changed. REQUIRES: keys.size() <= max_fetch(), and the
  // keys passed CheckKeys.
  Status Fetch(std::span<const uint64_t> keys, bool for_write, std::vector<float*>* rows);
  size_t max_fetch() const { return sparse_ ? sparse_->capacity() : SIZE_MAX; }

  // The sparse table's store (nullptr for dense tables).
  RowStore* sparse_store() { return sparse_.get(); }
  const RowStore* sparse_store() const { return sparse_.get(); }

 private:
  Table(const TableSpec& spec, RowRange held, uint64_t seed, size_t state_floats);

  TableSpec spec_;
  RowRange held_;
  uint64_t seed_;
  size_t stride_;
  std::vector<float> dense_;  // held_.size() rows
  std::unique_ptr<RowStore> sparse_;
};

}  // namespace ps
