#include "server/coord_journal.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <filesystem>

namespace ps {
namespace {

Status FromRocks(const rocksdb::Status& s, const std::string& path, const char* what) {
  if (s.ok()) return Status::Ok();
  return Internal(std::string("coordinator journal ") + path + ": " + what + ": " + s.ToString() +
                  " (a damaged journal cannot resume the job; start a new one in another run "
                  "directory, or remove " +
                  path + ")");
}

Result<std::unique_ptr<rocksdb::DB>> OpenDb(const std::string& path, bool create) {
  rocksdb::Options options;
  options.create_if_missing = create;
  options.error_if_exists = create;
  options.paranoid_checks = true;
  options.max_open_files = 16;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  PS_RETURN_IF_ERROR(FromRocks(rocksdb::DB::Open(options, path, &db), path, "cannot open"));
  return std::unique_ptr<rocksdb::DB>(db);
}

}  // namespace

CoordJournal::CoordJournal(std::string path, JournalOptions options,
                           std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), options_(options), db_(std::move(db)) {}

CoordJournal::~CoordJournal() = default;

Result<std::unique_ptr<CoordJournal>> CoordJournal::Create(const std::string& path,
                                                           JournalOptions options) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Unavailable("cannot remove the earlier journal " + path + ": " + ec.message());
  PS_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db, OpenDb(path, true));
  return std::unique_ptr<CoordJournal>(new CoordJournal(path, options, std::move(db)));
}

Result<std::unique_ptr<CoordJournal>> CoordJournal::Open(const std::string& path,
                                                         JournalOptions options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    return NotFound("no coordinator journal at " + path +
                    ": nothing to resume (a coordinator started without --resume begins the job)");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db, OpenDb(path, false));
  return std::unique_ptr<CoordJournal>(new CoordJournal(path, options, std::move(db)));
}

Status CoordJournal::Write(const Parts& parts) {
  rocksdb::WriteBatch batch;
  for (const auto& [key, value] : parts) {
    PS_RETURN_IF_ERROR(FromRocks(batch.Put(key, value.dump()), path_, "batch"));
  }
  rocksdb::WriteOptions w;
  w.sync = options_.sync;
  return FromRocks(db_->Write(w, &batch), path_, "write");
}

Result<CoordJournal::Parts> CoordJournal::ReadAll() const {
  Parts parts;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    nlohmann::json j = nlohmann::json::parse(it->value().ToString(), nullptr, false);
    if (j.is_discarded()) {
      return Internal("coordinator journal " + path_ + ": part \"" + it->key().ToString() +
                      "\" is not JSON (a damaged journal cannot resume the job)");
    }
    parts[it->key().ToString()] = std::move(j);
  }
  PS_RETURN_IF_ERROR(FromRocks(it->status(), path_, "read"));
  return parts;
}

}  // namespace ps
