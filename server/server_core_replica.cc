// Replica snapshots of a ServerCore (server/replication.h): the bytes a server sends to
// make a new copy of its shards, and their loading on the other side.
//
// Layout (little-endian, this build's struct sizes: both sides run the same build, which
// registration checks through the protocol version):
//   "PSREPL01", server id (u32), worker slots W (u32), then per worker: clock (i64),
//   batches per clock (u32), left (u8), evicted (u8); job batches (i64), last checkpoint
//   clock (i64), checkpoint base (i64); remembered requests N (u64), then per request:
//   worker (i32), request id (u64), reply length (u32), reply bytes; tables T (u32), then
//   per table: id (u32), shard version (u64), stride (u32), rows (u64), then per row: key
//   (u64), stride floats; "PSREPEND".
#include <algorithm>
#include <cstring>

#include "server/server_core.h"

namespace ps {
namespace {

constexpr char kMagic[] = "PSREPL01";
constexpr char kEnd[] = "PSREPEND";
constexpr size_t kMagicBytes = 8;

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void Append(const void* data, size_t bytes) {
    out_->append(static_cast<const char*>(data), bytes);
  }
  template <typename T>
  void Put(const T& v) {
    Append(&v, sizeof(T));
  }

 private:
  std::string* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  Status Read(void* data, size_t bytes) {
    if (in_.size() - pos_ < bytes) {
      return InvalidArgument("replica snapshot truncated at byte " + std::to_string(pos_) + " of " +
                             std::to_string(in_.size()));
    }
    std::memcpy(data, in_.data() + pos_, bytes);
    pos_ += bytes;
    return Status::Ok();
  }
  template <typename T>
  Status Get(T* v) {
    return Read(v, sizeof(T));
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

// The per-worker part of a snapshot.
struct WorkerState {
  std::vector<int64_t> clocks;
  std::vector<uint32_t> batches_per_clock;
  std::vector<bool> left, evicted;
};

Status ReadWorkers(ByteReader& r, WorkerState* w) {
  uint32_t n = 0;
  PS_RETURN_IF_ERROR(r.Get(&n));
  if (n > static_cast<uint32_t>(ServerCore::kMaxWorkers)) {
    return InvalidArgument("replica snapshot has " + std::to_string(n) + " worker slots (at most " +
                           std::to_string(ServerCore::kMaxWorkers) + ")");
  }
  for (uint32_t i = 0; i < n; ++i) {
    int64_t clock = 0;
    uint32_t batches = 0;
    uint8_t left = 0, evicted = 0;
    PS_RETURN_IF_ERROR(r.Get(&clock));
    PS_RETURN_IF_ERROR(r.Get(&batches));
    PS_RETURN_IF_ERROR(r.Get(&left));
    PS_RETURN_IF_ERROR(r.Get(&evicted));
    w->clocks.push_back(clock);
    w->batches_per_clock.push_back(batches);
    w->left.push_back(left != 0);
    w->evicted.push_back(evicted != 0);
  }
  return Status::Ok();
}

struct Remembered {
  int worker;
  uint64_t request_id;
  std::string reply;
};

Status ReadRemembered(ByteReader& r, std::vector<Remembered>* out) {
  uint64_t n = 0;
  PS_RETURN_IF_ERROR(r.Get(&n));
  for (uint64_t i = 0; i < n; ++i) {
    Remembered m;
    uint32_t bytes = 0;
    PS_RETURN_IF_ERROR(r.Get(&m.worker));
    PS_RETURN_IF_ERROR(r.Get(&m.request_id));
    PS_RETURN_IF_ERROR(r.Get(&bytes));
    if (bytes > r.left()) return InvalidArgument("replica snapshot: a reply runs past its end");
    m.reply.resize(bytes);
    PS_RETURN_IF_ERROR(r.Read(m.reply.data(), bytes));
    out->push_back(std::move(m));
  }
  return Status::Ok();
}

// The magic at the start and the end marker (a snapshot cut short has none).
Status CheckFraming(std::string_view snapshot) {
  if (snapshot.size() < kMagicBytes || std::memcmp(snapshot.data(), kMagic, kMagicBytes) != 0) {
    return InvalidArgument("not a replica snapshot (bad magic)");
  }
  if (snapshot.size() < 2 * kMagicBytes ||
      std::memcmp(snapshot.data() + snapshot.size() - kMagicBytes, kEnd, kMagicBytes) != 0) {
    return InvalidArgument("replica snapshot of " + std::to_string(snapshot.size()) +
                           " bytes has no end marker (truncated?)");
  }
  return Status::Ok();
}

}  // namespace

Status ServerCore::SaveReplica(std::string* out) {
  // A --softsync sum still short of its c pushes is state the snapshot does not carry: it
  // is applied now, on this core, as a proportionally smaller update (server/softsync.h), so
  // that the copy starts from the same rows and versions and sums its next pushes in step.
  if (softsync_->enabled()) {
    for (uint32_t t = 0; t < softsync_->tables(); ++t) {
      PS_RETURN_IF_ERROR(ApplySoftSyncIfDue(t, INT64_MAX));
    }
  }
  out->clear();
  ByteWriter w(out);
  w.Append(kMagic, kMagicBytes);
  w.Put(static_cast<uint32_t>(server_id_));
  w.Put(static_cast<uint32_t>(clocks_.size()));
  for (size_t i = 0; i < clocks_.size(); ++i) {
    w.Put(clocks_[i]);
    w.Put(batches_per_clock_[i]);
    w.Put(static_cast<uint8_t>(left_[i] ? 1 : 0));
    w.Put(static_cast<uint8_t>(evicted_[i] ? 1 : 0));
  }
  w.Put(job_batches_);
  w.Put(last_checkpoint_clock_);
  w.Put(checkpoint_base_);
  w.Put(static_cast<uint64_t>(recent_pushes_.total()));
  uint64_t remembered = 0;
  recent_pushes_.ForEach([&](int worker, uint64_t id, const std::string& reply) {
    w.Put(static_cast<int32_t>(worker));
    w.Put(id);
    w.Put(static_cast<uint32_t>(reply.size()));
    w.Append(reply.data(), reply.size());
    ++remembered;
  });
  if (remembered != recent_pushes_.total()) {
    return Internal("replica snapshot: " + std::to_string(remembered) + " remembered requests, " +
                    std::to_string(recent_pushes_.total()) + " expected");
  }
  w.Put(static_cast<uint32_t>(tables_.size()));
  for (Table& t : tables_) {
    const uint32_t stride = static_cast<uint32_t>(t.stride());
    const uint64_t rows = t.rows_held();
    w.Put(t.spec().id);
    w.Put(shard_version_[t.spec().id]);
    w.Put(stride);
    w.Put(rows);
    uint64_t written = 0;
    auto put_row = [&](uint64_t key, const float* row) {
      w.Put(key);
      w.Append(row, stride * sizeof(float));
      ++written;
    };
    if (t.spec().dense()) {
      RowRange held = shard_map_.DenseRangeOf(t.spec().id, server_id_);
      for (uint64_t r = held.begin; r < held.end; ++r) put_row(r, t.DenseRow(r));
    } else {
      PS_RETURN_IF_ERROR(t.sparse_store()->ForEach(put_row));
    }
    if (written != rows) {
      return Internal("replica snapshot of table '" + t.spec().name + "' has " +
                      std::to_string(written) + " rows, expected " + std::to_string(rows));
    }
  }
  w.Append(kEnd, kMagicBytes);
  return Status::Ok();
}

Status ServerCore::LoadReplica(std::string_view snapshot) {
  PS_RETURN_IF_ERROR(CheckFraming(snapshot));
  ByteReader r(snapshot.substr(kMagicBytes));
  uint32_t sid = 0;
  PS_RETURN_IF_ERROR(r.Get(&sid));
  if (sid != static_cast<uint32_t>(server_id_)) {
    return InvalidArgument("replica snapshot of server " + std::to_string(sid) +
                           " sent to a copy of server " + std::to_string(server_id_));
  }
  WorkerState workers;
  PS_RETURN_IF_ERROR(ReadWorkers(r, &workers));
  int64_t job_batches = 0, last_checkpoint = 0, checkpoint_base = 0;
  PS_RETURN_IF_ERROR(r.Get(&job_batches));
  PS_RETURN_IF_ERROR(r.Get(&last_checkpoint));
  PS_RETURN_IF_ERROR(r.Get(&checkpoint_base));
  std::vector<Remembered> remembered;
  PS_RETURN_IF_ERROR(ReadRemembered(r, &remembered));
  // Rows go straight into the tables: the header checks above run first, and a snapshot
  // comes from a server of the same job and build (its end marker is there).
  PS_RETURN_IF_ERROR(ReadTables([&r](void* data, size_t bytes) { return r.Read(data, bytes); },
                                r.left(), "replica snapshot"));
  clocks_ = std::move(workers.clocks);
  batches_per_clock_ = std::move(workers.batches_per_clock);
  left_ = std::move(workers.left);
  evicted_ = std::move(workers.evicted);
  job_batches_ = job_batches;
  last_checkpoint_clock_ = last_checkpoint;
  checkpoint_base_ = checkpoint_base;
  for (Remembered& m : remembered)
    recent_pushes_.Insert(m.worker, m.request_id, std::move(m.reply));
  return Status::Ok();
}

size_t ServerCore::DropHeldPulls() {
  const size_t n = held_.size();
  held_.clear();
  return n;
}

}  // namespace ps
