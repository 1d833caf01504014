// Reader for the LIBSVM / SVMlight text format that most public click-through-rate data sets
// use: one example a line, `LABEL IDX:VALUE IDX:VALUE ...`. Files may be gzip-compressed or
// plain; zlib reads both.
//
// Thread safety: the functions share no state; call them from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

// Examples in compressed sparse row form.
struct SparseDataset {
  int64_t count = 0;               // number of examples
  std::vector<int64_t> offsets;    // count + 1; example i's features are [offsets[i], offsets[i+1])
  std::vector<uint64_t> features;  // feature ids (hashed when asked), in file order
  std::vector<float> values;       // parallel to features; finite
  std::vector<int32_t> labels;     // count labels, 0 or 1
};

struct LibsvmOptions {
  // Replace every feature id by HashFeature(id), so that ids spread evenly over the 64-bit
  // key space (and so over the parameter servers' key ranges) whatever the file's numbering.
  bool hash_features = false;
  // Stop after this many examples; 0 reads them all. Negative is InvalidArgument.
  int64_t max_examples = 0;
};

// Reads a LIBSVM file (gzip or plain). Per line: a label (+1, 1, -1 or 0, also written as a
// decimal such as 1.0; -1 and 0 both become 0), then any number of IDX:VALUE pairs separated
// by spaces or tabs, IDX a non-negative integer that fits in 64 bits and VALUE a finite
// float. Blank lines and everything from a `#` to the end of its line are skipped; a
// trailing '\r' (CRLF files) is ignored. Indices need not be sorted or distinct.
// Errors: NotFound naming the path when the file is missing; InvalidArgument for any
// malformed line, as "PATH:LINE: expected WHAT, got 'TEXT'" (LINE 1-based), or for a read
// error.
Result<SparseDataset> LoadLibsvm(const std::string& path, const LibsvmOptions& options = {});

// A stable 64-bit hash of a feature id: XXH3 of its 8 little-endian bytes, the same on
// every machine and in every release that links xxHash >= 0.8.
uint64_t HashFeature(uint64_t id);

}  // namespace ps
