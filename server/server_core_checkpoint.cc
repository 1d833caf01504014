// A ServerCore's state on disk: the checkpoints it writes and restores (server/checkpoint.h),
// becoming the replacement of a dead server from one, and safetensors exports
// (server/export.h).
#include <algorithm>
#include <climits>
#include <cstring>

#include "server/checkpoint.h"
#include "server/export.h"
#include "server/server_core.h"

namespace ps {

bool ServerCore::RequestCheckpointAt(int64_t clock) {
  if (clock <= last_checkpoint_clock_ || clock == checkpoint_requested_) return true;
  const int64_t now = MinLiveClock();
  if (now != INT64_MAX && now >= clock) {
    LOG(WARNING) << "server " << server_id_ << ": checkpoint clock " << clock
                 << " asked for at clock " << now << ": already passed";
    return false;
  }
  checkpoint_requested_ = clock;
  return true;
}

int64_t ServerCore::CheckpointClock() const {
  int64_t min = MinLiveClock();
  if (min != INT64_MAX) return min;
  int64_t max = 0;
  for (int64_t c : clocks_) max = std::max(max, c);
  return max;
}

Status ServerCore::WriteCheckpointTo(const std::string& dir, int64_t clock) {
  if (dir.empty()) return FailedPrecondition("no --checkpoint_dir");
  ApplyDueSoftSyncs(/*asynchronous_now=*/true);
  PS_ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Start(dir, clock, server_id_));
  PS_RETURN_IF_ERROR(w.Put(clock));
  PS_RETURN_IF_ERROR(w.Put(static_cast<uint32_t>(server_id_)));
  PS_RETURN_IF_ERROR(w.Put(static_cast<uint32_t>(config_.num_servers)));
  PS_RETURN_IF_ERROR(w.Put(static_cast<uint32_t>(config_.num_workers)));
  // The whole clock table: workers that joined the running job come after the job's own.
  PS_RETURN_IF_ERROR(w.Put(static_cast<uint32_t>(clocks_.size())));
  for (size_t i = 0; i < clocks_.size(); ++i) {
    PS_RETURN_IF_ERROR(w.Put(clocks_[i]));
    PS_RETURN_IF_ERROR(w.Put(static_cast<uint8_t>(left_[i] ? 1 : 0)));
  }
  PS_RETURN_IF_ERROR(w.Put(job_batches_));  // the schedule's progress
  PS_RETURN_IF_ERROR(w.Put(static_cast<uint32_t>(tables_.size())));
  for (Table& t : tables_) {
    const uint32_t stride = static_cast<uint32_t>(t.stride());
    const uint64_t rows = t.rows_held();
    PS_RETURN_IF_ERROR(w.Put(t.spec().id));
    PS_RETURN_IF_ERROR(w.Put(shard_version_[t.spec().id]));
    PS_RETURN_IF_ERROR(w.Put(stride));
    PS_RETURN_IF_ERROR(w.Put(rows));
    uint64_t written = 0;
    Status s;
    auto put_row = [&](uint64_t key, const float* row) {
      if (!s.ok()) return;
      s = w.Put(key);
      if (s.ok()) s = w.Append(row, stride * sizeof(float));
      ++written;
    };
    if (t.spec().dense()) {
      RowRange held = shard_map_.DenseRangeOf(t.spec().id, server_id_);
      for (uint64_t r = held.begin; r < held.end; ++r) put_row(r, t.DenseRow(r));
    } else {
      PS_RETURN_IF_ERROR(t.sparse_store()->ForEach(put_row));
    }
    PS_RETURN_IF_ERROR(s);
    if (written != rows) {
      return Internal("checkpoint of table '" + t.spec().name + "' wrote " +
                      std::to_string(written) + " rows, expected " + std::to_string(rows));
    }
  }
  PS_RETURN_IF_ERROR(w.Commit());
  ++stats_.checkpoints_written;
  last_checkpoint_clock_ = std::max(last_checkpoint_clock_, clock);
  pushes_at_checkpoint_ = stats_.pushes_applied;
  LOG(INFO) << "server " << server_id_ << ": checkpoint at clock " << clock << " -> " << w.path();
  return Status::Ok();
}

