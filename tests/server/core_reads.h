// Reading a ServerCore's state back in tests: the rows of a table, the dense keys a server
// holds.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_config.h"
#include "common/shard_map.h"
#include "server/server_core.h"

namespace ps::testing {

// The values and optimizer state of `keys` in table `table`, row after row.
inline std::vector<float> Rows(ServerCore& core, uint32_t table,
                               const std::vector<uint64_t>& keys) {
  std::vector<float> all;
  for (uint64_t k : keys) {
    std::vector<float> row = core.ReadRow(table, k).value();
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

// The keys of table 0's rows that `server` holds (table 0 dense).
inline std::vector<uint64_t> DenseKeys(const JobConfig& config, int server) {
  RowRange r = ShardMap(config.table_specs, config.num_servers).DenseRangeOf(0, server);
  std::vector<uint64_t> keys;
  for (uint64_t k = r.begin; k < r.end; ++k) keys.push_back(k);
  return keys;
}

}  // namespace ps::testing
