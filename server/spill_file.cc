#include "server/spill_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ps {
namespace {

constexpr size_t kPage = 4096;
// Records per bucket at least this many, so that a bucket rarely overflows.
constexpr uint32_t kMinRecordsPerBucket = 4;
// The table doubles past this fraction of its records.
constexpr double kMaxLoad = 0.8;

Status IoError(const std::string& what, const std::string& path) {
  return Internal("spill file " + path + ": " + what + ": " + std::strerror(errno));
}

Status PreadAll(int fd, char* out, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("read", path);
    }
    if (r == 0) {  // past the end: cannot happen, the file is sized up front
      errno = EIO;
      return IoError("short read", path);
    }
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const char* in, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pwrite(fd, in, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError("write", path);
    }
    in += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// splitmix64's finalizer: keys of one server are already spread by the shard map's hash,
// but dense-looking id ranges must not crowd into neighbouring buckets either.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint32_t RecordsPerBucket(size_t row_bytes) {
  const size_t record = 8 + row_bytes;
  return static_cast<uint32_t>(
      std::min<size_t>(UINT16_MAX, std::max<size_t>(kMinRecordsPerBucket, kPage / record)));
}

size_t BucketBytes(size_t row_bytes) {
  const size_t raw = RecordsPerBucket(row_bytes) * (8 + row_bytes);
  return (raw + kPage - 1) / kPage * kPage;  // whole pages: a bucket read touches no neighbour
}

uint64_t BucketsFor(uint64_t rows, size_t row_bytes) {
  const uint64_t records = static_cast<uint64_t>(static_cast<double>(rows) / kMaxLoad) + 1;
  const uint32_t per = RecordsPerBucket(row_bytes);
  return std::max<uint64_t>(1, (records + per - 1) / per);
}

Result<int> OpenFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("open", path);
  // No readahead: it would fill the page cache with large folios (see the header).
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  return fd;
}

}  // namespace

SpillFile::SpillFile(std::string path, int fd, size_t row_bytes, uint64_t buckets)
    : path_(std::move(path)),
      fd_(fd),
      row_bytes_(row_bytes),
      records_per_bucket_(RecordsPerBucket(row_bytes)),
      bucket_bytes_(BucketBytes(row_bytes)),
      buckets_(buckets),
      counts_(buckets, 0),
      bucket_(bucket_bytes_) {}

Result<std::unique_ptr<SpillFile>> SpillFile::Create(const std::string& path, size_t row_bytes,
                                                     uint64_t expected_rows) {
  if (row_bytes == 0 || row_bytes % 4 != 0) {
    return InvalidArgument("spill file: rows of " + std::to_string(row_bytes) + " bytes");
  }
  PS_ASSIGN_OR_RETURN(int fd, OpenFile(path));
  const uint64_t buckets = BucketsFor(std::max<uint64_t>(expected_rows, 1), row_bytes);
  return std::unique_ptr<SpillFile>(new SpillFile(path, fd, row_bytes, buckets));
}

SpillFile::~SpillFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

uint64_t SpillFile::Home(uint64_t key) const {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(Mix(key)) * buckets_) >> 64);
}

Status SpillFile::Find(uint64_t key, bool* found, uint64_t* place, uint64_t* free_bucket) {
  *found = false;
  uint64_t b = Home(key);
  for (uint64_t probe = 0; probe < buckets_; ++probe) {
    const uint32_t count = counts_[b];
    if (count > 0) {
      PS_RETURN_IF_ERROR(
          PreadAll(fd_, bucket_.data(), count * record_bytes(), b * bucket_bytes_, path_));
      for (uint32_t i = 0; i < count; ++i) {
        uint64_t k;
        std::memcpy(&k, bucket_.data() + i * record_bytes(), 8);
        if (k == key) {
          *found = true;
          *place = RecordOffset(b, i) + 8;
          return Status::Ok();
        }
      }
    }
    if (count < records_per_bucket_) {  // rows are never deleted: the probe ends here
      *free_bucket = b;
      return Status::Ok();
    }
    b = b + 1 == buckets_ ? 0 : b + 1;
  }
  return Internal("spill file " + path_ + ": every bucket is full");
}

uint64_t SpillFile::FreeBucket(uint64_t key) const {
  uint64_t b = Home(key);
  while (counts_[b] >= records_per_bucket_) b = b + 1 == buckets_ ? 0 : b + 1;
  return b;  // exists: the load stays below kMaxLoad
}

