// Builders for raw request frames, for tests that talk to a server below the KVClient.
#pragma once

#include <cstring>
#include <vector>

#include "common/wire.h"

namespace ps::testing {

inline zmq::message_t FloatsFrame(const std::vector<float>& v) {
  return CopyFrame(v.data(), v.size() * sizeof(float));
}
inline zmq::message_t KeysFrame(const std::vector<uint64_t>& v) {
  return CopyFrame(v.data(), v.size() * sizeof(uint64_t));
}

// A push of `values` to rows [begin, end) of `table`.
inline Frames RangePush(uint64_t rid, uint32_t table, uint64_t begin, uint64_t end,
                        const std::vector<float>& values,
                        uint32_t version = wire::PROTOCOL_VERSION) {
  capnp::MallocMessageBuilder b;
  auto h = NewHeader(b, rid, 0);
  h.setProtocolVersion(version);
  auto p = h.getBody().initPush();
  p.setTableId(table);
  p.getKeys().initRange().setBegin(begin);
  p.getKeys().getRange().setEnd(end);
  Frames f;
  f.push_back(EncodeFrame(b));
  f.push_back(FloatsFrame(values));
  return f;
}

inline Frames KeyPush(uint64_t rid, uint32_t table, const std::vector<uint64_t>& keys,
                      const std::vector<float>& values) {
  capnp::MallocMessageBuilder b;
  auto p = NewHeader(b, rid, 0).getBody().initPush();
  p.setTableId(table);
  p.getKeys().setListCount(keys.size());
  Frames f;
  f.push_back(EncodeFrame(b));
  f.push_back(KeysFrame(keys));
  f.push_back(FloatsFrame(values));
  return f;
}

inline Frames KeyPull(uint64_t rid, uint32_t table, const std::vector<uint64_t>& keys) {
  capnp::MallocMessageBuilder b;
  auto p = NewHeader(b, rid, 0).getBody().initPull();
  p.setTableId(table);
  p.getKeys().setListCount(keys.size());
  Frames f;
  f.push_back(EncodeFrame(b));
  f.push_back(KeysFrame(keys));
  return f;
}

inline Frames RangePull(uint64_t rid, uint32_t table, uint64_t begin, uint64_t end,
                        int32_t worker = 0, int64_t clock = 0, uint8_t value_dtype = 0) {
  capnp::MallocMessageBuilder b;
  auto p = NewHeader(b, rid, worker).getBody().initPull();
  p.setTableId(table);
  p.setClock(clock);
  p.setValueDtype(value_dtype);
  p.getKeys().initRange().setBegin(begin);
  p.getKeys().getRange().setEnd(end);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// A push from `worker` at `clock`, computed from shard version `pulled_version`.
inline Frames VersionedPush(uint64_t rid, uint32_t table, uint64_t begin, uint64_t end,
                            const std::vector<float>& values, int32_t worker, int64_t clock,
                            uint64_t pulled_version) {
  capnp::MallocMessageBuilder b;
  auto p = NewHeader(b, rid, worker).getBody().initPush();
  p.setTableId(table);
  p.getKeys().initRange().setBegin(begin);
  p.getKeys().getRange().setEnd(end);
  p.setClock(clock);
  p.setPulledVersion(pulled_version);
  Frames f;
  f.push_back(EncodeFrame(b));
  f.push_back(FloatsFrame(values));
  return f;
}

// `batches`: the batches one clock covers (an all-reduce group's size; 0 says nothing).
inline Frames ClockTick(uint64_t rid, int32_t worker, int64_t clock, bool leave = false,
                        uint32_t batches = 0) {
  capnp::MallocMessageBuilder b;
  auto t = NewHeader(b, rid, worker).getBody().initClock();
  t.setClock(clock);
  t.setLeave(leave);
  t.setBatches(batches);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// The decoded header of a reply.
inline DecodedHeader ReplyHeader(const Frames& reply) {
  return DecodedHeader::Decode(reply.at(0)).value();
}

// The reply's Status: OK for a push/pull reply, the carried error otherwise.
inline Status ReplyStatus(const Frames& reply) {
  if (reply.empty()) return Internal("empty reply");
  auto h = DecodedHeader::Decode(reply[0]);
  if (!h.ok()) return h.status();
  if (h->get().getBody().which() == wire::Header::Body::ERROR) {
    return StatusFromError(h->get().getBody().getError());
  }
  return Status::Ok();
}

inline std::vector<float> ReplyFloats(const Frames& reply) {
  std::vector<float> v(reply.at(1).size() / sizeof(float));
  std::memcpy(v.data(), reply[1].data(), reply[1].size());
  return v;
}

}  // namespace ps::testing
