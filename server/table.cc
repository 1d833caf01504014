#include "server/table.h"

#include <algorithm>

#include "common/row_init.h"

namespace ps {

Table::Table(const TableSpec& spec, RowRange held, uint64_t seed, size_t state_floats)
    : spec_(spec),
      held_(spec.dense() ? held : RowRange{}),
      seed_(seed),
      stride_(spec.width + state_floats) {
  if (spec_.dense()) {
    dense_.resize(held_.size() * stride_);
    InitializeRows(spec_, seed_, held_.begin, stride_, dense_);
  }
}

Result<Table> Table::Create(const TableSpec& spec, RowRange held, uint64_t seed,
                            size_t state_floats, const RowStoreOptions& store) {
  Table t(spec, held, seed, state_floats);
  if (!spec.dense()) {
    PS_ASSIGN_OR_RETURN(t.sparse_, RowStore::Open(spec, seed, t.stride_, store));
  }
  return t;
}

uint64_t Table::rows_held() const { return spec_.dense() ? held_.size() : sparse_->stats().rows; }

Status Table::CheckRange(RowRange rows) const {
  if (!spec_.dense()) {
    return InvalidArgument("table '" + spec_.name + "' is sparse: address its rows by key list");
  }
  if (rows.begin > rows.end || rows.begin < held_.begin || rows.end > held_.end) {
    return InvalidArgument("rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) +
                           ") of table '" + spec_.name +
                           "' are not held here (this server holds [" +
                           std::to_string(held_.begin) + ", " + std::to_string(held_.end) + "))");
  }
  return Status::Ok();
}

Status Table::CheckKeys(std::span<const uint64_t> keys) const {
  if (!spec_.dense()) return Status::Ok();
  for (uint64_t k : keys) {
    if (k < held_.begin || k >= held_.end) {
      return InvalidArgument("row " + std::to_string(k) + " of table '" + spec_.name +
                             "' is not held here (this server holds [" +
                             std::to_string(held_.begin) + ", " + std::to_string(held_.end) + "))");
    }
  }
  return Status::Ok();
}

Status Table::Fetch(std::span<const uint64_t> keys, bool for_write, std::vector<float*>* rows) {
  if (sparse_) return sparse_->Fetch(keys, for_write, rows);
  rows->resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) (*rows)[i] = DenseRow(keys[i]);
  return Status::Ok();
}

}  // namespace ps
