#include "server/row_store.h"

#include <glog/logging.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/row_init.h"
#include "server/spill_file.h"

namespace ps {
namespace {

// Big-endian, so that RocksDB's order is the keys' order (MultiGet with sorted input).
void EncodeKey(uint64_t key, char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(key & 0xff);
    key >>= 8;
  }
}
uint64_t DecodeKey(const char in[8]) {
  uint64_t k = 0;
  for (int i = 0; i < 8; ++i) k = (k << 8) | static_cast<uint8_t>(in[i]);
  return k;
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  return Internal("spill tier: " + what + ": " + s.ToString());
}

const rocksdb::WriteOptions& SpillWriteOptions() {
  static const rocksdb::WriteOptions o = [] {
    rocksdb::WriteOptions w;
    w.disableWAL = true;  // a cache: nothing to recover after a crash
    w.sync = false;
    return w;
  }();
  return o;
}

// The spill tier's directory: `spill_dir`, created if missing, or (empty) a fresh one under
// the system's temp directory.
Result<std::string> MakeSpillDir(const std::string& spill_dir) {
  std::error_code ec;
  if (spill_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path(ec) / "ps-spill-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Internal("spill tier: cannot create a directory like " + tmpl + ": " +
                      std::strerror(errno));
    }
    return tmpl;
  }
  std::filesystem::create_directories(spill_dir, ec);
  if (ec) {
    return InvalidArgument("--spill_dir=" + spill_dir + " cannot be created: " + ec.message());
  }
  return spill_dir;
}

// The share of the budget that resident rows get, as numerator / 8.
uint64_t RowEighths(SpillEngine engine) { return engine == SpillEngine::kFile ? 7 : 6; }

}  // namespace

Result<SpillEngine> ParseSpillEngine(const std::string& name) {
  if (name == "file") return SpillEngine::kFile;
  if (name == "rocksdb") return SpillEngine::kRocksDB;
  return InvalidArgument("spill engine '" + name + "': expected file or rocksdb");
}

const char* SpillEngineName(SpillEngine engine) {
  return engine == SpillEngine::kFile ? "file" : "rocksdb";
}

uint64_t RowStore::RowsForBudget(uint64_t memory_budget, size_t stride, SpillEngine engine) {
  return memory_budget / 8 * RowEighths(engine) / (stride * sizeof(float) + kRowOverheadBytes);
}

uint64_t RowStore::BudgetForRows(uint64_t rows, size_t stride, SpillEngine engine) {
  const uint64_t need = rows * (stride * sizeof(float) + kRowOverheadBytes);
  return (need + RowEighths(engine) - 1) / RowEighths(engine) * 8 + 64;
}

RowStore::RowStore(const TableSpec& spec, uint64_t seed, size_t stride, size_t capacity)
    : spec_(spec), seed_(seed), stride_(stride), capacity_(capacity) {}

