// The default spill tier of a RowStore: rows of one table, of one fixed size, in one local
// file that is an open-addressing hash table of buckets, read with pread and written with
// pwrite. A miss costs one pread of its home bucket (4 KB for small rows) from the page
// cache and no per-row memory (no index in memory); a dirty row that was read from the file
// is written back with one pwrite of its bytes at the place it was read from.
//
// Why not RocksDB for this: every row is rewritten in place at a fixed size and never
// deleted, and the data dies with the process, so an LSM tree's machinery (memtable inserts,
// flushes, compaction of rows rewritten all over the key space, bloom probes of several
// sorted runs, block index seeks and checksums) is work without a purpose here: spill_bench
// measured 6-12 us a missed row in RocksDB MultiGet plus 2-3 us a row of write-back, and
// compaction threads took ~40% of the process's CPU (see the README, "Models larger than
// memory").
//
// Layout: `buckets` buckets of `bucket_bytes` (whole pages); a bucket holds up to
// records_per_bucket records of [8-byte key][row], filled from its start. How many records
// each bucket holds is kept in memory (2 bytes a bucket, ~1/15 byte a row), so an empty
// bucket costs no read, a lookup reads only a bucket's records, and an insert is one pwrite.
// A key's home bucket is a hash of the key; a full bucket overflows into the next one
// (linear probing); rows are never deleted, so a lookup ends at the first bucket that is not
// full. Past 80% of the records the table doubles (each record is copied into a new file of
// twice the buckets; the places handed out before become stale: generation() changes).
// The file is written in pieces of at most a bucket and told POSIX_FADV_RANDOM (no
// readahead): a 128-byte pwrite into a page cache folio that a large write or readahead made
// large cost 47 us instead of 2.5 us (ext4 walks every block of the folio), on this VM's
// kernel 6.18. Lookups read only a bucket's records; scans (ForEach) read 64 buckets at once.
//
// Thread model: not thread-safe; owned by one RowStore (the server's request loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps {

class SpillFile {
 public:
  // A record's place in the file; kNowhere when unknown; kAbsent: known not to be there.
  static constexpr uint64_t kNowhere = UINT64_MAX;
  static constexpr uint64_t kAbsent = UINT64_MAX - 1;

  // Creates (truncates) `path` for rows of `row_bytes`, sized for `expected_rows` before it
  // first doubles. The file is removed when the SpillFile is destroyed.
  static Result<std::unique_ptr<SpillFile>> Create(const std::string& path, size_t row_bytes,
                                                   uint64_t expected_rows);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Copies key's row into `row` (row_bytes) and sets *found; when found, *place is where it
  // lies (for Write), valid while generation() stays the same.
  Status Read(uint64_t key, char* row, bool* found, uint64_t* place);
  // Stores key's row. `place`: from Read in the current generation, kNowhere (the key is
  // looked up, and inserted when absent) or kAbsent (the caller knows the key is not here:
  // inserted without a lookup). An insert may double the table.
  Status Write(uint64_t key, const char* row, uint64_t place);

  // Calls fn(key, row) for every record, in no particular order.
  template <typename Fn>
  Status ForEach(Fn fn);

  uint64_t rows() const { return rows_; }
  uint64_t generation() const { return generation_; }
  size_t row_bytes() const { return row_bytes_; }
  uint64_t file_bytes() const { return buckets_ * bucket_bytes_; }

 private:
  SpillFile(std::string path, int fd, size_t row_bytes, uint64_t buckets);
  // Finds key from its home bucket: *found with *place, or not found and *free_bucket is
  // the first bucket of its probe sequence with room. Leaves the records read in bucket_.
  Status Find(uint64_t key, bool* found, uint64_t* place, uint64_t* free_bucket);
  uint64_t FreeBucket(uint64_t key) const;
  // Appends a record to bucket b. REQUIRES: b has room; key is absent.
  Status InsertInto(uint64_t b, uint64_t key, const char* row);
  Status Grow();
  Status ForEachRecord(void* ctx, void (*fn)(void*, uint64_t, const char*));
  uint64_t Home(uint64_t key) const;
  size_t record_bytes() const { return 8 + row_bytes_; }
  uint64_t RecordOffset(uint64_t b, uint32_t i) const {
    return b * bucket_bytes_ + uint64_t{i} * record_bytes();
  }

  std::string path_;
  int fd_ = -1;
  size_t row_bytes_;
  uint32_t records_per_bucket_;
  size_t bucket_bytes_;
  uint64_t buckets_;
  std::vector<uint16_t> counts_;  // records in each bucket
  uint64_t rows_ = 0;
  uint64_t generation_ = 0;
  std::vector<char> bucket_;  // scratch: one bucket's records, or one record to write
};

template <typename Fn>
Status SpillFile::ForEach(Fn fn) {
  auto thunk = [](void* ctx, uint64_t key, const char* row) { (*static_cast<Fn*>(ctx))(key, row); };
  return ForEachRecord(&fn, thunk);
}

}  // namespace ps
