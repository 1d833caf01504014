#include "server/server_core.h"

#include <kj/exception.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>

#include "common/gradient_check.h"
#include "server/checkpoint.h"
#include "server/export.h"

namespace ps {

uint64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

Result<std::unique_ptr<ServerCore>> ServerCore::Create(const JobConfig& config, int server_id,
                                                       const StoreOptions& store) {
  if (server_id < 0 || server_id >= config.num_servers) {
    return InvalidArgument("server id " + std::to_string(server_id) + " is outside [0, " +
                           std::to_string(config.num_servers) + ")");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, MakeOptimizer(config));
  PS_ASSIGN_OR_RETURN(LrPolicy lr, LrPolicy::Create(config));
  PS_ASSIGN_OR_RETURN(int threads, ResolveServerThreads(store.server_threads));
  std::unique_ptr<ServerCore> core(new ServerCore(config, server_id, std::move(opt), lr));
  PS_RETURN_IF_ERROR(core->CreateTables(store));
  if (threads > 1) core->pool_ = std::make_unique<ApplyPool>(threads);
  core->parallel_min_bytes_ = store.parallel_min_bytes;
  if (!config.restore.empty()) {
    std::string set = config.restore;
    if (set == "latest") {
      if (config.checkpoint_dir.empty()) {
        return InvalidArgument("--restore=latest needs --checkpoint_dir");
      }
      PS_ASSIGN_OR_RETURN(set, LatestCompleteCheckpoint(config.checkpoint_dir, config.num_servers));
    }
    PS_RETURN_IF_ERROR(core->RestoreCheckpoint(set).WithContext("restore from " + set));
  }
  return core;
}

Status ServerCore::CreateTables(const StoreOptions& store) {
  const int64_t budget =
      store.memory_budget >= 0 ? store.memory_budget : static_cast<int64_t>(config_.memory_budget);
  // Dense tables stay resident; sparse ones share what the budget leaves.
  uint64_t dense_bytes = 0;
  size_t sparse_tables = 0;
  for (const TableSpec& t : config_.table_specs) {
    if (t.dense()) {
      dense_bytes += shard_map_.DenseRangeOf(t.id, server_id_).size() *
                     (t.width + optimizer_->StateFloats(t.width)) * sizeof(float);
    } else {
      ++sparse_tables;
    }
  }
  uint64_t sparse_share = 0;
  if (budget > 0 && sparse_tables > 0) {
    if (dense_bytes >= static_cast<uint64_t>(budget)) {
      return InvalidArgument("--memory_budget=" + std::to_string(budget) + " bytes of server " +
                             std::to_string(server_id_) +
                             " leaves nothing for its sparse tables: " +
                             "its dense rows alone take " + std::to_string(dense_bytes) + " bytes");
    }
    sparse_share = (static_cast<uint64_t>(budget) - dense_bytes) / sparse_tables;
  }
  for (const TableSpec& t : config_.table_specs) {
    RowRange held = t.dense() ? shard_map_.DenseRangeOf(t.id, server_id_) : RowRange{};
    RowStoreOptions ro;
    ro.memory_budget = sparse_share;
    ro.engine = store.spill_engine;
    if (!store.spill_dir.empty()) {
      ro.spill_dir = store.spill_dir + "/server-" + std::to_string(server_id_) + "-table-" +
                     std::to_string(t.id);
    }
    PS_ASSIGN_OR_RETURN(Table table,
                        Table::Create(t, held, config_.seed, optimizer_->StateFloats(t.width), ro));
    tables_.push_back(std::move(table));
    table_staleness_.push_back(config_.StalenessOf(t));
    recent_staleness_.push_back(0);
  }
  softsync_ = std::make_unique<SoftSync>(config_.BatchesPerUpdate(), config_.table_specs,
                                         shard_map_, server_id_, table_staleness_);
  return Status::Ok();
}

Status ServerCore::ApplySoftSyncIfDue(uint32_t table_id, int64_t min_live_clock) {
  if (!softsync_->Due(table_id, min_live_clock)) return Status::Ok();
  SoftSync::Pending sum = softsync_->TakeMean(table_id);
  Addressed a;
  a.table = &tables_[table_id];
  a.is_range = true;
  a.range = sum.held;
  a.rows = sum.held.size();
  const size_t width = a.table->width();
  const size_t state_floats = a.table->stride() - width;
  const int64_t iteration = config_.ScheduleIteration(JobSteps());
  // --staleness_lr weighted each push as it joined the sum.
  const float lr = static_cast<float>(lr_policy_.ScheduleRate(iteration));
  PS_RETURN_IF_ERROR(ParallelForEachRow(a, /*for_write=*/true, [&](size_t i, float* row) {
    if (sum.counts[i] == 0) return;
    optimizer_->Apply(std::span<float>(row, width), std::span<float>(row + width, state_floats),
                      sum.mean.subspan(i * width, width), lr);
  }));
  softsync_->Clear(table_id);
  ++shard_version_[table_id];
  return Status::Ok();
}

void ServerCore::ApplyDueSoftSyncs(bool asynchronous_now) {
  if (!softsync_->enabled()) return;
  const int64_t min_clock = MinLiveClock();
  for (uint32_t t = 0; t < softsync_->tables(); ++t) {
    // An ASP table's sum has no clock rule (at 8 ASP workers its early shares made a
    // gradient's mean staleness 1.04 updates, against 0.79 without): before a checkpoint
    // it is applied whole.
    const bool now = asynchronous_now && softsync_->sums(t) && !softsync_->clock_rule(t);
    // Dense rows live in memory: applying a sum cannot fail on the spill tier.
    Status s = ApplySoftSyncIfDue(t, now ? INT64_MAX : min_clock);
    if (!s.ok()) LOG(ERROR) << "server " << server_id_ << ": " << s.ToString();
  }
}

template <typename Fn>
Status ServerCore::ForEachRow(const Addressed& a, bool for_write, Fn fn) {
  if (a.is_range) {
    for (size_t i = 0; i < a.rows; ++i) fn(i, a.table->DenseRow(a.range.begin + i));
    return Status::Ok();
  }
  const size_t step = std::min(a.table->max_fetch(), a.rows);
  for (size_t first = 0; first < a.rows; first += step) {
    const size_t n = std::min(step, a.rows - first);
    PS_RETURN_IF_ERROR(a.table->Fetch(a.keys.subspan(first, n), for_write, &fetched_));
    for (size_t i = 0; i < n; ++i) fn(first + i, fetched_[i]);
  }
  return Status::Ok();
}

template <typename Fn>
Status ServerCore::ParallelForEachRow(const Addressed& a, bool for_write, Fn fn) {
  const size_t parts = pool_ ? pool_->threads() : 1;
  const uint64_t width_bytes = a.table->width() * sizeof(float);
  const auto small = [&](size_t rows) { return rows * width_bytes < parallel_min_bytes_; };
  if (parts == 1 || small(a.rows)) return ForEachRow(a, for_write, fn);
  if (a.table->sparse_store() == nullptr) {
    // Fixed blocks of this server's slice: held row r belongs to part r * parts / R.
    const RowRange held = shard_map_.DenseRangeOf(a.table->spec().id, server_id_);
    const uint64_t R = held.size();
    if (a.is_range) {
      pool_->Run([&](size_t part) {
        // Held rows r with floor(r * parts / R) == part: [ceil(part R / parts), ...).
        const uint64_t lo = held.begin + (part * R + parts - 1) / parts;
        const uint64_t hi = held.begin + ((part + 1) * R + parts - 1) / parts;
        for (uint64_t row = std::max(lo, a.range.begin); row < std::min(hi, a.range.end); ++row) {
          fn(static_cast<size_t>(row - a.range.begin), a.table->DenseRow(row));
        }
      });
    } else {
      pool_->Run([&](size_t part) {
        for (size_t i = 0; i < a.rows; ++i) {
          const uint64_t r = a.keys[i] - held.begin;
          if (static_cast<size_t>((static_cast<unsigned __int128>(r) * parts) / R) != part)
            continue;
          fn(i, a.table->DenseRow(a.keys[i]));
        }
      });
    }
    return Status::Ok();
  }
  // The store is not thread-safe: batches are fetched here, their rows worked on by the
  // pool, and the next Fetch (which may evict them) waits for that.
  const size_t step = std::min(a.table->max_fetch(), a.rows);
  for (size_t first = 0; first < a.rows; first += step) {
    const size_t n = std::min(step, a.rows - first);
    const std::span<const uint64_t> keys = a.keys.subspan(first, n);
    PS_RETURN_IF_ERROR(a.table->Fetch(keys, for_write, &fetched_));
    if (small(n)) {
      for (size_t i = 0; i < n; ++i) fn(first + i, fetched_[i]);
      continue;
    }
    pool_->Run([&](size_t part) {
      for (size_t i = 0; i < n; ++i) {
        if (SparseKeyPart(keys[i], parts) == part) fn(first + i, fetched_[i]);
      }
    });
  }
  return Status::Ok();
}

ServerCore::ServerCore(const JobConfig& config, int server_id, std::unique_ptr<Optimizer> optimizer,
                       LrPolicy lr_policy)
    : config_(config),
      server_id_(server_id),
      shard_map_(config.table_specs, config.num_servers),
      optimizer_(std::move(optimizer)),
      lr_policy_(lr_policy),
      shard_version_(config.table_specs.size(), 0),
      clocks_(static_cast<size_t>(config.num_workers), 0),
      batches_per_clock_(static_cast<size_t>(config.num_workers), 1),
      left_(static_cast<size_t>(config.num_workers), false),
      evicted_(static_cast<size_t>(config.num_workers), false) {
  stats_.staleness_histogram.assign(kStalenessBuckets, 0);
}

ServerStats ServerCore::stats() const {
  ServerStats s = stats_;
  s.rows_held = 0;
  for (const Table& t : tables_) {
    s.rows_held += t.rows_held();
    if (t.sparse_store() == nullptr) continue;
    RowStoreStats r = t.sparse_store()->stats();
    s.rows_in_memory += r.rows_in_memory;
    s.rows_spilled += r.rows_spilled;
    s.cache_hits += r.hits;
    s.cache_misses += r.misses;
    s.spill_bytes_read += r.bytes_read;
    s.spill_bytes_written += r.bytes_written;
  }
  s.peak_rss_bytes = PeakRssBytes();
  return s;
}

std::vector<ServerCore::HeldPullInfo> ServerCore::HeldPulls(Clock::time_point now) const {
  int slowest = -1;
  MinLiveClock(&slowest);
  std::vector<HeldPullInfo> out;
  out.reserve(held_.size());
  for (const HeldPull& p : held_) {
    out.push_back({p.worker, slowest, std::chrono::duration<double>(now - p.since).count()});
  }
  return out;
}

size_t ServerCore::shards_held() const {
  size_t n = 0;
  for (const Table& t : tables_) n += t.rows_held() > 0 || !t.spec().dense() ? 1 : 0;
  return n;
}

Result<std::vector<float>> ServerCore::ReadRow(uint32_t table, uint64_t key) {
  if (table >= tables_.size()) return NotFound("no table " + std::to_string(table));
  Table& t = tables_[table];
  uint64_t k[1] = {key};
  PS_RETURN_IF_ERROR(t.CheckKeys(k));
  std::vector<float*> rows;
  PS_RETURN_IF_ERROR(t.Fetch(k, /*for_write=*/false, &rows));
  return std::vector<float>(rows[0], rows[0] + t.width());
}

Status ServerCore::CheckClock(int64_t clock, const char* what) {
  // Bounded so that clock arithmetic (lags, clock x workers) cannot overflow.
  if (clock < 0 || clock > kMaxClock) {
    return InvalidArgument(std::string(what) + " has clock " + std::to_string(clock) +
                           ", outside [0, 2^40]");
  }
  return Status::Ok();
}

Status ServerCore::CheckWorker(int worker, const char* what) {
  if (worker < 0 || worker >= kMaxWorkers) {
    return InvalidArgument(std::string(what) + " from sender " + std::to_string(worker) +
                           ", which is not a worker id (expected 0.." +
                           std::to_string(kMaxWorkers - 1) + ")");
  }
  const size_t w = static_cast<size_t>(worker);
  if (w >= clocks_.size()) {
    // A worker that joined the running job: out of the clock table until its first tick.
    clocks_.resize(w + 1, 0);
    batches_per_clock_.resize(w + 1, 1);
    left_.resize(w + 1, true);
    evicted_.resize(w + 1, false);
  }
  if (evicted_[w]) {
    return FailedPrecondition(std::string(what) + " from worker " + std::to_string(worker) +
                              ", which the coordinator declared dead: its requests are refused");
  }
  return Status::Ok();
}

void ServerCore::RecordStaleness(uint32_t table_id, uint64_t staleness) {
  ++stats_.staleness_histogram[std::min<uint64_t>(staleness, kStalenessBuckets - 1)];
  stats_.staleness_sum += staleness;
  stats_.staleness_max = std::max(stats_.staleness_max, staleness);
  // Over about the last 64 pushes: several updates' worth at any worker count the default
  // sums (8 workers: 8 updates), yet it follows a job whose workers come and go.
  constexpr double kWeight = 1.0 / 64;
  double& recent = recent_staleness_[table_id];
  recent += kWeight * (static_cast<double>(staleness) - recent);
}

double ServerCore::LookaheadUpdates(uint32_t table_id) const {
  if (config_.pull_lookahead <= 0 || !optimizer_->HasVelocity()) return 0;
  return config_.pull_lookahead * recent_staleness_[table_id];
}

Result<ServerCore::Addressed> ServerCore::Address(uint32_t table_id, wire::Keys::Reader keys,
                                                  const Frames& request) {
  if (table_id >= tables_.size()) {
    return NotFound("table id " + std::to_string(table_id) + " is unknown: the job has " +
                    std::to_string(tables_.size()) + " tables");
  }
  Addressed a;
  a.table = &tables_[table_id];
  // Refuses what no reply buffer should be made for, before the table checks walk a list.
  auto check_size = [&](uint64_t rows) -> Status {
    const uint64_t width = a.table->width();
    if (rows > limits_.max_rows ||
        (width > 0 && rows > limits_.max_value_bytes / (width * sizeof(float)))) {
      return InvalidArgument(
          "request addresses " + std::to_string(rows) + " rows of width " + std::to_string(width) +
          "; at most " + std::to_string(limits_.max_rows) + " rows and " +
          std::to_string(limits_.max_value_bytes) + " bytes of values per request: split it");
    }
    return Status::Ok();
  };
  switch (keys.which()) {
    case wire::Keys::RANGE: {
      a.is_range = true;
      a.range = RowRange{keys.getRange().getBegin(), keys.getRange().getEnd()};
      if (a.range.end > a.range.begin) PS_RETURN_IF_ERROR(check_size(a.range.size()));
      PS_RETURN_IF_ERROR(a.table->CheckRange(a.range));
      a.rows = a.range.size();
      a.next_frame = 1;
      return a;
    }
    case wire::Keys::LIST_COUNT: {
      uint64_t count = keys.getListCount();
      PS_RETURN_IF_ERROR(check_size(count));
      if (request.size() < 2)
        return InvalidArgument("request names a key list but has no keys frame");
      PS_ASSIGN_OR_RETURN(std::span<const uint64_t> list, FrameAs<uint64_t>(request[1]));
      if (list.size() != count) {
        return InvalidArgument("keys frame holds " + std::to_string(list.size()) +
                               " keys but the header says " + std::to_string(count));
      }
      PS_RETURN_IF_ERROR(a.table->CheckKeys(list));
      a.keys = list;
      a.rows = list.size();
      a.next_frame = 2;
      return a;
    }
  }
  return InvalidArgument("request has an unknown key form");
}

Result<Frames> ServerCore::HandlePush(wire::Header::Reader h, const Frames& request) {
  auto push = h.getBody().getPush();
  PS_ASSIGN_OR_RETURN(Addressed a, Address(push.getTableId(), push.getKeys(), request));
  if (request.size() != a.next_frame + 1) {
    return InvalidArgument("push has " + std::to_string(request.size()) + " frames, expected " +
                           std::to_string(a.next_frame + 1));
  }
  const size_t width = a.table->width();
  // 16-bit gradients (--wire_dtype) are widened here: everything below sees fp32.
  PS_ASSIGN_OR_RETURN(WireDtype dtype, WireDtypeFromWire(push.getGradDtype()));
  const zmq::message_t& values = request[a.next_frame];
  std::vector<float> widened;
  std::span<const float> grads;
  if (dtype == WireDtype::kFp32) {
    PS_ASSIGN_OR_RETURN(grads, FrameAs<float>(values));
  } else {
    if (values.size() != a.rows * width * WireDtypeBytes(dtype)) {
      return InvalidArgument("push to table '" + a.table->spec().name + "' carries " +
                             std::to_string(values.size()) + " bytes of " + WireDtypeName(dtype) +
                             ", expected " + std::to_string(a.rows) + " rows x " +
                             std::to_string(width) + " x 2");
    }
    widened.resize(a.rows * width);
    DecodeFloats(values.data(), dtype, widened);
    grads = widened;
  }
  if (grads.size() != a.rows * width) {
    return InvalidArgument("push to table '" + a.table->spec().name + "' carries " +
                           std::to_string(grads.size()) + " floats, expected " +
                           std::to_string(a.rows) + " rows x " + std::to_string(width) + " = " +
                           std::to_string(a.rows * width));
  }
  if (Status s = CheckGradients(grads); !s.ok()) {
    return InvalidArgument("push to table '" + a.table->spec().name + "' has " + s.message() +
                           "; nothing was applied");
  }
  const uint32_t table_id = push.getTableId();
  const uint64_t version = shard_version_[table_id];
  uint64_t pulled = push.getPulledVersion();
  // A replacement restored an older version than the one the workers pulled from the dead
  // server: such a gradient's staleness is not known; counted as fresh.
  if (pulled > version && replacement_) pulled = version;
  if (pulled > version) {
    return InvalidArgument("push claims shard version " + std::to_string(pulled) + " of table '" +
                           a.table->spec().name + "', but it is only at " +
                           std::to_string(version));
  }
  const int64_t clock = push.getClock();
  PS_RETURN_IF_ERROR(CheckClock(clock, "push"));
  const uint64_t staleness = version - pulled;
  return ApplyPush(h, CheckedPush{a, grads, staleness, values.size()});
}

Result<Frames> ServerCore::ApplyPush(wire::Header::Reader h, const CheckedPush& checked) {
  auto push = h.getBody().getPush();
  const Addressed& a = checked.rows;
  const size_t width = a.table->width();
  const uint64_t staleness = checked.staleness;
  capnp::MallocMessageBuilder b;
  auto reply = NewHeader(b, h.getRequestId(), server_id_).getBody().initPushReply();
  reply.setStaleness(staleness);
  Frames out;
  if (config_.max_grad_staleness >= 0 &&
      staleness > static_cast<uint64_t>(config_.max_grad_staleness)) {
    // Counted, answered, not applied: the worker did nothing wrong.
    ++stats_.pushes_dropped;
    reply.setDropped(true);
    out.push_back(EncodeFrame(b));
    return out;
  }
  // The schedule counts the steps the whole job has taken (JobConfig::ScheduleIteration),
  // so it reads the same whatever the number of workers and however far apart their clocks.
  const int64_t iteration = config_.ScheduleIteration(JobSteps());
  const float lr = static_cast<float>(lr_policy_.Rate(iteration, static_cast<int64_t>(staleness)));
  const uint32_t table_id = push.getTableId();
  if (softsync_->sums(table_id) && a.is_range) {
    // --softsync: into the table's sum, applied as one update when due (server/softsync.h),
    // which then moves the version.
    softsync_->Add(table_id, a.range, checked.grads, push.getClock(), !push.getMoreChunks(),
                   BatchesPerClock(h.getSenderId()),
                   static_cast<float>(lr_policy_.StalenessWeight(static_cast<int64_t>(staleness))));
    PS_RETURN_IF_ERROR(ApplySoftSyncIfDue(table_id, MinLiveClock()));
  } else {
    const size_t state_floats = a.table->stride() - width;
    // An error here is the spill tier's (disk); rows before it are applied.
    // Apply is const and keeps no scratch: safe on several threads for different rows.
    PS_RETURN_IF_ERROR(ParallelForEachRow(a, /*for_write=*/true, [&](size_t i, float* row) {
      optimizer_->Apply(std::span<float>(row, width), std::span<float>(row + width, state_floats),
                        checked.grads.subspan(i * width, width), lr);
    }));
    if (!push.getMoreChunks()) ++shard_version_[table_id];
  }
  // A chunk of a larger push (moreChunks) moves the version and the counts only with the
  // push's last chunk: staleness counts logical pushes, not chunks.
  if (!push.getMoreChunks()) {
    ++stats_.pushes_applied;
    RecordStaleness(table_id, staleness);
  }
  stats_.bytes_pushed += checked.wire_bytes;
  reply.setRowsApplied(a.rows);
  reply.setLearningRate(lr);
  out.push_back(EncodeFrame(b));
  return out;
}

Result<Frames> ServerCore::ServePull(const std::string& peer, wire::Header::Reader h,
                                     const Frames& request, std::chrono::microseconds held) {
  auto pull = h.getBody().getPull();
  PS_ASSIGN_OR_RETURN(Addressed a, Address(pull.getTableId(), pull.getKeys(), request));
  if (request.size() != a.next_frame) {
    return InvalidArgument("pull has " + std::to_string(request.size()) + " frames, expected " +
                           std::to_string(a.next_frame));
  }
  PS_ASSIGN_OR_RETURN(WireDtype dtype, WireDtypeFromWire(pull.getValueDtype()));
  const size_t width = a.table->width();
  const size_t bytes = a.rows * width * WireDtypeBytes(dtype);
  zmq::message_t values = frame_allocator_ ? frame_allocator_(peer, bytes) : zmq::message_t(bytes);
  // Each row goes straight into the reply frame, narrowed there for a 16-bit pull (a
  // worker's --pull_dtype): no second copy of the rows.
  char* dst = static_cast<char*>(values.data());
  const size_t row_bytes = width * WireDtypeBytes(dtype);
  const double ahead = LookaheadUpdates(pull.getTableId());
  if (ahead > 0) {
    // --pull_lookahead: where the rows' velocity carries them over `ahead` updates at the
    // rate the next update will take.
    const float lr =
        static_cast<float>(lr_policy_.ScheduleRate(config_.ScheduleIteration(JobSteps())));
    const float step = optimizer_->LookaheadStep(lr, ahead);
    const size_t state_floats = a.table->stride() - width;
    PS_RETURN_IF_ERROR(ParallelForEachRow(a, /*for_write=*/false, [&](size_t i, float* row) {
      thread_local std::vector<float> narrowed;  // a 16-bit pull's row before narrowing
      if (dtype != WireDtype::kFp32) narrowed.resize(width);
      std::span<float> out =
          dtype == WireDtype::kFp32
              ? std::span<float>(reinterpret_cast<float*>(dst + i * row_bytes), width)
              : std::span<float>(narrowed);
      optimizer_->Extrapolate(std::span<const float>(row, width),
                              std::span<const float>(row + width, state_floats), step, out);
      if (dtype != WireDtype::kFp32) EncodeFloats(narrowed, dtype, dst + i * row_bytes);
    }));
  } else {
    PS_RETURN_IF_ERROR(ParallelForEachRow(a, /*for_write=*/false, [&](size_t i, float* row) {
      EncodeFloats(std::span<const float>(row, width), dtype, dst + i * row_bytes);
    }));
  }
  const int64_t min_clock = MinLiveClock();
  const int64_t lag = min_clock == INT64_MAX ? 0 : pull.getClock() - min_clock;
  stats_.max_clock_lag = std::max(stats_.max_clock_lag, lag);
  ++stats_.pulls_served;
  stats_.bytes_pulled += values.size();

  capnp::MallocMessageBuilder b;
  auto reply = NewHeader(b, h.getRequestId(), server_id_).getBody().initPullReply();
  reply.setRows(a.rows);
  reply.setVersion(shard_version_[pull.getTableId()]);
  reply.setClockLag(lag);
  reply.setHeldMicros(static_cast<uint64_t>(held.count()));
  reply.setValueDtype(static_cast<uint8_t>(dtype));
  Frames out;
  out.push_back(EncodeFrame(b));
  out.push_back(std::move(values));
  return out;
}

Result<Frames> ServerCore::HandlePull(const std::string& peer, DecodedHeader& decoded,
                                      Frames& request) {
  wire::Header::Reader h = decoded.get();
  auto pull = h.getBody().getPull();
  const uint32_t table_id = pull.getTableId();
  const int worker = h.getSenderId();
  const int64_t clock = pull.getClock();
  PS_RETURN_IF_ERROR(CheckClock(clock, "pull"));
  if (worker >= 0 || (table_id < tables_.size() && table_staleness_[table_id] >= 0)) {
    PS_RETURN_IF_ERROR(CheckWorker(worker, "pull"));
  }
  if (table_id < tables_.size() && table_staleness_[table_id] >= 0) {
    const int64_t needed = clock - table_staleness_[table_id];
    if (MinLiveClock() < needed) {
      // Check the request now, so that a bad one is refused at once rather than held.
      PS_RETURN_IF_ERROR(Address(table_id, pull.getKeys(), request).status());
      ++stats_.pulls_held;
      held_.push_back(HeldPull{peer, std::move(request), std::move(decoded), worker, clock, needed,
                               Clock::now()});
      return Frames();
    }
  }
  return ServePull(peer, h, request, std::chrono::microseconds(0));
}

void ServerCore::ReleaseHeldPulls(std::vector<Outgoing>* out) {
  // The clock table changed: sums holding pushes the released pulls must see go first.
  ApplyDueSoftSyncs();
  const int64_t min_clock = MinLiveClock();
  const auto now = Clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (min_clock < it->needed) {
      ++it;
      continue;
    }
    auto held = std::chrono::duration_cast<std::chrono::microseconds>(now - it->since);
    Result<Frames> reply = Internal("unreachable");
    try {
      reply = ServePull(it->peer, it->header.get(), it->request, held);
    } catch (const kj::Exception& e) {
      reply = InvalidArgument(std::string("malformed header: ") + e.getDescription().cStr());
    }
    if (!reply.ok()) {
      ++stats_.bad_requests;
      reply = ErrorReply(it->header.get().getRequestId(), server_id_, reply.status());
    }
    out->push_back(Outgoing{it->peer, std::move(reply).value()});
    it = held_.erase(it);
  }
}