Result<std::unique_ptr<RowStore>> RowStore::Open(const TableSpec& spec, uint64_t seed,
                                                 size_t stride, const RowStoreOptions& options) {
  if (options.memory_budget == 0) {
    return std::unique_ptr<RowStore>(new RowStore(spec, seed, stride, SIZE_MAX));
  }
  const uint64_t row_bytes = stride * sizeof(float) + kRowOverheadBytes;
  const uint64_t capacity = RowsForBudget(options.memory_budget, stride, options.engine);
  if (capacity < kMinRows) {
    return InvalidArgument("a memory budget of " + std::to_string(options.memory_budget) +
                           " bytes for table '" + spec.name + "' holds only " +
                           std::to_string(capacity) + " rows of " + std::to_string(row_bytes) +
                           " bytes; at least " + std::to_string(kMinRows) + " are needed (" +
                           std::to_string(BudgetForRows(kMinRows, stride, options.engine)) +
                           " bytes)");
  }
  if (capacity >= UINT32_MAX) return InvalidArgument("memory budget too large for one table");
  std::unique_ptr<RowStore> store(new RowStore(spec, seed, stride, capacity));

  PS_ASSIGN_OR_RETURN(store->dir_, MakeSpillDir(options.spill_dir));

  if (options.engine == SpillEngine::kFile) {
    // Sized for 8x the resident rows before it first doubles (a sparse file: the unused
    // part takes no disk).
    PS_ASSIGN_OR_RETURN(store->file_, SpillFile::Create(store->dir_ + "/rows",
                                                        stride * sizeof(float), capacity * 8));
    LOG(INFO) << "table '" << spec.name << "': memory budget " << options.memory_budget
              << " bytes holds " << capacity << " rows; colder rows spill to " << store->dir_
              << "/rows";
    return store;
  }

  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_cache = rocksdb::NewLRUCache(std::max<uint64_t>(options.memory_budget / 16, 1 << 20));
  // Index and filter blocks stay with their table readers, outside the block cache: in a
  // small cache they thrashed (each miss re-read the filters of every L0 file, 90 us a row
  // in spill_bench). They cost ~1.3 bytes per spilled row (10-bit bloom + index).
  t.cache_index_and_filter_blocks = false;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  o.write_buffer_size = std::max<uint64_t>(options.memory_budget / 16, 1 << 20);
  o.max_write_buffer_number = 2;
  // Rows that are looked up right after being written back are found by the memtable's
  // own bloom filter instead of a skiplist search.
  o.memtable_whole_key_filtering = true;
  o.memtable_prefix_bloom_size_ratio = 0.02;
  o.compression = rocksdb::kNoCompression;
  o.max_background_jobs = 2;
  o.avoid_flush_during_shutdown = true;
  o.max_open_files = 512;
  // Universal (tiered) compaction: every eviction of a pushed row is a write, and its keys
  // are spread over the whole id space, so leveled compaction rewrote most of L1 for each
  // few L0 files (spill_bench: 0.9-1.6 GB compacted and level0 slowdown stalls for 0.14 GB
  // written back). Universal compacted 0.67-0.73 GB with no stalls; its extra sorted runs
  // cost a lookup only a bloom probe each.
  o.compaction_style = rocksdb::kCompactionStyleUniversal;
  // A cache from an earlier process is stale: start empty.
  (void)rocksdb::DestroyDB(store->dir_, o);
  rocksdb::DB* db = nullptr;
  PS_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(o, store->dir_, &db), "open " + store->dir_));
  store->db_ = db;
  LOG(INFO) << "table '" << spec.name << "': memory budget " << options.memory_budget
            << " bytes holds " << capacity << " rows; colder rows spill to " << store->dir_;
  return store;
}

