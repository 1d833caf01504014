#include "worker/ctr_data.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string_view>

namespace ps {
namespace {

// Parses one token of column `col` (0: the label) into `data`; `where` is "FILE:LINE".
Status ParseToken(std::string_view tok, int col, const std::string& where, CtrDataset* data) {
  const char* b = tok.data();
  const char* e = tok.data() + tok.size();
  const std::string head =
      where + ": column " + std::to_string(col + 1) + " '" + std::string(tok) + "'";
  if (col == 0) {
    if (tok != "0" && tok != "1") return InvalidArgument(head + ": expected a label 0 or 1");
    data->labels.push_back(tok == "1" ? 1 : 0);
  } else if (col <= data->dense) {
    float v = 0;
    const auto [p, ec] = std::from_chars(b, e, v);
    if (tok.empty() || ec != std::errc() || p != e || !std::isfinite(v)) {
      return InvalidArgument(head + ": expected a finite number (dense feature " +
                             std::to_string(col) + ")");
    }
    data->values.push_back(v);
  } else {
    uint64_t id = 0;
    const auto [p, ec] = std::from_chars(b, e, id);
    if (tok.empty() || ec != std::errc() || p != e) {
      return InvalidArgument(head + ": expected an unsigned integer id (field " +
                             std::to_string(col - data->dense) + ")");
    }
    data->ids.push_back(id);
  }
  return Status::Ok();
}

Status ParseLine(std::string_view line, const std::string& where, CtrDataset* data) {
  const int64_t columns = 1 + data->dense + data->fields;
  const int64_t got = 1 + std::count(line.begin(), line.end(), '\t');
  if (got != columns) {
    return InvalidArgument(where + ": expected " + std::to_string(columns) +
                           " tab-separated columns (label, " + std::to_string(data->dense) +
                           " dense features, " + std::to_string(data->fields) + " ids), got " +
                           std::to_string(got));
  }
  size_t pos = 0;
  for (int col = 0; col < columns; ++col) {
    const size_t tab = std::min(line.find('\t', pos), line.size());
    PS_RETURN_IF_ERROR(ParseToken(line.substr(pos, tab - pos), col, where, data));
    pos = tab + 1;
  }
  ++data->count;
  return Status::Ok();
}

}  // namespace

Result<CtrDataset> LoadCtr(const std::string& path, int dense, int fields) {
  if (dense < 0 || fields < 1) {
    return InvalidArgument("CTR data: expected dense >= 0 and fields >= 1, got " +
                           std::to_string(dense) + " and " + std::to_string(fields));
  }
  std::ifstream in(path);
  if (!in) return NotFound("cannot read CTR file " + path + ": " + std::strerror(errno));
  CtrDataset data;
  data.dense = dense;
  data.fields = fields;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    PS_RETURN_IF_ERROR(ParseLine(line, path + ":" + std::to_string(n), &data));
  }
  if (in.bad()) return Unavailable("cannot read CTR file " + path + ": " + std::strerror(errno));
  return data;
}

Result<CtrDataset> CtrFromLibsvm(SparseDataset rows) {
  const size_t n = rows.features.size();
  bool ok = rows.count >= 0 && rows.offsets.size() == static_cast<size_t>(rows.count) + 1 &&
            rows.labels.size() == static_cast<size_t>(rows.count) && rows.values.size() == n &&
            rows.offsets.front() == 0 && rows.offsets.back() == static_cast<int64_t>(n);
  for (size_t e = 0; ok && e + 1 < rows.offsets.size(); ++e) {
    ok = rows.offsets[e] <= rows.offsets[e + 1];
  }
  for (size_t e = 0; ok && e < rows.labels.size(); ++e) {
    ok = rows.labels[e] == 0 || rows.labels[e] == 1;
  }
  if (!ok) {
    return InvalidArgument("LIBSVM rows: inconsistent: " + std::to_string(rows.count) +
                           " examples, " + std::to_string(rows.offsets.size()) + " offsets, " +
                           std::to_string(rows.labels.size()) + " labels (0 or 1), " +
                           std::to_string(n) + " features, " + std::to_string(rows.values.size()) +
                           " values");
  }
  CtrDataset d;
  d.count = rows.count;
  d.ids = std::move(rows.features);
  d.id_values = std::move(rows.values);
  d.id_offsets = std::move(rows.offsets);
  d.labels = std::move(rows.labels);
  return d;
}

}  // namespace ps