Status ServerCore::RestoreCheckpoint(const std::string& set_dir) {
  const std::string path = set_dir + "/server-" + std::to_string(server_id_) + ".ckpt";
  PS_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(path));
  int64_t clock = 0;
  uint32_t sid = 0, servers = 0, workers = 0;
  PS_RETURN_IF_ERROR(r.Get(&clock));
  PS_RETURN_IF_ERROR(r.Get(&sid));
  PS_RETURN_IF_ERROR(r.Get(&servers));
  PS_RETURN_IF_ERROR(r.Get(&workers));
  if (sid != static_cast<uint32_t>(server_id_) ||
      servers != static_cast<uint32_t>(config_.num_servers) ||
      workers != static_cast<uint32_t>(config_.num_workers)) {
    return InvalidArgument(path + " is server " + std::to_string(sid) + " of " +
                           std::to_string(servers) + " with " + std::to_string(workers) +
                           " workers; this job has " + std::to_string(config_.num_servers) +
                           " servers and " + std::to_string(config_.num_workers) + " workers");
  }
  PS_RETURN_IF_ERROR(RestoreClockTable(r, path, clock));
  PS_RETURN_IF_ERROR(
      ReadTables([&r](void* data, size_t bytes) { return r.Read(data, bytes); }, SIZE_MAX, path));
  last_checkpoint_clock_ = clock;
  stats_.restored_clock = clock;
  LOG(INFO) << "server " << server_id_ << ": restored " << path << " (clock " << clock << ")";
  return Status::Ok();
}

// Every worker of the new job resumes at the checkpoint's clock (the slowest live clock when
// it was written), as the coordinator tells them, whatever its entry holds: an entry ahead of
// it (SSP lets a worker run ahead) would let the first workers back move past that clock
// before the last one rejoins, and one behind it (a worker that died or left before the
// checkpoint, replaced by a joiner) would hold them all back. Workers that had joined the
// old job (ids from --num_workers on) are out of the table until they tick, as joiners are.
Status ServerCore::RestoreClockTable(CheckpointReader& r, const std::string& path, int64_t clock) {
  const size_t own = static_cast<size_t>(config_.num_workers);
  uint32_t entries = static_cast<uint32_t>(own);
  if (r.format() >= 2) PS_RETURN_IF_ERROR(r.Get(&entries));
  if (entries < own || entries > static_cast<uint32_t>(kMaxWorkers)) {
    return InvalidArgument(path + " has a clock table of " + std::to_string(entries) +
                           " workers; expected " + std::to_string(own) + " to " +
                           std::to_string(kMaxWorkers) + " (--num_workers and those that joined)");
  }
  clocks_.assign(entries, 0);
  batches_per_clock_.assign(entries, 1);
  left_.assign(entries, false);
  evicted_.assign(entries, false);
  int64_t sum = 0;
  for (size_t i = 0; i < entries; ++i) {
    uint8_t had_left = 0;
    PS_RETURN_IF_ERROR(r.Get(&clocks_[i]));
    PS_RETURN_IF_ERROR(r.Get(&had_left));
    sum += std::max<int64_t>(clocks_[i], 0);
    if (i < own) {
      clocks_[i] = clock;
    } else {
      left_[i] = true;
    }
  }
  job_batches_ = sum;  // format 1 kept no count: the clocks ticked, one batch each
  if (r.format() >= 2) PS_RETURN_IF_ERROR(r.Get(&job_batches_));
  return Status::Ok();
}

