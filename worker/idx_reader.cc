#include "worker/idx_reader.h"

#include <glog/logging.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

namespace ps {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
// Limits that no real image data set reaches: a header past them is corrupt, and reading
// on would try to allocate absurd amounts of memory.
constexpr uint32_t kMaxCount = 100'000'000;
constexpr uint32_t kMaxSide = 16'384;
constexpr uint64_t kMaxPixels = uint64_t{1} << 32;

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// One open IDX file; every error it returns names the file.
class IdxFile {
 public:
  static Result<IdxFile> Open(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return NotFound("IDX file " + path + " does not exist");
    }
    errno = 0;
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      return NotFound("cannot open IDX file " + path + ": " +
                      (errno != 0 ? std::strerror(errno) : "out of memory"));
    }
    // Large reads: the default 8 KiB buffer makes inflate slow on 50 MB files.
    gzbuffer(f, 1 << 17);
    return IdxFile(path, GzFile(f));
  }

  // Reads the magic number and the dimensions it announces.
  Result<std::vector<uint32_t>> ReadHeader(uint32_t expected_magic, const char* kind) {
    uint32_t magic = 0;
    PS_RETURN_IF_ERROR(ReadU32(&magic, "magic number"));
    if (magic != expected_magic) {
      return InvalidArgument("IDX file " + path_ + ": bad magic number " + Hex(magic) +
                             ", expected " + Hex(expected_magic) + " (" + kind +
                             "); is it the right file, and not double-compressed?");
    }
    std::vector<uint32_t> dims(expected_magic & 0xff);
    for (size_t i = 0; i < dims.size(); ++i) {
      PS_RETURN_IF_ERROR(ReadU32(&dims[i], "dimension " + std::to_string(i)));
    }
    return dims;
  }

  // Reads exactly n bytes of `what`.
  Status ReadExact(uint8_t* dst, uint64_t n, const std::string& what) {
    uint64_t got = 0;
    while (got < n) {
      // gzread takes an unsigned count and returns an int: read in chunks below INT_MAX.
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(n - got, 1u << 30));
      const int r = gzread(file_.get(), dst + got, chunk);
      if (r < 0) return ReadError(what);
      if (r == 0) break;
      got += static_cast<uint64_t>(r);
    }
    if (got < n) {
      int err = Z_OK;
      gzerror(file_.get(), &err);
      if (err != Z_OK && err != Z_BUF_ERROR) return ReadError(what);
      return InvalidArgument("IDX file " + path_ + " is truncated: expected " + std::to_string(n) +
                             " bytes of " + what + ", got " + std::to_string(got));
    }
    offset_ += n;
    return Status::Ok();
  }

  // A header that undercounts the data means the file is not what it claims to be.
  Status ExpectEnd() {
    uint8_t byte = 0;
    const int r = gzread(file_.get(), &byte, 1);
    if (r < 0) return ReadError("the end of the file");
    if (r > 0) {
      return InvalidArgument("IDX file " + path_ + " has trailing bytes after the " +
                             std::to_string(offset_) + " bytes its header describes");
    }
    return Status::Ok();
  }

  const std::string& path() const { return path_; }

 private:
  IdxFile(std::string path, GzFile file) : path_(std::move(path)), file_(std::move(file)) {}

  Status ReadU32(uint32_t* v, const std::string& what) {
    uint8_t b[4];
    PS_RETURN_IF_ERROR(ReadExact(b, 4, what));
    *v = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    return Status::Ok();
  }

  Status ReadError(const std::string& what) {
    int err = Z_OK;
    const char* msg = gzerror(file_.get(), &err);
    std::string detail = msg != nullptr ? msg : "unknown error";
    if (err == Z_ERRNO) detail = std::strerror(errno);
    return InvalidArgument("IDX file " + path_ + ": reading " + what + " at byte " +
                           std::to_string(offset_) + " failed: " + detail);
  }

  std::string path_;
  GzFile file_;
  uint64_t offset_ = 0;  // uncompressed bytes consumed so far
};

// The .gz name when it exists, else the same name without .gz when that exists, else the
// .gz name (so that the error names the file that was asked for).
std::string PickPath(const std::string& gz_path) {
  std::error_code ec;
  if (std::filesystem::exists(gz_path, ec)) return gz_path;
  const std::string plain = gz_path.substr(0, gz_path.size() - 3);
  if (std::filesystem::exists(plain, ec)) return plain;
  return gz_path;
}

