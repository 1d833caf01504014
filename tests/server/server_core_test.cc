// ServerCore without sockets: pushes and pulls apply exactly, and every kind of bad
// request gets an error and leaves the model unchanged.
#include "server/server_core.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/row_init.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::KeyPull;
using testing::KeyPush;
using testing::RangePull;
using testing::RangePush;
using testing::ReplyFloats;
using testing::ReplyStatus;

class ServerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One server holds everything: dense "d" (6 rows x 3) and sparse "s" (width 2).
    config_ = JobConfig::FromFlagMap({{"model", "none"},
                                      {"tables", "d:6:3:uniform:1,s:sparse:2:normal:0.5"},
                                      {"num_servers", "1"},
                                      {"base_lr", "0.5"}})
                  .value();
    core_ = ServerCore::Create(config_, 0).value();
  }

  Frames Handle(Frames f) { return core_->HandleOne(f); }

  // Every stored value of the dense table and of the sparse keys touched so far.
  std::vector<float> Snapshot() {
    std::vector<float> all;
    for (uint64_t r = 0; r < 6; ++r) {
      auto row = core_->ReadRow(0, r).value();
      all.insert(all.end(), row.begin(), row.end());
    }
    for (uint64_t k : sparse_keys_) {
      auto row = core_->ReadRow(1, k).value();
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  }

  JobConfig config_;
  std::unique_ptr<ServerCore> core_;
  std::vector<uint64_t> sparse_keys_ = {3, 1ull << 63, 77};
};

TEST_F(ServerCoreTest, PushAppliesSgdAndPullReturnsRows) {
  Frames pulled = Handle(RangePull(1, 0, 0, 6));
  ASSERT_TRUE(ReplyStatus(pulled).ok());
  std::vector<float> before = ReplyFloats(pulled);
  ASSERT_EQ(before.size(), 18u);
  for (float x : before) {
    EXPECT_GE(x, -1.0f);
    EXPECT_LE(x, 1.0f);
  }
  std::vector<float> grad(6, 1.0f);  // rows 2 and 3
  ASSERT_TRUE(ReplyStatus(Handle(RangePush(2, 0, 2, 4, grad))).ok());
  std::vector<float> after = ReplyFloats(Handle(RangePull(3, 0, 0, 6)));
  for (size_t i = 0; i < 18; ++i) {
    float expect = (i >= 6 && i < 12) ? before[i] - 0.5f * 1.0f : before[i];
    EXPECT_EQ(after[i], expect) << i;
  }
  ServerStats st = core_->stats();
  EXPECT_EQ(st.pushes_applied, 1u);
  EXPECT_EQ(st.bytes_pushed, 6 * sizeof(float));
  EXPECT_EQ(st.pulls_served, 2u);
}

TEST_F(ServerCoreTest, SparseRowsAreCreatedOnFirstTouchDeterministically) {
  Frames a = Handle(KeyPull(1, 1, sparse_keys_));
  ASSERT_TRUE(ReplyStatus(a).ok());
  std::vector<float> first = ReplyFloats(a);
  ASSERT_EQ(first.size(), 6u);
  // Same values as InitializeRow computes anywhere.
  for (size_t i = 0; i < sparse_keys_.size(); ++i) {
    std::vector<float> expect(2);
    InitializeRow(config_.table_specs[1], config_.seed, sparse_keys_[i], expect);
    EXPECT_EQ(first[2 * i], expect[0]);
    EXPECT_EQ(first[2 * i + 1], expect[1]);
  }
  // Duplicate keys in one push apply twice, in order.
  ASSERT_TRUE(ReplyStatus(Handle(KeyPush(2, 1, {77, 77}, {1, 2, 1, 2}))).ok());
  std::vector<float> row = core_->ReadRow(1, 77).value();
  EXPECT_EQ(row[0], first[4] - 0.5f - 0.5f);
  EXPECT_EQ(row[1], first[5] - 1.0f - 1.0f);
  EXPECT_EQ(core_->stats().rows_held, 6u + 3u);
}