RowStore::~RowStore() {
  if (!spills()) return;
  file_.reset();
  if (db_ != nullptr) {
    (void)db_->Close();
    delete db_;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void RowStore::SyncPlaces() {
  if (place_generation_ == file_->generation()) return;
  for (uint64_t& p : slot_place_) {
    if (p != SpillFile::kAbsent) p = SpillFile::kNowhere;  // absent stays absent
  }
  place_generation_ = file_->generation();
}

Result<uint32_t> RowStore::TakeSlot(rocksdb::WriteBatch* batch) {
  const size_t used = slot_key_.size();
  if (used < capacity_) {
    if (used % kRowsPerBlock == 0)
      blocks_.push_back(std::make_unique<float[]>(kRowsPerBlock * stride_));
    slot_key_.push_back(0);
    slot_ref_.push_back(0);
    slot_dirty_.push_back(0);
    slot_pin_.push_back(0);
    if (file_ != nullptr) slot_place_.push_back(SpillFile::kNowhere);
    return static_cast<uint32_t>(used);
  }
  // Two sweeps clear every reference bit; a third finds a victim unless all are pinned.
  for (size_t step = 0; step < 3 * capacity_; ++step) {
    const uint32_t s = static_cast<uint32_t>(hand_);
    hand_ = hand_ + 1 == capacity_ ? 0 : hand_ + 1;
    if (slot_pin_[s] == epoch_) continue;
    if (slot_ref_[s]) {
      slot_ref_[s] = 0;
      continue;
    }
    if (slot_dirty_[s]) {
      const size_t bytes = stride_ * sizeof(float);
      if (file_ != nullptr) {
        SyncPlaces();
        PS_RETURN_IF_ERROR(
            file_->Write(slot_key_[s], reinterpret_cast<char*>(Slot(s)), slot_place_[s]));
      } else {
        char k[8];
        EncodeKey(slot_key_[s], k);
        rocksdb::Status st = batch->Put(rocksdb::Slice(k, 8),
                                        rocksdb::Slice(reinterpret_cast<char*>(Slot(s)), bytes));
        PS_RETURN_IF_ERROR(FromRocks(st, "write batch"));
      }
      ++stats_.write_backs;
      stats_.bytes_written += bytes;
    }
    index_.erase(slot_key_[s]);
    ++rows_on_disk_only_;
    ++stats_.evictions;
    return s;
  }
  return Internal("spill tier: every resident row is pinned by the current request");
}

Status RowStore::Fetch(std::span<const uint64_t> keys, bool for_write, std::vector<float*>* rows) {
  CHECK_LE(keys.size(), capacity_) << "RowStore::Fetch: more keys than the budget holds";
  ++epoch_;
  if (epoch_ == 0) {  // wrapped: no slot may look pinned by a stale mark
    std::fill(slot_pin_.begin(), slot_pin_.end(), 0);
    epoch_ = 1;
  }
  rows->resize(keys.size());
  slot_of_.assign(keys.size(), -1);
  missing_.clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end()) {
      missing_.push_back(keys[i]);
      continue;
    }
    const uint32_t s = it->second;
    slot_of_[i] = s;
    slot_ref_[s] = 1;
    slot_pin_[s] = epoch_;
    ++stats_.hits;
  }
  if (!missing_.empty()) {
    std::sort(missing_.begin(), missing_.end());
    missing_.erase(std::unique(missing_.begin(), missing_.end()), missing_.end());
    PS_RETURN_IF_ERROR(file_ != nullptr || db_ == nullptr ? FetchMissingFromFile()
                                                          : FetchMissingFromRocks());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    uint32_t s = slot_of_[i] >= 0 ? static_cast<uint32_t>(slot_of_[i]) : index_.at(keys[i]);
    if (for_write) slot_dirty_[s] = 1;
    (*rows)[i] = Slot(s);
  }
  return Status::Ok();
}

// Without a budget (no file) every missing row is new. Each miss is read straight into its
// slot after the victim's write-back, so no row is copied twice.
Status RowStore::FetchMissingFromFile() {
  const size_t bytes = stride_ * sizeof(float);
  for (uint64_t key : missing_) {
    PS_ASSIGN_OR_RETURN(uint32_t s, TakeSlot(nullptr));
    float* row = Slot(s);
    bool found = false;
    uint64_t place = SpillFile::kAbsent;
    if (file_ != nullptr && rows_on_disk_only_ > 0) {
      PS_RETURN_IF_ERROR(file_->Read(key, reinterpret_cast<char*>(row), &found, &place));
      if (!found) place = SpillFile::kAbsent;
    }
    if (found) {
      slot_dirty_[s] = 0;  // the file holds the same bytes
      --rows_on_disk_only_;
      ++stats_.misses;
      stats_.bytes_read += bytes;
    } else {
      std::fill(row, row + stride_, 0.0f);
      InitializeRow(spec_, seed_, key, std::span<float>(row, spec_.width));
      slot_dirty_[s] = 1;  // not on disk yet
      ++stats_.created;
    }
    if (file_ != nullptr) {
      SyncPlaces();
      slot_place_[s] = place;
    }
    slot_key_[s] = key;
    slot_ref_[s] = 1;
    slot_pin_[s] = epoch_;
    index_.emplace(key, s);
  }
  return Status::Ok();
}