Frames ServerCore::ShutdownReply(uint64_t request_id) {
  capnp::MallocMessageBuilder b;
  auto s = NewHeader(b, request_id, server_id_).getBody().initShutdownReply();
  ServerStats st = stats();
  s.setPushesApplied(st.pushes_applied);
  s.setPushesRejected(st.pushes_rejected);
  s.setPushesDropped(st.pushes_dropped);
  s.setPullsServed(st.pulls_served);
  s.setPullsHeld(st.pulls_held);
  s.setBytesPushed(st.bytes_pushed);
  s.setBytesPulled(st.bytes_pulled);
  s.setRowsHeld(st.rows_held);
  s.setMaxClockLag(st.max_clock_lag);
  s.setStalenessSum(st.staleness_sum);
  s.setStalenessMax(st.staleness_max);
  s.setRowsInMemory(st.rows_in_memory);
  s.setRowsSpilled(st.rows_spilled);
  s.setCacheHits(st.cache_hits);
  s.setCacheMisses(st.cache_misses);
  s.setSpillBytesRead(st.spill_bytes_read);
  s.setSpillBytesWritten(st.spill_bytes_written);
  s.setPeakRssBytes(st.peak_rss_bytes);
  s.setPushesDuplicate(st.pushes_duplicate);
  s.setWorkersEvicted(st.workers_evicted);
  // Send the histogram up to its last non-empty bucket.
  size_t n = st.staleness_histogram.size();
  while (n > 0 && st.staleness_histogram[n - 1] == 0) --n;
  auto hist = s.initStalenessHistogram(static_cast<unsigned>(n));
  for (size_t i = 0; i < n; ++i) hist.set(static_cast<unsigned>(i), st.staleness_histogram[i]);
  Frames out;
  out.push_back(EncodeFrame(b));
  return out;
}

