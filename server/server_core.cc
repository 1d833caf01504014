#include "server/server_core.h"

#include <cmath>
#include <cstring>

#include <kj/exception.h>

namespace ps {

Result<std::unique_ptr<ServerCore>> ServerCore::Create(const JobConfig& config, int server_id) {
  if (server_id < 0 || server_id >= config.num_servers) {
    return InvalidArgument("server id " + std::to_string(server_id) + " is outside [0, " +
                           std::to_string(config.num_servers) + ")");
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, MakeOptimizer(config));
  return std::unique_ptr<ServerCore>(new ServerCore(config, server_id, std::move(opt)));
}

ServerCore::ServerCore(const JobConfig& config, int server_id,
                       std::unique_ptr<Optimizer> optimizer)
    : config_(config),
      server_id_(server_id),
      shard_map_(config.table_specs, config.num_servers),
      optimizer_(std::move(optimizer)) {
  for (const TableSpec& t : config_.table_specs) {
    RowRange held = t.dense() ? shard_map_.DenseRangeOf(t.id, server_id_) : RowRange{};
    tables_.emplace_back(t, held, config_.seed, optimizer_->StateFloats(t.width));
  }
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

Result<ServerCore::Addressed> ServerCore::Address(uint32_t table_id, wire::Keys::Reader keys,
                                                  const Frames& request) {
  if (table_id >= tables_.size()) {
    return NotFound("table id " + std::to_string(table_id) + " is unknown: the job has " +
                    std::to_string(tables_.size()) + " tables");
  }
  Addressed a;
  a.table = &tables_[table_id];
  switch (keys.which()) {
    case wire::Keys::RANGE: {
      a.is_range = true;
      a.range = RowRange{keys.getRange().getBegin(), keys.getRange().getEnd()};
      PS_RETURN_IF_ERROR(a.table->CheckRange(a.range));
      a.rows = a.range.size();
      a.next_frame = 1;
      return a;
    }
    case wire::Keys::LIST_COUNT: {
      uint64_t count = keys.getListCount();
      if (request.size() < 2) return InvalidArgument("request names a key list but has no keys frame");
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
  }
  // Checked in full; now apply.
  const size_t state_floats = a.table->stride() - width;
  const float lr = static_cast<float>(config_.base_lr);
  for (size_t i = 0; i < a.rows; ++i) {
    uint64_t key = a.is_range ? a.range.begin + i : a.keys[i];
    float* row = a.table->Row(key);
    optimizer_->Apply(std::span<float>(row, width), std::span<float>(row + width, state_floats),
                      grads.subspan(i * width, width), lr);
  }
  ++stats_.pushes_applied;
  stats_.bytes_pushed += grads.size_bytes();

  capnp::MallocMessageBuilder b;
  auto reply = NewHeader(b, h.getRequestId(), server_id_);
  reply.getBody().initPushReply().setRowsApplied(a.rows);
  Frames out;
  out.push_back(EncodeFrame(b));
  return out;
}

Result<Frames> ServerCore::HandlePull(wire::Header::Reader h, const Frames& request) {
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
  ++stats_.pulls_served;
  stats_.bytes_pulled += values.size();

  capnp::MallocMessageBuilder b;
  auto reply = NewHeader(b, h.getRequestId(), server_id_);
  reply.getBody().initPullReply().setRows(a.rows);
  Frames out;
  out.push_back(EncodeFrame(b));
  out.push_back(std::move(values));
  return out;
}

Frames ServerCore::Handle(Frames& request, After* after) {
  *after = After::kContinue;
  if (request.empty()) {
    ++stats_.bad_requests;
    return ErrorReply(0, server_id_, InvalidArgument("empty message"));
  }
  AlignPayloadFrames(request);
  Result<DecodedHeader> decoded = DecodedHeader::Decode(request[0]);
  if (!decoded.ok()) {
    ++stats_.bad_requests;
    return ErrorReply(0, server_id_, decoded.status());
  }
  wire::Header::Reader h = decoded->get();
  uint64_t request_id = 0;
  bool is_push = false;
  try {
    request_id = h.getRequestId();
    Status version = CheckProtocolVersion(h);
    if (!version.ok()) {
      ++stats_.bad_requests;
      return ErrorReply(request_id, server_id_, version);
    }
    Result<Frames> reply = InvalidArgument("no reply");
    switch (h.getBody().which()) {
      case wire::Header::Body::PUSH:
        is_push = true;
        reply = HandlePush(h, request);
        break;
      case wire::Header::Body::PULL:
        reply = HandlePull(h, request);
        break;
      case wire::Header::Body::HEARTBEAT: {
        capnp::MallocMessageBuilder b;
        NewHeader(b, request_id, server_id_).getBody().setHeartbeatReply();
        Frames out;
        out.push_back(EncodeFrame(b));
        return out;
      }
      case wire::Header::Body::SHUTDOWN: {
        capnp::MallocMessageBuilder b;
        auto s = NewHeader(b, request_id, server_id_).getBody().initShutdownReply();
        ServerStats st = stats();
        s.setPushesApplied(st.pushes_applied);
        s.setPushesRejected(st.pushes_rejected);
        s.setPullsServed(st.pulls_served);
        s.setBytesPushed(st.bytes_pushed);
        s.setBytesPulled(st.bytes_pulled);
        s.setRowsHeld(st.rows_held);
        Frames out;
        out.push_back(EncodeFrame(b));
        *after = After::kShutdown;
        return out;
      }
      default:
        reply = InvalidArgument("a server does not handle this message type (" +
                                std::to_string(static_cast<int>(h.getBody().which())) + ")");
    }
    if (reply.ok()) return std::move(reply).value();
    ++stats_.bad_requests;
    if (is_push) ++stats_.pushes_rejected;
    return ErrorReply(request_id, server_id_, reply.status());
  } catch (const kj::Exception& e) {
    // A malformed pointer deep in the header: lazily validated by Cap'n Proto.
    ++stats_.bad_requests;
    if (is_push) ++stats_.pushes_rejected;
    return ErrorReply(request_id, server_id_,
                      InvalidArgument(std::string("malformed header: ") + e.getDescription().cStr()));
  }
}

}  // namespace ps
