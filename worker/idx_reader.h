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

// Where gzip IDX files are kept inflated between runs: inflating Fashion-MNIST's 26 MB of
// training images takes ~0.35 s of every worker's start, reading the inflated copy ~0.02 s
// (torchvision keeps an inflated copy too). A copy is named after its source's path, size
// and modification time, so a changed source is inflated again; it is written under a
// temporary name and renamed, so a reader never sees half a copy, and concurrent workers
// may both write it.
struct IdxCache {
  // Empty: no cache (inflate every time). Created when missing.
  std::string dir;
  // A file inflating to more is read from its source and not cached (a gzip bomb must not
  // fill the disk). The default is the largest IDX file the reader accepts.
  uint64_t max_inflated_bytes = (uint64_t{1} << 32) + 64;

  // $PS_CACHE_DIR/idx when set (PS_CACHE_DIR=off: no cache), else $XDG_CACHE_HOME/ps/idx,
  // else $HOME/.cache/ps/idx, else no cache.
  static IdxCache FromEnvironment();
};

// What LoadIdxDataset did with the cache, for the caller's log.
struct IdxCacheReport {
  int files_from_cache = 0;  // of the two files (images, labels)
  int files_cached = 0;      // inflated into the cache by this call
  std::string error;         // why the cache was not used (the load went on without it)
};

// Reads DIR/{prefix}-images-idx3-ubyte.gz and DIR/{prefix}-labels-idx1-ubyte.gz, prefix
// "train" or "t10k" for the standard files. Where a .gz file is absent but the same name
// without .gz exists, that uncompressed file is read instead. With a cache, a .gz file is
// read from its inflated copy (made on first use); a cache that cannot be written or read
// is skipped (`report->error` says why), never an error of the load.
Result<ImageDataset> LoadIdxDataset(const std::string& dir, const std::string& prefix,
                                    const IdxCache& cache = {}, IdxCacheReport* report = nullptr);

// LoadIdxDataset with IdxCache::FromEnvironment(), logging what the cache did: what a
// worker and the standalone baseline read their data with.
Result<ImageDataset> LoadIdxDatasetCached(const std::string& dir, const std::string& prefix);

// Reads an images file and a labels file (gzip or plain). Errors name the file:
// NotFound when it is missing; InvalidArgument for a bad magic number, a truncated file,
// trailing bytes, sizes over the sanity limits, or image and label counts that differ.
Result<ImageDataset> LoadIdxFiles(const std::string& images_path, const std::string& labels_path);

}  // namespace ps
