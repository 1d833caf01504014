// The rows of one sparse table on one server, in memory up to a budget and on local disk
// past it (the spill tier). A row is `stride` floats: the values, then the optimizer's state.
//
// Residency: rows live in fixed-size slots; when every slot is taken, a miss evicts a row
// chosen by CLOCK (second chance): each slot has a reference bit set on access, and the hand
// sweeps the slots, clearing set bits and evicting the first slot whose bit is clear. CLOCK
// rather than exact LRU because a hit costs one byte store instead of relinking a list node
// (pulls of hot rows dominate), it needs no per-row list pointers (16 bytes a row of
// budget), and it approximates LRU closely on skewed (Zipf-like) keys.
// A dirty row (created or pushed since it was last read from disk) is written back on
// eviction; a clean one is dropped (the disk already holds the same bytes).
//
// Two spill engines (RowStoreOptions::engine):
// - kFile: a SpillFile (server/spill_file.h), an on-disk hash table of fixed-size
//   records: a miss is one pread of its bucket, the write-back of a row read from the file
//   one pwrite at the place it came from; no index in memory, no compaction. Rows get 7/8 of
//   the budget (the rest: slack of the slot index).
// - kRocksDB (default: the product's spill tier is RocksDB, a kept library with tools to
//   inspect its files; kFile is the faster option, 2.4-3.7x on spilled pulls): the rows in
//   a RocksDB database. Write-backs of one Fetch go in one
//   WriteBatch; the cold rows it needs are read with one MultiGet. RocksDB is a cache here,
//   not a store: its contents die with the process. Hence: no WAL, no sync; bloom filters
//   (10 bits/key) because most misses of a growing sparse table are rows never seen; no
//   compression (float rows barely compress); index and filter blocks outside the block
//   cache (a small cache thrashed on them), and reads that do not fill the block cache (a
//   row read back moves into a slot; the OS page cache keeps the files warm); universal
//   compaction, because write-backs are spread over the whole key space and leveled
//   compaction rewrote most of L1 for every few flushed memtables. Budget split (B): 3/4 B
//   for resident rows, B/16 for RocksDB's block cache, B/16 for each of its two memtables;
//   the rest covers the table readers' index and filter blocks (~1.3 bytes a spilled row).
// A resident row costs stride * 4 + kRowOverheadBytes of the rows' share.
// Either engine's data lives in the OS page cache and on disk, outside the process's RSS.
//
// Thread model: not thread-safe; owned by the server's request loop, which fetches the rows
// of one request at a time. A pull that needs cold rows therefore waits for its reads
// before the next request is served.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace ps {

class SpillFile;

// Where spilled rows live (see the top of this file).
enum class SpillEngine { kFile, kRocksDB };

// "file" or "rocksdb".
Result<SpillEngine> ParseSpillEngine(const std::string& name);
const char* SpillEngineName(SpillEngine engine);

struct RowStoreOptions {
  // Bytes this table may hold in memory (rows, their index and RocksDB's caches); 0 keeps
  // every row in memory and opens no database.
  uint64_t memory_budget = 0;
  // Where the evicted rows live (created; anything there is deleted on open and on
  // close). Empty: a fresh directory under the system's temp directory.
  std::string spill_dir;
  // What holds them: RocksDB or a SpillFile (faster: see the top of this file).
  SpillEngine engine = SpillEngine::kRocksDB;
};

struct RowStoreStats {
  uint64_t rows = 0;            // distinct rows of the table here
  uint64_t rows_in_memory = 0;  // resident
  uint64_t rows_spilled = 0;    // rows - rows_in_memory: only in RocksDB
  uint64_t hits = 0;            // row accesses served from memory
  uint64_t misses = 0;          // row accesses read back from RocksDB
  uint64_t created = 0;         // rows made on first touch
  uint64_t evictions = 0;
  uint64_t write_backs = 0;    // evicted dirty rows written to disk
  uint64_t bytes_read = 0;     // row bytes read from disk
  uint64_t bytes_written = 0;  // row bytes written to disk
};

