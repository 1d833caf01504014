// The wire schema and its decoder: round trips, and that bad frames become errors.
#include "common/wire.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ps {
namespace {

Frames PushMessage(uint64_t request_id, uint32_t table, uint64_t begin, uint64_t end) {
  capnp::MallocMessageBuilder b;
  auto push = NewHeader(b, request_id, 7).getBody().initPush();
  push.setTableId(table);
  push.getKeys().initRange().setBegin(begin);
  push.getKeys().getRange().setEnd(end);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

TEST(WireTest, HeaderRoundTrip) {
  Frames f = PushMessage(42, 3, 10, 20);
  Result<DecodedHeader> h = DecodedHeader::Decode(f[0]);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto r = h->get();
  EXPECT_EQ(r.getProtocolVersion(), wire::PROTOCOL_VERSION);
  EXPECT_EQ(r.getRequestId(), 42u);
  EXPECT_EQ(r.getSenderId(), 7);
  ASSERT_EQ(r.getBody().which(), wire::Header::Body::PUSH);
  EXPECT_EQ(r.getBody().getPush().getTableId(), 3u);
  ASSERT_EQ(r.getBody().getPush().getKeys().which(), wire::Keys::RANGE);
  EXPECT_EQ(r.getBody().getPush().getKeys().getRange().getBegin(), 10u);
  EXPECT_EQ(r.getBody().getPush().getKeys().getRange().getEnd(), 20u);
  EXPECT_TRUE(CheckProtocolVersion(r).ok());
}

TEST(WireTest, EveryMessageTypeRoundTrips) {
  // Register, register reply with config and shard map, report, done, shutdown reply, error.
  capnp::MallocMessageBuilder b;
  auto rr = NewHeader(b, 1, -1).getBody().initRegisterReply();
  rr.setId(5);
  auto cfg = rr.initConfig(1);
  cfg[0].setKey("epochs");
  cfg[0].setValue("3");
  auto servers = rr.initShardMap().initServers(2);
  servers[1].setEndpoint("tcp://127.0.0.1:9");
  zmq::message_t frame = EncodeFrame(b);
  auto h = DecodedHeader::Decode(frame);
  ASSERT_TRUE(h.ok());
  auto got = h->get().getBody().getRegisterReply();
  EXPECT_EQ(got.getId(), 5u);
  EXPECT_STREQ(got.getConfig()[0].getKey().cStr(), "epochs");
  EXPECT_STREQ(got.getShardMap().getServers()[1].getEndpoint().cStr(), "tcp://127.0.0.1:9");

  Frames err = ErrorReply(9, 2, NotFound("no table 12"));
  auto eh = DecodedHeader::Decode(err[0]);
  ASSERT_TRUE(eh.ok());
  EXPECT_EQ(eh->get().getRequestId(), 9u);
  Status s = StatusFromError(eh->get().getBody().getError());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no table 12");
}

TEST(WireTest, StatusCodesSurviveTheWire) {
  for (StatusCode c :
       {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kFailedPrecondition,
        StatusCode::kUnavailable, StatusCode::kDeadlineExceeded, StatusCode::kInternal,
        StatusCode::kVersionMismatch, StatusCode::kAborted}) {
    EXPECT_EQ(FromWire(ToWire(c)), c);
  }
}

TEST(WireTest, FutureVersionIsRejected) {
  capnp::MallocMessageBuilder b;
  auto h = NewHeader(b, 1, 0);
  h.setProtocolVersion(wire::PROTOCOL_VERSION + 1);
  h.getBody().setHeartbeat();
  zmq::message_t frame = EncodeFrame(b);
  auto d = DecodedHeader::Decode(frame);
  ASSERT_TRUE(d.ok());
  Status v = CheckProtocolVersion(d->get());
  EXPECT_EQ(v.code(), StatusCode::kVersionMismatch);
  EXPECT_NE(v.message().find(std::to_string(wire::PROTOCOL_VERSION + 1)), std::string::npos);
}

TEST(WireTest, TruncatedAndGarbageFramesAreErrors) {
  Frames f = PushMessage(1, 0, 0, 1);
  const std::string bytes(static_cast<const char*>(f[0].data()), f[0].size());
  // Every proper prefix is rejected without a crash.
  for (size_t n = 0; n < bytes.size(); ++n) {
    zmq::message_t cut(bytes.data(), n);
    Result<DecodedHeader> h = DecodedHeader::Decode(cut);
    if (h.ok()) {
      // A word-aligned prefix may parse as a message whose pointers run off the end;
      // reading it must then fail as an error, not crash.
      try {
        (void)h->get().getBody().getPush().getKeys().getRange().getEnd();
      } catch (const kj::Exception&) {
      }
    } else {
      EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    }
  }
  std::string garbage(64, '\xff');
  zmq::message_t g(garbage.data(), garbage.size());
  EXPECT_FALSE(DecodedHeader::Decode(g).ok());
  zmq::message_t empty;
  EXPECT_FALSE(DecodedHeader::Decode(empty).ok());
}

TEST(WireTest, OversizedHeaderIsRejectedBeforeParsing) {
  DecodeLimits limits;
  limits.max_header_bytes = 64;
  std::string big(128, '\0');
  zmq::message_t frame(big.data(), big.size());
  Result<DecodedHeader> h = DecodedHeader::Decode(frame, limits);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("exceeds the limit"), std::string::npos);
}

TEST(WireTest, FrameAsChecksSizeAndAlignment) {
  std::vector<float> v = {1, 2, 3};
  zmq::message_t f(v.data(), v.size() * sizeof(float));
  auto span = FrameAs<float>(f);
  ASSERT_TRUE(span.ok());
  ASSERT_EQ(span->size(), 3u);
  EXPECT_EQ((*span)[2], 3.0f);
  zmq::message_t odd(7);
  EXPECT_FALSE(FrameAs<float>(odd).ok());
}

TEST(WireTest, AlignPayloadFramesCopiesMisalignedFrames) {
  // A frame that views a buffer at an odd address, as ZeroMQ may hand one over.
  alignas(16) static char storage[64];
  for (int i = 0; i < 64; ++i) storage[i] = static_cast<char>(i);
  Frames frames;
  frames.push_back(zmq::message_t(8));
  frames.push_back(zmq::message_t(storage + 1, 16, nullptr, nullptr));
  ASSERT_NE(reinterpret_cast<uintptr_t>(frames[1].data()) % 8, 0u);
  AlignPayloadFrames(frames);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(frames[1].data()) % 8, 0u);
  EXPECT_EQ(std::memcmp(frames[1].data(), storage + 1, 16), 0);
}

}  // namespace
}  // namespace ps
