// Fuzzes the IDX reader: the input is split into an images file and a labels file, both
// written to scratch files and read with LoadIdxFiles, as a worker reads Fashion-MNIST.
// Plain and gzip files both come through here.
//
// Input layout: images file length u16 little-endian, the images file's bytes, then the
// labels file's bytes (the rest).
//
// A pair that reads must give a consistent dataset: count * rows * cols pixels in [0, 1]
// and count labels in 0..255. A violation traps.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "worker/idx_reader.h"

namespace ps::fuzz {
namespace {

void RunInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const std::string images = WriteScratchFile("images", in.LengthPrefixed());
  const std::string labels = WriteScratchFile("labels", in.Rest());
  if (images.empty() || labels.empty()) return;

  Result<ImageDataset> ds = LoadIdxFiles(images, labels);
  if (!ds.ok()) {
    if (ds.status().message().empty()) __builtin_trap();
    return;
  }
  if (ds->count < 0 || ds->rows < 1 || ds->cols < 1) __builtin_trap();
  const auto count = static_cast<uint64_t>(ds->count);
  if (ds->pixels.size() != count * static_cast<uint64_t>(ds->rows) * ds->cols) __builtin_trap();
  if (ds->labels.size() != count) __builtin_trap();
  for (float p : ds->pixels) {
    if (!(p >= 0.0f && p <= 1.0f)) __builtin_trap();
  }
  for (int32_t l : ds->labels) {
    if (l < 0 || l > 255) __builtin_trap();
  }
}

}  // namespace
}  // namespace ps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::fuzz::RunInput(data, size);
  return 0;
}