Status SpillFile::Read(uint64_t key, char* row, bool* found, uint64_t* place) {
  uint64_t free_bucket;
  PS_RETURN_IF_ERROR(Find(key, found, place, &free_bucket));
  if (*found) {
    const uint64_t at = *place - 8 - (*place / bucket_bytes_) * bucket_bytes_;
    std::memcpy(row, bucket_.data() + at + 8, row_bytes_);
  }
  return Status::Ok();
}

Status SpillFile::Write(uint64_t key, const char* row, uint64_t place) {
  if (place != kNowhere && place != kAbsent) {
    return PwriteAll(fd_, row, row_bytes_, place, path_);
  }
  uint64_t free_bucket = 0;
  if (place == kNowhere) {
    bool found = false;
    PS_RETURN_IF_ERROR(Find(key, &found, &place, &free_bucket));
    if (found) return PwriteAll(fd_, row, row_bytes_, place, path_);
  }
  if (static_cast<double>(rows_ + 1) >
      kMaxLoad * static_cast<double>(buckets_ * records_per_bucket_)) {
    PS_RETURN_IF_ERROR(Grow());
    return InsertInto(FreeBucket(key), key, row);
  }
  return InsertInto(place == kAbsent ? FreeBucket(key) : free_bucket, key, row);
}

Status SpillFile::InsertInto(uint64_t b, uint64_t key, const char* row) {
  // One write of the record (key and row together).
  std::memcpy(bucket_.data(), &key, 8);
  std::memcpy(bucket_.data() + 8, row, row_bytes_);
  PS_RETURN_IF_ERROR(
      PwriteAll(fd_, bucket_.data(), record_bytes(), RecordOffset(b, counts_[b]), path_));
  ++counts_[b];
  ++rows_;
  return Status::Ok();
}

Status SpillFile::Grow() {
  const std::string next_path = path_ + ".next";
  PS_ASSIGN_OR_RETURN(int fd, OpenFile(next_path));
  std::unique_ptr<SpillFile> next(new SpillFile(next_path, fd, row_bytes_, buckets_ * 2));
  Status inserted = Status::Ok();
  PS_RETURN_IF_ERROR(ForEach([&](uint64_t key, const char* row) {
    if (inserted.ok()) inserted = next->InsertInto(next->FreeBucket(key), key, row);
  }));
  PS_RETURN_IF_ERROR(inserted);
  if (::rename(next_path.c_str(), path_.c_str()) != 0) return IoError("rename", next_path);
  ::close(fd_);
  fd_ = next->fd_;
  next->fd_ = -1;  // now ours; its destructor must neither close nor unlink it
  buckets_ = next->buckets_;
  counts_ = std::move(next->counts_);
  ++generation_;
  return Status::Ok();
}

Status SpillFile::ForEachRecord(void* ctx, void (*fn)(void*, uint64_t, const char*)) {
  // kScanBuckets buckets a read (a scan is one pread per bucket otherwise: 3x slower
  // checkpoints than RocksDB's iterator). Reads leave the page cache's folios as they are
  // (the file is POSIX_FADV_RANDOM); only large writes made them large.
  constexpr uint64_t kScanBuckets = 64;
  std::vector<char> window(kScanBuckets * bucket_bytes_);
  for (uint64_t first = 0; first < buckets_; first += kScanBuckets) {
    const uint64_t end = std::min(buckets_, first + kScanBuckets);
    uint64_t lo = first, hi = end;
    while (lo < hi && counts_[lo] == 0) ++lo;
    while (hi > lo && counts_[hi - 1] == 0) --hi;
    if (lo == hi) continue;
    const size_t bytes = (hi - lo - 1) * bucket_bytes_ + counts_[hi - 1] * record_bytes();
    PS_RETURN_IF_ERROR(PreadAll(fd_, window.data(), bytes, lo * bucket_bytes_, path_));
    for (uint64_t b = lo; b < hi; ++b) {
      const char* bucket = window.data() + (b - lo) * bucket_bytes_;
      for (uint32_t i = 0; i < counts_[b]; ++i) {
        const char* record = bucket + i * record_bytes();
        uint64_t key;
        std::memcpy(&key, record, 8);
        fn(ctx, key, record + 8);
      }
    }
  }
  return Status::Ok();
}

}  // namespace ps