Status RowStore::FetchMissingFromRocks() {
  const size_t n = missing_.size();
  std::vector<char> key_bytes(n * 8);
  std::vector<rocksdb::Slice> slices(n);
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  if (db_ != nullptr && rows_on_disk_only_ > 0) {
    for (size_t j = 0; j < n; ++j) {
      EncodeKey(missing_[j], &key_bytes[j * 8]);
      slices[j] = rocksdb::Slice(&key_bytes[j * 8], 8);
    }
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;  // the row moves into a slot: caching its block too is a copy
    db_->MultiGet(ro, db_->DefaultColumnFamily(), n, slices.data(), values.data(), statuses.data(),
                  /*sorted_input=*/true);
  } else {
    for (auto& s : statuses) s = rocksdb::Status::NotFound();
  }
  rocksdb::WriteBatch batch;
  const size_t bytes = stride_ * sizeof(float);
  for (size_t j = 0; j < n; ++j) {
    PS_ASSIGN_OR_RETURN(uint32_t s, TakeSlot(&batch));
    float* row = Slot(s);
    if (statuses[j].ok()) {
      if (values[j].size() != bytes) {
        return Internal("spill tier: row " + std::to_string(missing_[j]) + " of table '" +
                        spec_.name + "' has " + std::to_string(values[j].size()) +
                        " bytes on disk, expected " + std::to_string(bytes));
      }
      std::memcpy(row, values[j].data(), bytes);
      slot_dirty_[s] = 0;  // RocksDB holds the same bytes
      --rows_on_disk_only_;
      ++stats_.misses;
      stats_.bytes_read += bytes;
    } else if (statuses[j].IsNotFound()) {
      std::fill(row, row + stride_, 0.0f);
      InitializeRow(spec_, seed_, missing_[j], std::span<float>(row, spec_.width));
      slot_dirty_[s] = 1;  // not on disk yet
      ++stats_.created;
    } else {
      return FromRocks(statuses[j], "read of row " + std::to_string(missing_[j]));
    }
    slot_key_[s] = missing_[j];
    slot_ref_[s] = 1;
    slot_pin_[s] = epoch_;
    index_.emplace(missing_[j], s);
  }
  if (batch.Count() > 0) {
    PS_RETURN_IF_ERROR(FromRocks(db_->Write(SpillWriteOptions(), &batch), "write-back"));
  }
  return Status::Ok();
}

Status RowStore::ForEachSpilled(void* ctx, void (*fn)(void*, uint64_t, const float*)) {
  if (file_ != nullptr) {
    std::vector<float> row(stride_);
    return file_->ForEach([&](uint64_t key, const char* bytes) {
      if (index_.count(key) != 0) return;  // the resident copy is the current one
      std::memcpy(row.data(), bytes, row.size() * sizeof(float));
      fn(ctx, key, row.data());
    });
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const size_t bytes = stride_ * sizeof(float);
  std::vector<float> row(stride_);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() != 8 || it->value().size() != bytes) {
      return Internal("spill tier: a malformed entry in " + dir_);
    }
    uint64_t key = DecodeKey(it->key().data());
    if (index_.count(key) != 0) continue;  // the resident copy is the current one
    std::memcpy(row.data(), it->value().data(), bytes);
    fn(ctx, key, row.data());
  }
  return FromRocks(it->status(), "scan");
}

RowStoreStats RowStore::stats() const {
  RowStoreStats s = stats_;
  s.rows_in_memory = index_.size();
  s.rows_spilled = rows_on_disk_only_;
  s.rows = s.rows_in_memory + s.rows_spilled;
  return s;
}

}  // namespace ps
