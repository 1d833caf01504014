// Which server holds which row. Dense tables are cut into `num_servers` contiguous row
// ranges (as ps-lite's key ranges); slice i of table t goes to server (i + t) mod S, so
// that the many one-row bias tables do not all land on server 0. Sparse tables place a key
// by hashing (table, key) with xxHash, so any uint64 id spreads evenly.
//
// Thread safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/job_config.h"

namespace ps {

struct RowRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  uint64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// One server's part of a request over a key list: the positions (indices into the
// request's key list) whose keys that server holds.
struct KeySlice {
  int server = 0;
  std::vector<uint32_t> positions;
};

// One server's part of a request over a dense row range.
struct RangeSlice {
  int server = 0;
  RowRange rows;
};

class ShardMap {
 public:
  ShardMap(std::vector<TableSpec> tables, int num_servers);

  int num_servers() const { return num_servers_; }
  const std::vector<TableSpec>& tables() const { return tables_; }

  // The server holding row `key` of table `table`. REQUIRES: table is a valid id and, for a
  // dense table, key < rows.
  int ServerOf(uint32_t table, uint64_t key) const;
  // The rows of dense table `table` that `server` holds (may be empty).
  RowRange DenseRangeOf(uint32_t table, int server) const;

  // Splits a request into per-server parts; servers with nothing to do are left out.
  std::vector<RangeSlice> SplitRange(uint32_t table, RowRange rows) const;
  std::vector<KeySlice> SplitKeys(uint32_t table, std::span<const uint64_t> keys) const;

 private:
  std::vector<TableSpec> tables_;
  int num_servers_;
};

// A deterministic 64-bit hash of (seed, a, b): the same everywhere, so that a row's
// initial value and its home do not depend on which process computes them.
uint64_t HashKey(uint64_t seed, uint64_t a, uint64_t b);

}  // namespace ps
