// The coordinator's journal: the job's state, kept durably in RocksDB (by default
// <run_dir>/coordinator.db) as events happen, so that a coordinator restarted with the same
// run directory resumes the job (server/coordinator.h, "Restart").
//
// Layout: one key per part of the state ("meta", "members", "leases", ...), each one JSON
// document. Write replaces the parts it is given in one atomic batch (synced to disk unless
// options.sync is off), so that a reader sees every part as of one write or another, never a
// half-written update. What each part holds is the coordinator's business
// (server/coord_resume.h); the journal only keeps them.
//
// Errors: opening a journal that does not exist is NotFound; a database RocksDB cannot open
// (corrupt files, not a database) or a part that is not JSON is an Internal error that names
// the path and says what to do.
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace rocksdb {
class DB;
}

namespace ps {

struct JournalOptions {
  // Each write waits until the batch is on disk (fsync): a write that returned survives a
  // machine crash, not only a process crash. Off: the OS decides (tests).
  bool sync = true;
};

class CoordJournal {
 public:
  using Parts = std::map<std::string, nlohmann::json>;

  // A new, empty journal at `path` (a directory); an earlier one there is removed.
  static Result<std::unique_ptr<CoordJournal>> Create(const std::string& path,
                                                      JournalOptions options = {});
  // The journal at `path`, as a restarted coordinator reads it.
  static Result<std::unique_ptr<CoordJournal>> Open(const std::string& path,
                                                    JournalOptions options = {});
  ~CoordJournal();
  CoordJournal(const CoordJournal&) = delete;
  CoordJournal& operator=(const CoordJournal&) = delete;

  // Replaces the given parts, all of them or none.
  Status Write(const Parts& parts);
  // Every part written so far.
  Result<Parts> ReadAll() const;
  const std::string& path() const { return path_; }

 private:
  CoordJournal(std::string path, JournalOptions options, std::unique_ptr<rocksdb::DB> db);

  std::string path_;
  JournalOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace ps
