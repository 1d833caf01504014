#include "server/server_core.h"

#include <kj/exception.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

namespace ps {

Result<std::unique_ptr<ServerCore>> ServerCore::Create(const JobConfig& config, int server_id) {
  if (server_id < 0 || server_id >= config.num_servers) {
    return InvalidArgument("server id " + std::to_string(server_id) + " is outside [0, " +
                           std::to_string(config.num_servers) + ")");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, MakeOptimizer(config));
  PS_ASSIGN_OR_RETURN(LrPolicy lr, LrPolicy::Create(config));
  return std::unique_ptr<ServerCore>(new ServerCore(config, server_id, std::move(opt), lr));
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
      left_(static_cast<size_t>(config.num_workers), false) {
  for (const TableSpec& t : config_.table_specs) {
    RowRange held = t.dense() ? shard_map_.DenseRangeOf(t.id, server_id_) : RowRange{};
    tables_.emplace_back(t, held, config_.seed, optimizer_->StateFloats(t.width));
    table_staleness_.push_back(config_.StalenessOf(t));
  }
  stats_.staleness_histogram.assign(kStalenessBuckets, 0);
}

ServerStats ServerCore::stats() const {
  ServerStats s = stats_;
  s.rows_held = 0;
  for (const Table& t : tables_) s.rows_held += t.rows_held();
  return s;
}

Result<std::vector<float>> ServerCore::ReadRow(uint32_t table, uint64_t key) {
  if (table >= tables_.size()) return NotFound("no table " + std::to_string(table));
  Table& t = tables_[table];
  uint64_t k[1] = {key};
  PS_RETURN_IF_ERROR(t.CheckKeys(k));
  const float* row = t.Row(key);
  return std::vector<float>(row, row + t.width());
}

Status ServerCore::CheckClock(int64_t clock, const char* what) {
  // Bounded so that clock arithmetic (lags, clock x workers) cannot overflow.
  if (clock < 0 || clock > kMaxClock) {
    return InvalidArgument(std::string(what) + " has clock " + std::to_string(clock) +
                           ", outside [0, 2^40]");
  }
  return Status::Ok();
}

int64_t ServerCore::MinLiveClock(int* slowest) const {
  int64_t min = INT64_MAX;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (left_[w] || clocks_[w] >= min) continue;
    min = clocks_[w];
    if (slowest != nullptr) *slowest = static_cast<int>(w);
  }
  return min;
}

void ServerCore::RecordStaleness(uint64_t staleness) {
  ++stats_.staleness_histogram[std::min<uint64_t>(staleness, kStalenessBuckets - 1)];
  stats_.staleness_sum += staleness;
  stats_.staleness_max = std::max(stats_.staleness_max, staleness);
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
  PS_ASSIGN_OR_RETURN(std::span<const float> grads, FrameAs<float>(request[a.next_frame]));
  if (grads.size() != a.rows * width) {
    return InvalidArgument("push to table '" + a.table->spec().name + "' carries " +
                           std::to_string(grads.size()) + " floats, expected " +
                           std::to_string(a.rows) + " rows x " + std::to_string(width) + " = " +
                           std::to_string(a.rows * width));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return InvalidArgument("push to table '" + a.table->spec().name +
                             "' has a non-finite gradient (" + std::to_string(grads[i]) +
                             ") at float " + std::to_string(i) + "; nothing was applied");
    }
    // A finite but huge gradient would overflow momentum or the weights to infinity.
    if (std::fabs(grads[i]) > kMaxAbsGradient) {
      return InvalidArgument("push to table '" + a.table->spec().name + "' has a gradient of " +
                             std::to_string(grads[i]) + " at float " + std::to_string(i) +
                             ", beyond the limit of +-1e18; nothing was applied");
    }
  }
  const uint32_t table_id = push.getTableId();
  const uint64_t version = shard_version_[table_id];
  const uint64_t pulled = push.getPulledVersion();
  if (pulled > version) {
    return InvalidArgument("push claims shard version " + std::to_string(pulled) + " of table '" +
                           a.table->spec().name + "', but it is only at " +
                           std::to_string(version));
  }
  const int64_t clock = push.getClock();
  PS_RETURN_IF_ERROR(CheckClock(clock, "push"));
  const uint64_t staleness = version - pulled;

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
  // Checked in full; now apply.
  // The schedule counts minibatch updates across the job: each of the W workers makes one
  // per clock, so it reads the same whatever W is.
  const int64_t iteration = clock * config_.num_workers;
  const float lr = static_cast<float>(lr_policy_.Rate(iteration, static_cast<int64_t>(staleness)));
  const size_t state_floats = a.table->stride() - width;
  for (size_t i = 0; i < a.rows; ++i) {
    uint64_t key = a.is_range ? a.range.begin + i : a.keys[i];
    float* row = a.table->Row(key);
    optimizer_->Apply(std::span<float>(row, width), std::span<float>(row + width, state_floats),
                      grads.subspan(i * width, width), lr);
  }
  ++shard_version_[table_id];
  ++stats_.pushes_applied;
  stats_.bytes_pushed += grads.size_bytes();
  RecordStaleness(staleness);
  reply.setRowsApplied(a.rows);
  reply.setLearningRate(lr);
  out.push_back(EncodeFrame(b));
  return out;
}