// The inflated copy of `gz_path` in `cache_dir`: named by the source's canonical path, size
// and modification time, so that any change to the source names another copy.
Result<std::string> CachePath(const std::string& gz_path, const std::string& cache_dir) {
  std::error_code ec;
  const std::filesystem::path source = std::filesystem::canonical(gz_path, ec);
  if (ec) return NotFound("cannot resolve " + gz_path + ": " + ec.message());
  const uintmax_t size = std::filesystem::file_size(source, ec);
  if (ec) return NotFound("cannot stat " + gz_path + ": " + ec.message());
  const auto mtime = std::filesystem::last_write_time(source, ec);
  if (ec) return NotFound("cannot stat " + gz_path + ": " + ec.message());
  const std::string key = source.string() + "|" + std::to_string(size) + "|" +
                          std::to_string(mtime.time_since_epoch().count());
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  std::string name = source.filename().string();
  name.resize(name.size() - 3);  // without .gz
  return (std::filesystem::path(cache_dir) / (name + "-" + hash)).string();
}

// Inflates `gz_path` into `cached` (through a temporary file and a rename), unless it
// inflates to more than `max_bytes`.
Status InflateInto(const std::string& gz_path, const std::string& cached, uint64_t max_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cached).parent_path(), ec);
  if (ec) return Unavailable("cannot create " + cached + "'s directory: " + ec.message());
  gzFile in = gzopen(gz_path.c_str(), "rb");
  if (in == nullptr) return NotFound("cannot open " + gz_path);
  GzFile in_closer(in);
  gzbuffer(in, 1 << 17);
  const std::string tmp = cached + ".tmp." + std::to_string(getpid());
  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (out == nullptr) return Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  uint64_t written = 0;
  int n = 0;
  while ((n = gzread(in, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
    written += static_cast<uint64_t>(n);
    if (written > max_bytes) {
      out.reset();
      std::filesystem::remove(tmp, ec);
      return InvalidArgument(gz_path + " inflates to more than " + std::to_string(max_bytes) +
                             " bytes; not cached");
    }
    if (std::fwrite(buf.data(), 1, static_cast<size_t>(n), out.get()) != static_cast<size_t>(n)) {
      const std::string why = std::strerror(errno);
      out.reset();
      std::filesystem::remove(tmp, ec);
      return Unavailable("cannot write " + tmp + ": " + why);
    }
  }
  const bool closed = std::fclose(out.release()) == 0;
  if (n < 0 || !closed) {
    std::filesystem::remove(tmp, ec);
    return Unavailable(n < 0 ? "cannot inflate " + gz_path : "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, cached, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Unavailable("cannot rename " + tmp + ": " + ec.message());
  }
  return Status::Ok();
}

// The path to read for `path`: its inflated copy when `path` is gzip and a cache is given
// (made now when missing), else `path`.
std::string ViaCache(const std::string& path, const IdxCache& cache, IdxCacheReport* report) {
  if (cache.dir.empty() || !path.ends_with(".gz")) return path;
  Result<std::string> cached = CachePath(path, cache.dir);
  if (!cached.ok()) return path;  // the load names the missing source itself
  std::error_code ec;
  if (std::filesystem::exists(*cached, ec)) {
    ++report->files_from_cache;
    return *cached;
  }
  if (Status s = InflateInto(path, *cached, cache.max_inflated_bytes); !s.ok()) {
    report->error = s.message();
    return path;
  }
  ++report->files_cached;
  return *cached;
}

}  // namespace

IdxCache IdxCache::FromEnvironment() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? "" : v;
  };
  const std::string ps = env("PS_CACHE_DIR");
  if (ps == "off") return {};
  if (!ps.empty()) return {ps + "/idx"};
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return {xdg + "/ps/idx"};
  if (const std::string home = env("HOME"); !home.empty()) return {home + "/.cache/ps/idx"};
  return {};
}