TEST_F(ServerCoreTest, BadRequestsGetErrorsAndChangeNothing) {
  (void)Handle(KeyPull(1, 1, sparse_keys_));  // create the sparse rows first
  const std::vector<float> before = Snapshot();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  struct Case {
    const char* what;
    Frames request;
    StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"unknown table", RangePush(1, 9, 0, 1, {1, 1, 1}), StatusCode::kNotFound, "table id 9"});
  cases.push_back({"wrong payload length", RangePush(1, 0, 0, 2, {1, 1, 1}),
                   StatusCode::kInvalidArgument, "expected 2 rows x 3"});
  cases.push_back({"future protocol version",
                   RangePush(1, 0, 0, 1, {1, 1, 1}, wire::PROTOCOL_VERSION + 1),
                   StatusCode::kVersionMismatch, "not supported"});
  cases.push_back({"NaN gradient", RangePush(1, 0, 0, 2, {1, 1, 1, 1, nan, 1}),
                   StatusCode::kInvalidArgument, "non-finite"});
  cases.push_back({"Inf gradient", KeyPush(1, 1, {3, 77}, {1, 1, -inf, 1}),
                   StatusCode::kInvalidArgument, "non-finite"});
  cases.push_back({"rows outside the table", RangePush(1, 0, 5, 7, std::vector<float>(6, 1)),
                   StatusCode::kInvalidArgument, "not held here"});
  cases.push_back({"dense key outside the table", KeyPush(1, 0, {6}, {1, 1, 1}),
                   StatusCode::kInvalidArgument, "not held here"});
  cases.push_back({"range on a sparse table", RangePush(1, 1, 0, 1, {1, 1}),
                   StatusCode::kInvalidArgument, "sparse"});
  {
    Frames f = KeyPush(1, 1, {3, 77}, {1, 1, 1, 1});
    f.pop_back();  // values frame missing
    cases.push_back({"missing values frame", std::move(f), StatusCode::kInvalidArgument, "frames"});
  }
  {
    Frames f = KeyPush(1, 1, {3, 77}, {1, 1, 1, 1});
    f[1] = testing::KeysFrame({3});  // header says 2 keys
    cases.push_back(
        {"key count mismatch", std::move(f), StatusCode::kInvalidArgument, "header says 2"});
  }
  {
    Frames f = RangePush(1, 0, 0, 1, {1, 1, 1});
    f[1] = zmq::message_t(f[1].data(), 10);  // truncated mid-float
    cases.push_back(
        {"truncated payload", std::move(f), StatusCode::kInvalidArgument, "whole number"});
  }
  {
    Frames f = RangePush(1, 0, 0, 1, {1, 1, 1});
    f[0] = zmq::message_t(f[0].data(), f[0].size() / 2 + 3);  // truncated header
    cases.push_back({"truncated header", std::move(f), StatusCode::kInvalidArgument, ""});
  }
  {
    Frames f = RangePush(1, 0, 0, 1, {1, 1, 1});
    f.push_back(testing::FloatsFrame({1}));  // one frame too many
    cases.push_back({"extra frame", std::move(f), StatusCode::kInvalidArgument, "frames"});
  }
  {
    Frames f;
    cases.push_back({"empty message", std::move(f), StatusCode::kInvalidArgument, "empty"});
  }
  {
    std::string junk(40, '\x7f');
    Frames f;
    f.push_back(zmq::message_t(junk.data(), junk.size()));
    cases.push_back({"garbage header", std::move(f), StatusCode::kInvalidArgument, ""});
  }

  uint64_t bad = 0;
  for (Case& c : cases) {
    Frames reply = Handle(std::move(c.request));
    Status s = ReplyStatus(reply);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s.message();
    EXPECT_EQ(Snapshot(), before) << c.what << " changed the model";
    ++bad;
  }
  ServerStats st = core_->stats();
  EXPECT_EQ(st.pushes_applied, 0u);
  EXPECT_EQ(st.bad_requests, bad);
  EXPECT_GE(st.pushes_rejected, 8u);

  // And it still serves good requests afterwards.
  ASSERT_TRUE(ReplyStatus(Handle(RangePush(2, 0, 0, 1, {2, 2, 2}))).ok());
  EXPECT_EQ(core_->ReadRow(0, 0).value()[0], before[0] - 1.0f);
}

TEST_F(ServerCoreTest, ShutdownRepliesWithCounters) {
  ASSERT_TRUE(ReplyStatus(Handle(RangePush(1, 0, 0, 1, {1, 1, 1}))).ok());
  capnp::MallocMessageBuilder b;
  NewHeader(b, 5, -1).getBody().setShutdown();
  Frames f;
  f.push_back(EncodeFrame(b));
  ServerCore::After after;
  Frames reply = core_->HandleOne(f, &after);
  EXPECT_EQ(after, ServerCore::After::kShutdown);
  auto h = DecodedHeader::Decode(reply[0]).value();
  ASSERT_EQ(h.get().getBody().which(), wire::Header::Body::SHUTDOWN_REPLY);
  EXPECT_EQ(h.get().getBody().getShutdownReply().getPushesApplied(), 1u);
  EXPECT_EQ(h.get().getRequestId(), 5u);
}

TEST(ServerCoreCreateTest, RejectsAServerIdOutsideTheJob) {
  JobConfig c = JobConfig::FromFlagMap({{"num_servers", "2"}}).value();
  EXPECT_FALSE(ServerCore::Create(c, 2).ok());
  EXPECT_FALSE(ServerCore::Create(c, -1).ok());
}

}  // namespace
}  // namespace ps