Result<Frames> ServerCore::ServePull(wire::Header::Reader h, const Frames& request,
                                     std::chrono::microseconds held) {
  auto pull = h.getBody().getPull();
  PS_ASSIGN_OR_RETURN(Addressed a, Address(pull.getTableId(), pull.getKeys(), request));
  if (request.size() != a.next_frame) {
    return InvalidArgument("pull has " + std::to_string(request.size()) + " frames, expected " +
                           std::to_string(a.next_frame));
  }
  const size_t width = a.table->width();
  zmq::message_t values(a.rows * width * sizeof(float));
  float* dst = static_cast<float*>(values.data());
  for (size_t i = 0; i < a.rows; ++i) {
    uint64_t key = a.is_range ? a.range.begin + i : a.keys[i];
    std::memcpy(dst + i * width, a.table->Row(key), width * sizeof(float));
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
  if (table_id < tables_.size() && table_staleness_[table_id] >= 0) {
    if (worker < 0 || worker >= config_.num_workers) {
      return InvalidArgument("pull from sender " + std::to_string(worker) +
                             ", which is not a worker of this job (ids 0.." +
                             std::to_string(config_.num_workers - 1) + ")");
    }
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
  return ServePull(h, request, std::chrono::microseconds(0));
}

void ServerCore::ReleaseHeldPulls(std::vector<Outgoing>* out) {
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
      reply = ServePull(it->header.get(), it->request, held);
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

void ServerCore::ExpireHeldPulls(Clock::time_point now, std::vector<Outgoing>* out) {
  const auto limit = std::chrono::duration<double>(config_.staleness_wait_seconds);
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->since < limit) {
      ++it;
      continue;
    }
    int slowest = -1;
    int64_t min_clock = MinLiveClock(&slowest);
    Status s = DeadlineExceeded(
        "pull of worker " + std::to_string(it->worker) + " at clock " + std::to_string(it->clock) +
        " waited " + std::to_string(config_.staleness_wait_seconds) + " s for worker " +
        std::to_string(slowest) + ", still at clock " + std::to_string(min_clock) +
        " (the staleness bound needs " + std::to_string(it->needed) + ")");
    out->push_back(Outgoing{it->peer, ErrorReply(it->header.get().getRequestId(), server_id_, s)});
    it = held_.erase(it);
  }
}

Result<Frames> ServerCore::HandleClock(wire::Header::Reader h, std::vector<Outgoing>* out) {
  const int worker = h.getSenderId();
  if (worker < 0 || worker >= config_.num_workers) {
    return InvalidArgument("clock tick from sender " + std::to_string(worker) +
                           ", which is not a worker of this job");
  }
  auto tick = h.getBody().getClock();
  const size_t w = static_cast<size_t>(worker);
  if (tick.getLeave()) {
    left_[w] = true;
  } else {
    PS_RETURN_IF_ERROR(CheckClock(tick.getClock(), "clock tick"));
    if (left_[w]) {
      // Rejoining (after waiting for data): start at the slowest live clock, so that
      // nobody waits on clocks this worker skipped while it was out.
      const int64_t min_clock = MinLiveClock();
      left_[w] = false;
      if (min_clock != INT64_MAX) clocks_[w] = std::max(clocks_[w], min_clock);
    }
    // Clocks only move forward; a repeated tick changes nothing.
    clocks_[w] = std::max(clocks_[w], tick.getClock());
  }
  // The tick's reply goes first: it answers the request that released the others.
  capnp::MallocMessageBuilder b;
  const int64_t min_clock = MinLiveClock();
  NewHeader(b, h.getRequestId(), server_id_)
      .getBody()
      .initClockReply()
      .setMinClock(min_clock == INT64_MAX ? clocks_[w] : min_clock);
  Frames reply;
  reply.push_back(EncodeFrame(b));
  std::vector<Outgoing> released;
  ReleaseHeldPulls(&released);
  for (Outgoing& o : released) out->push_back(std::move(o));
  return reply;
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
  // Send the histogram up to its last non-empty bucket.
  size_t n = st.staleness_histogram.size();
  while (n > 0 && st.staleness_histogram[n - 1] == 0) --n;
  auto hist = s.initStalenessHistogram(static_cast<unsigned>(n));
  for (size_t i = 0; i < n; ++i) hist.set(static_cast<unsigned>(i), st.staleness_histogram[i]);
  Frames out;
  out.push_back(EncodeFrame(b));
  return out;
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
        reply = HandlePush(h, request);
        break;
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
      case wire::Header::Body::HEARTBEAT: {
        capnp::MallocMessageBuilder b;
        NewHeader(b, request_id, server_id_).getBody().setHeartbeatReply();
        Frames f;
        f.push_back(EncodeFrame(b));
        reply = std::move(f);
        break;
      }
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