class RowStore {
 public:
  // Memory a resident row costs beyond its floats: the index entry (hash node and bucket)
  // and the slot's key, reference bit, dirty bit, pin mark and file place (~62 bytes).
  static constexpr uint64_t kRowOverheadBytes = 80;
  // A budget must hold at least this many rows.
  static constexpr uint64_t kMinRows = 1024;

  // Rows of `stride` floats a budget holds in memory with `engine`.
  static uint64_t RowsForBudget(uint64_t memory_budget, size_t stride, SpillEngine engine);
  // The smallest budget that holds `rows` such rows.
  static uint64_t BudgetForRows(uint64_t rows, size_t stride, SpillEngine engine);

  static Result<std::unique_ptr<RowStore>> Open(const TableSpec& spec, uint64_t seed, size_t stride,
                                                const RowStoreOptions& options);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // Most rows one Fetch may address (SIZE_MAX without a budget).
  size_t capacity() const { return capacity_; }
  bool spills() const { return db_ != nullptr || file_ != nullptr; }

  // Brings every key's row into memory (creating rows on first touch) and sets (*rows)[i]
  // to key i's storage (stride floats). The rows stay put until the next Fetch. With
  // `for_write` the rows are marked dirty. A key may repeat (same pointer).
  // REQUIRES: keys.size() <= capacity(). Errors are RocksDB's, as Internal.
  Status Fetch(std::span<const uint64_t> keys, bool for_write, std::vector<float*>* rows);

  // Calls fn(key, row) for every row, resident or spilled, in no particular order; a
  // spilled row's floats are valid only during its call. Does not change residency.
  template <typename Fn>
  Status ForEach(Fn fn);

  RowStoreStats stats() const;

 private:
  RowStore(const TableSpec& spec, uint64_t seed, size_t stride, size_t capacity);
  float* Slot(uint32_t s) {
    return blocks_[s / kRowsPerBlock].get() + (s % kRowsPerBlock) * stride_;
  }
  // A free slot: a new one while below capacity, else one evicted by CLOCK (its row, when
  // dirty, written to the file or appended to the write batch).
  Result<uint32_t> TakeSlot(rocksdb::WriteBatch* batch);
  // Bring missing_ (sorted, unique) into slots.
  Status FetchMissingFromFile();
  Status FetchMissingFromRocks();
  // Forgets the file places of resident rows when the file has moved its records.
  void SyncPlaces();
  Status ForEachSpilled(void* fn_ctx, void (*fn)(void*, uint64_t, const float*));

  TableSpec spec_;
  uint64_t seed_;
  size_t stride_;
  size_t capacity_;
  std::string dir_;
  rocksdb::DB* db_ = nullptr;
  std::unique_ptr<SpillFile> file_;

  static constexpr size_t kRowsPerBlock = 4096;
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::unordered_map<uint64_t, uint32_t> index_;  // key -> slot
  std::vector<uint64_t> slot_key_;
  std::vector<uint8_t> slot_ref_;
  std::vector<uint8_t> slot_dirty_;
  std::vector<uint32_t> slot_pin_;  // == epoch_: addressed by the current Fetch
  // Where the row was read from in file_ (generation place_generation_); kNowhere: unknown.
  std::vector<uint64_t> slot_place_;
  uint64_t place_generation_ = 0;
  uint32_t epoch_ = 0;
  size_t hand_ = 0;
  uint64_t rows_on_disk_only_ = 0;
  RowStoreStats stats_;
  // Scratch reused across Fetches.
  std::vector<int64_t> slot_of_;
  std::vector<uint64_t> missing_;
};

template <typename Fn>
Status RowStore::ForEach(Fn fn) {
  for (const auto& [key, slot] : index_) fn(key, static_cast<const float*>(Slot(slot)));
  if (!spills()) return Status::Ok();
  auto thunk = [](void* ctx, uint64_t key, const float* row) {
    (*static_cast<Fn*>(ctx))(key, row);
  };
  return ForEachSpilled(&fn, thunk);
}

}  // namespace ps
