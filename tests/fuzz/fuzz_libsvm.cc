// Fuzzes the LIBSVM reader: the input (after one byte of options) is written to a scratch
// file and read with LoadLibsvm, as a worker reads --train_data. Plain and gzip files both
// come through here (zlib tells them apart by the first bytes).
//
// Input layout: options u8 (bit 0: also read with hash_features and compare; bits 1-2:
// max_examples 0-3), then the file's bytes.
//
// A file that reads must give a well-formed dataset: offsets from 0, non-decreasing, ending
// at the number of features; one finite value per feature; one 0/1 label per example; and
// hashing must change the feature ids and nothing else. A violation traps.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "worker/libsvm_reader.h"

namespace ps::fuzz {
namespace {

void CheckDataset(const SparseDataset& ds, int64_t max_examples) {
  if (ds.count < 0 || (max_examples > 0 && ds.count > max_examples)) __builtin_trap();
  const auto count = static_cast<size_t>(ds.count);
  if (ds.offsets.size() != count + 1 || ds.labels.size() != count) __builtin_trap();
  if (ds.offsets.front() != 0) __builtin_trap();
  for (size_t i = 0; i < count; ++i) {
    if (ds.offsets[i + 1] < ds.offsets[i]) __builtin_trap();
    if (ds.labels[i] != 0 && ds.labels[i] != 1) __builtin_trap();
  }
  if (static_cast<size_t>(ds.offsets.back()) != ds.features.size()) __builtin_trap();
  if (ds.values.size() != ds.features.size()) __builtin_trap();
  for (float v : ds.values) {
    if (!std::isfinite(v)) __builtin_trap();
  }
}

void RunInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const uint8_t options = in.U8();
  LibsvmOptions plain;
  plain.max_examples = (options >> 1) & 3;
  const std::string path = WriteScratchFile("libsvm", in.Rest());
  if (path.empty()) return;

  Result<SparseDataset> ds = LoadLibsvm(path, plain);
  if (!ds.ok()) {
    if (ds.status().message().empty()) __builtin_trap();
    return;
  }
  CheckDataset(*ds, plain.max_examples);

  if (options & 1) {
    LibsvmOptions hashed = plain;
    hashed.hash_features = true;
    Result<SparseDataset> h = LoadLibsvm(path, hashed);
    if (!h.ok()) __builtin_trap();  // hashing cannot make a good file bad
    CheckDataset(*h, hashed.max_examples);
    if (h->count != ds->count || h->offsets != ds->offsets || h->labels != ds->labels ||
        h->values != ds->values || h->features.size() != ds->features.size()) {
      __builtin_trap();
    }
    for (size_t i = 0; i < ds->features.size(); ++i) {
      if (h->features[i] != HashFeature(ds->features[i])) __builtin_trap();
    }
  }
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::RunInput(data, size);
  return 0;
}
