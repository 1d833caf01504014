// Click-through data for --model=wide_deep, in the layout of the Criteo display-ads logs:
// one example a line, tab-separated: the label (0 or 1), `dense` numeric features, then
// `fields` categorical ids.
//
//   1\t0.31\t-1.2\t...\t17\t1042\t...
//
// The ids are unsigned 64-bit integers, one id space for every field: the generator
// (scripts/make_sparse_data.sh --ctr) gives each field its own id range, so an id names one
// value of one field and is the key of its rows in the sparse tables `emb` and
// `wide.weight`. (Criteo's hex tokens would be hashed with their field to such ids first.)
//
// The same struct holds LIBSVM rows for the network input:sparse (sparse logistic
// regression): no dense features and no fixed fields, but each example its own number of
// ids, each with a value (CtrFromLibsvm).
//
// Thread safety: the functions share no state; call them from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/libsvm_reader.h"

namespace ps {

struct CtrDataset {
  int dense = 0;   // numeric features per example
  int fields = 0;  // categorical ids per example; 0: each example has its own (id_offsets)
  int64_t count = 0;
  std::vector<float> values;    // count x dense, row-major
  std::vector<uint64_t> ids;    // the examples' ids in example order: count x fields
  std::vector<int32_t> labels;  // count, 0 or 1
  // fields == 0 only: count + 1 offsets, example e's ids are [id_offsets[e], id_offsets[e+1]),
  // and id_values, parallel to ids, the value each id is weighed by (LIBSVM's IDX:VALUE).
  std::vector<int64_t> id_offsets;
  std::vector<float> id_values;

  // A data set of no examples with this shape (a job without test data evaluates none):
  // with fields == 0 its one offset, as every variable-width data set has count + 1.
  static CtrDataset Empty(int dense, int fields) {
    CtrDataset d;
    d.dense = dense;
    d.fields = fields;
    if (fields == 0) d.id_offsets.push_back(0);
    return d;
  }

  const float* values_of(int64_t e) const { return values.data() + e * dense; }
  int64_t ids_begin(int64_t e) const { return fields > 0 ? e * fields : id_offsets[e]; }
  int64_t ids_end(int64_t e) const { return fields > 0 ? (e + 1) * fields : id_offsets[e + 1]; }
};

// LIBSVM rows as the examples of input:sparse (moved, not copied): fields 0, no dense
// features. InvalidArgument when the rows are not consistent (offsets, values, labels).
Result<CtrDataset> CtrFromLibsvm(SparseDataset rows);

// Reads a CTR file (plain text) of examples with `dense` numeric features and `fields` ids.
// NotFound for a missing file; InvalidArgument naming the file, line and column of a line
// with the wrong number of columns, a label other than 0 or 1, a value that is not a finite
// number or an id that is not an unsigned integer.
Result<CtrDataset> LoadCtr(const std::string& path, int dense, int fields);

}  // namespace ps
