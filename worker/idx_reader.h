// Reader for the IDX format of MNIST and Fashion-MNIST: a big-endian header (magic number
// 0x00000803 for images, 0x00000801 for labels, then one uint32 per dimension) followed by
// unsigned bytes. Files may be gzip-compressed or plain; zlib reads both.
//
// Thread safety: the functions share no state; call them from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

struct ImageDataset {
  int64_t count = 0;  // number of images (and labels)
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;    // count * rows * cols, row-major per image, scaled to [0, 1]
  std::vector<int32_t> labels;  // count labels, 0..255 as stored
};

// Reads DIR/{prefix}-images-idx3-ubyte.gz and DIR/{prefix}-labels-idx1-ubyte.gz, prefix
// "train" or "t10k" for the standard files. Where a .gz file is absent but the same name
// without .gz exists, that uncompressed file is read instead.
Result<ImageDataset> LoadIdxDataset(const std::string& dir, const std::string& prefix);

// Reads an images file and a labels file (gzip or plain). Errors name the file:
// NotFound when it is missing; InvalidArgument for a bad magic number, a truncated file,
// trailing bytes, sizes over the sanity limits, or image and label counts that differ.
Result<ImageDataset> LoadIdxFiles(const std::string& images_path, const std::string& labels_path);

}  // namespace ps
