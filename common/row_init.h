// A row's starting value. A row is `width` values followed by its optimizer's state
// (Optimizer::StateFloats(width) floats, common/optimizer.h). The values are a function of
// (seed, table id, key) alone, so that a row created on any server, re-created after a
// restart, or built by the standalone baseline starts the same; the state starts at zero.
//
// Thread safety: pure functions; call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/job_config.h"

namespace ps {

// Fills `out` (width floats) with the initial values of row `key` of `table`: the table's
// initializer (zeros when its init_scale is 0) seeded by HashKey(seed, table.id, key).
void InitializeRow(const TableSpec& table, uint64_t seed, uint64_t key, std::span<float> out);

// Fills `out` with consecutive new rows of `table` starting at row `first_key`, each
// `stride` floats: InitializeRow's values, then zeros for the state.
// REQUIRES: stride >= table.width and out.size() is a multiple of stride.
void InitializeRows(const TableSpec& table, uint64_t seed, uint64_t first_key, size_t stride,
                    std::span<float> out);

}  // namespace ps