Result<ImageDataset> LoadIdxFiles(const std::string& images_path, const std::string& labels_path) {
  PS_ASSIGN_OR_RETURN(IdxFile images, IdxFile::Open(images_path));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> dims,
                      images.ReadHeader(kImagesMagic, "IDX3 unsigned-byte images"));
  const uint32_t count = dims[0];
  const uint32_t rows = dims[1];
  const uint32_t cols = dims[2];
  if (count > kMaxCount) {
    return InvalidArgument("IDX file " + images_path + " claims " + std::to_string(count) +
                           " images; more than " + std::to_string(kMaxCount) +
                           " means a corrupt header");
  }
  if (rows < 1 || cols < 1 || rows > kMaxSide || cols > kMaxSide) {
    return InvalidArgument("IDX file " + images_path + " has images of " + std::to_string(rows) +
                           " x " + std::to_string(cols) + " pixels; each side must be in [1, " +
                           std::to_string(kMaxSide) + "]");
  }
  const uint64_t num_pixels = uint64_t{count} * rows * cols;
  if (num_pixels > kMaxPixels) {
    return InvalidArgument("IDX file " + images_path + " holds " + std::to_string(num_pixels) +
                           " pixels, more than the limit of " + std::to_string(kMaxPixels));
  }

  // Labels header before the pixel data: a mismatch is found without inflating 50 MB.
  PS_ASSIGN_OR_RETURN(IdxFile labels, IdxFile::Open(labels_path));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> label_dims,
                      labels.ReadHeader(kLabelsMagic, "IDX1 unsigned-byte labels"));
  if (label_dims[0] != count) {
    return InvalidArgument("image and label counts differ: " + images_path + " has " +
                           std::to_string(count) + " images, " + labels_path + " has " +
                           std::to_string(label_dims[0]) + " labels");
  }

  ImageDataset ds;
  ds.count = count;
  ds.rows = static_cast<int>(rows);
  ds.cols = static_cast<int>(cols);
  {
    // Grown as the data arrives, so that a header claiming gigabytes over a truncated file
    // costs at most one chunk more than the file holds (found by fuzz_idx).
    constexpr uint64_t kChunk = uint64_t{16} << 20;
    std::vector<uint8_t> raw;
    while (raw.size() < num_pixels) {
      const size_t done = raw.size();
      const uint64_t n = std::min<uint64_t>(kChunk, num_pixels - done);
      raw.resize(done + n);
      PS_RETURN_IF_ERROR(images.ReadExact(raw.data() + done, n, "pixel data"));
    }
    PS_RETURN_IF_ERROR(images.ExpectEnd());
    ds.pixels.resize(num_pixels);
    // A table of v / 255 rather than v * (1 / 255): 255 maps to exactly 1.0f.
    std::array<float, 256> scaled;
    for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) / 255.0f;
    for (uint64_t i = 0; i < num_pixels; ++i) ds.pixels[i] = scaled[raw[i]];
  }
  std::vector<uint8_t> raw_labels(count);
  PS_RETURN_IF_ERROR(labels.ReadExact(raw_labels.data(), count, "labels"));
  PS_RETURN_IF_ERROR(labels.ExpectEnd());
  ds.labels.assign(raw_labels.begin(), raw_labels.end());
  return ds;
}

Result<ImageDataset> LoadIdxDataset(const std::string& dir, const std::string& prefix,
                                    const IdxCache& cache, IdxCacheReport* report) {
  if (prefix.empty()) return InvalidArgument("LoadIdxDataset: empty file prefix");
  IdxCacheReport unused;
  if (report == nullptr) report = &unused;
  const std::filesystem::path base(dir);
  const std::string images = PickPath((base / (prefix + "-images-idx3-ubyte.gz")).string());
  const std::string labels = PickPath((base / (prefix + "-labels-idx1-ubyte.gz")).string());
  const std::string images_read = ViaCache(images, cache, report);
  const std::string labels_read = ViaCache(labels, cache, report);
  if (images_read == images && labels_read == labels) return LoadIdxFiles(images, labels);
  Result<ImageDataset> ds = LoadIdxFiles(images_read, labels_read);
  if (ds.ok()) return ds;
  // A copy the source no longer matches (damaged on disk, or the source itself is bad):
  // drop the copies and read the sources, whose errors name the files the user gave.
  report->error = "cached copy unreadable (" + ds.status().message() + "); read the sources";
  std::error_code ec;
  if (images_read != images) std::filesystem::remove(images_read, ec);
  if (labels_read != labels) std::filesystem::remove(labels_read, ec);
  report->files_from_cache = 0;
  report->files_cached = 0;
  return LoadIdxFiles(images, labels);
}

Result<ImageDataset> LoadIdxDatasetCached(const std::string& dir, const std::string& prefix) {
  const IdxCache cache = IdxCache::FromEnvironment();
  IdxCacheReport report;
  Result<ImageDataset> ds = LoadIdxDataset(dir, prefix, cache, &report);
  if (!report.error.empty()) {
    LOG(WARNING) << "data cache " << cache.dir << " not used for " << prefix << ": "
                 << report.error;
  } else if (report.files_cached > 0) {
    LOG(INFO) << "inflated " << prefix << " into the data cache " << cache.dir
              << " (PS_CACHE_DIR=off: none); later runs read it from there";
  }
  return ds;
}

}  // namespace ps