Status ServerCore::ReadTables(const std::function<Status(void*, size_t)>& read, size_t bytes_left,
                              const std::string& source) {
  auto get = [&read](auto* v) { return read(v, sizeof(*v)); };
  uint32_t tables = 0;
  PS_RETURN_IF_ERROR(get(&tables));
  if (tables != tables_.size()) {
    return InvalidArgument(source + " has " + std::to_string(tables) + " tables; the job has " +
                           std::to_string(tables_.size()));
  }
  std::vector<uint64_t> keys;
  std::vector<float> values;
  for (Table& t : tables_) {
    uint32_t id = 0, stride = 0;
    uint64_t version = 0, rows = 0;
    PS_RETURN_IF_ERROR(get(&id));
    PS_RETURN_IF_ERROR(get(&version));
    PS_RETURN_IF_ERROR(get(&stride));
    PS_RETURN_IF_ERROR(get(&rows));
    if (id != t.spec().id || stride != t.stride()) {
      return InvalidArgument(source + ": table " + std::to_string(id) + " has rows of " +
                             std::to_string(stride) + " floats; table '" + t.spec().name +
                             "' of this job has " + std::to_string(t.stride()) +
                             " (same model and optimizer?)");
    }
    if (rows > bytes_left / (sizeof(uint64_t) + stride * sizeof(float))) {
      return InvalidArgument(source + ": table '" + t.spec().name + "' claims " +
                             std::to_string(rows) + " rows, more than its bytes hold");
    }
    shard_version_[id] = version;
    const size_t batch = std::min<size_t>(t.max_fetch(), 4096);
    for (uint64_t done = 0; done < rows;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(batch, rows - done));
      keys.resize(n);
      values.resize(n * stride);
      for (size_t i = 0; i < n; ++i) {
        PS_RETURN_IF_ERROR(get(&keys[i]));
        PS_RETURN_IF_ERROR(read(values.data() + i * stride, stride * sizeof(float)));
      }
      PS_RETURN_IF_ERROR(t.CheckKeys(keys));
      PS_RETURN_IF_ERROR(t.Fetch(keys, /*for_write=*/true, &fetched_));
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(fetched_[i], values.data() + i * stride, stride * sizeof(float));
      }
      done += n;
    }
  }
  return Status::Ok();
}

void ServerCore::BecomeReplacement(const std::vector<int>& evicted, const std::vector<int>& idle,
                                   double restore_seconds) {
  replacement_ = true;
  restore_seconds_ = restore_seconds;
  checkpoint_base_ = last_checkpoint_clock_;
  pushes_at_checkpoint_ = stats_.pushes_applied;
  for (int w : evicted) {
    if (!CheckWorker(w, "evict").ok()) continue;  // out of range, or already evicted
    evicted_[static_cast<size_t>(w)] = true;
    left_[static_cast<size_t>(w)] = true;
    ++stats_.workers_evicted;
  }
  for (int w : idle) {
    if (CheckWorker(w, "leave").ok()) left_[static_cast<size_t>(w)] = true;
  }
}

Status ServerCore::ExportSafetensors(const std::string& path) {
  std::vector<SafeTensor> tensors;
  std::vector<std::pair<std::string, std::string>> meta = {
      {"server_id", std::to_string(server_id_)},
      {"num_servers", std::to_string(config_.num_servers)}};
  for (Table& t : tables_) {
    const size_t width = t.width();
    auto put_floats = [&](std::vector<char>& data, const float* row) {
      const char* p = reinterpret_cast<const char*>(row);
      data.insert(data.end(), p, p + width * sizeof(float));
    };
    if (t.spec().dense()) {
      RowRange held = shard_map_.DenseRangeOf(t.spec().id, server_id_);
      SafeTensor v{t.spec().name, "F32", {held.size(), width}, {}};
      v.data.reserve(held.size() * width * sizeof(float));
      for (uint64_t r = held.begin; r < held.end; ++r) put_floats(v.data, t.DenseRow(r));
      meta.emplace_back(t.spec().name + ".row_begin", std::to_string(held.begin));
      tensors.push_back(std::move(v));
      continue;
    }
    std::vector<std::pair<uint64_t, std::vector<float>>> rows;
    PS_RETURN_IF_ERROR(t.sparse_store()->ForEach([&](uint64_t key, const float* row) {
      rows.emplace_back(key, std::vector<float>(row, row + width));
    }));
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    SafeTensor ids{t.spec().name + ".ids", "U64", {rows.size()}, {}};
    SafeTensor values{t.spec().name + ".values", "F32", {rows.size(), width}, {}};
    for (const auto& [key, row] : rows) {
      const char* k = reinterpret_cast<const char*>(&key);
      ids.data.insert(ids.data.end(), k, k + sizeof(key));
      put_floats(values.data, row.data());
    }
    tensors.push_back(std::move(ids));
    tensors.push_back(std::move(values));
  }
  return WriteSafetensors(path, tensors, meta);
}

}  // namespace ps