Result<Frames> ServerCore::HandlePushOnce(wire::Header::Reader h, const Frames& request) {
  const int worker = h.getSenderId();
  const uint64_t request_id = h.getRequestId();
  // Pushes from outside the job's workers (tests, tools: sender -1) are not tracked.
  if (worker >= 0) {
    PS_RETURN_IF_ERROR(CheckWorker(worker, "push"));
    if (const std::string* first = recent_pushes_.Find(worker, request_id)) {
      // A retry of a push applied already: the same answer, applied once.
      ++stats_.pushes_duplicate;
      Frames again;
      again.push_back(CopyFrame(first->data(), first->size()));
      return again;
    }
  }
  Result<Frames> reply = HandlePush(h, request);
  if (reply.ok() && worker >= 0) {
    const zmq::message_t& f = reply->front();
    recent_pushes_.Insert(worker, request_id,
                          std::string(static_cast<const char*>(f.data()), f.size()));
  }
  return reply;
}

Frames ServerCore::HeartbeatReply(uint64_t request_id) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, request_id, server_id_).getBody().setHeartbeatReply();
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

void ServerCore::Handle(const std::string& peer, Frames& request, std::vector<Outgoing>* out,
                        After* after) {
  *after = After::kContinue;
  auto reply_error = [&](uint64_t request_id, const Status& s) {
    ++stats_.bad_requests;
    out->push_back(Outgoing{peer, ErrorReply(request_id, server_id_, s)});
  };
  if (request.empty()) return reply_error(0, InvalidArgument("empty message"));
  AlignPayloadFrames(request);
  Result<DecodedHeader> decoded = DecodedHeader::Decode(request[0]);
  if (!decoded.ok()) return reply_error(0, decoded.status());
  wire::Header::Reader h = decoded->get();
  uint64_t request_id = 0;
  bool is_push = false;
  try {
    request_id = h.getRequestId();
    Status version = CheckProtocolVersion(h);
    if (!version.ok()) return reply_error(request_id, version);
    Result<Frames> reply = Internal("no reply");
    switch (h.getBody().which()) {
      case wire::Header::Body::PUSH:
        is_push = true;
        reply = HandlePushOnce(h, request);
        break;
      case wire::Header::Body::EVICT: {
        std::vector<Outgoing> released;
        reply = HandleEvict(h, &released);
        if (reply.ok()) {
          out->push_back(Outgoing{peer, std::move(reply).value()});
          for (Outgoing& o : released) out->push_back(std::move(o));
          return;
        }
        break;
      }
      case wire::Header::Body::PULL:
        reply = HandlePull(peer, decoded.value(), request);
        if (reply.ok() && reply->empty()) return;  // held by the staleness bound
        break;
      case wire::Header::Body::CLOCK: {
        std::vector<Outgoing> released;
        reply = HandleClock(h, &released);
        if (reply.ok()) {
          out->push_back(Outgoing{peer, std::move(reply).value()});
          for (Outgoing& o : released) out->push_back(std::move(o));
          return;
        }
        break;
      }
      case wire::Header::Body::HEARTBEAT:
        reply = HeartbeatReply(request_id);
        break;
      case wire::Header::Body::SHUTDOWN:
        *after = After::kShutdown;
        reply = ShutdownReply(request_id);
        break;
      default:
        reply = InvalidArgument("a server does not handle this message type (" +
                                std::to_string(static_cast<int>(h.getBody().which())) + ")");
    }
    if (reply.ok()) {
      out->push_back(Outgoing{peer, std::move(reply).value()});
      return;
    }
    if (is_push) ++stats_.pushes_rejected;
    return reply_error(request_id, reply.status());
  } catch (const kj::Exception& e) {
    // A malformed pointer deep in the header: Cap'n Proto validates lazily.
    if (is_push) ++stats_.pushes_rejected;
    return reply_error(
        request_id, InvalidArgument(std::string("malformed header: ") + e.getDescription().cStr()));
  }
}

Frames ServerCore::HandleOne(Frames& request, After* after) {
  std::vector<Outgoing> out;
  After ignored;
  Handle("", request, &out, after != nullptr ? after : &ignored);
  CHECK_EQ(out.size(), 1u) << "HandleOne: the request was held or released others";
  return std::move(out[0].frames);
}

}  // namespace ps
