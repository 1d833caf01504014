// Batches (common/transport.h): several messages to one peer as one ZeroMQ message, split
// back in order by the receiving socket, replies to a batch sent back as one batch, replies
// to other peers not held behind it, and malformed batch headers refused with an error
// naming the bad count.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/transport.h"

namespace ps {
namespace {

using std::chrono::milliseconds;

Frames Message(const std::string& text, size_t frames = 1) {
  Frames f;
  for (size_t i = 0; i < frames; ++i) f.push_back(CopyFrame(text.data(), text.size()));
  return f;
}

std::string Text(const zmq::message_t& m) { return m.to_string(); }

TEST(BatchTest, PackAndUnpackKeepMessagesAndOrder) {
  std::vector<Frames> messages;
  messages.push_back(Message("a", 1));
  messages.push_back(Message("bb", 3));
  messages.push_back(Message("ccc", 2));
  Frames packed = PackBatch(std::move(messages));
  ASSERT_EQ(packed.size(), 7u);
  EXPECT_TRUE(LooksLikeBatch(packed[0]));
  EXPECT_FALSE(LooksLikeBatch(packed[1]));
  Result<std::vector<Frames>> back = UnpackBatch(std::move(packed));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[0].size(), 1u);
  EXPECT_EQ((*back)[1].size(), 3u);
  EXPECT_EQ((*back)[2].size(), 2u);
  EXPECT_EQ(Text((*back)[1][2]), "bb");
  EXPECT_EQ(Text((*back)[2][0]), "ccc");
}

TEST(BatchTest, MalformedHeadersAreRefusedNamingTheCount) {
  auto packed = [] {
    std::vector<Frames> m;
    m.push_back(Message("x", 2));
    m.push_back(Message("y", 1));
    return PackBatch(std::move(m));
  };
  // One frame missing: the header counts 3.
  Frames short_batch = packed();
  short_batch.pop_back();
  Result<std::vector<Frames>> r = UnpackBatch(std::move(short_batch));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("counts 3 frames, but 2 follow"), std::string::npos)
      << r.status().ToString();
  // A message of zero frames.
  Frames zero = packed();
  uint32_t nothing = 0;
  std::memcpy(static_cast<char*>(zero[0].data()) + 20, &nothing, sizeof(nothing));
  r = UnpackBatch(std::move(zero));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0 frames"), std::string::npos) << r.status().ToString();
  // A message count that does not match the header's size.
  Frames big_count = packed();
  uint32_t many = 1000;
  std::memcpy(static_cast<char*>(big_count[0].data()) + 16, &many, sizeof(many));
  r = UnpackBatch(std::move(big_count));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("names 1000 messages"), std::string::npos)
      << r.status().ToString();
}

class BatchSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = transport_.Listen("inproc://batch_socket_test").value();
    client_ = transport_.Connect(server_->BoundEndpoint()).value();
  }
  Transport transport_;
  std::unique_ptr<ServerSocket> server_;
  std::unique_ptr<ClientSocket> client_;
};

TEST_F(BatchSocketTest, ABatchArrivesMessageByMessageAndItsRepliesGoBackAsOne) {
  std::vector<Frames> batch;
  for (int i = 0; i < 3; ++i) batch.push_back(Message("request " + std::to_string(i), 2));
  ASSERT_TRUE(client_->SendBatch(std::move(batch)).ok());
  for (int i = 0; i < 3; ++i) {
    Result<Incoming> in = server_->Recv(milliseconds(5000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_TRUE(in->bad_frame.ok());
    ASSERT_EQ(in->frames.size(), 2u);
    EXPECT_EQ(Text(in->frames[0]), "request " + std::to_string(i));
    EXPECT_EQ(server_->HasQueued(), i < 2);
    ASSERT_TRUE(server_->Send(in->peer, Message("reply " + std::to_string(i))).ok());
    if (i < 2) {
      // Held until the batch's last request was handled.
      Result<std::optional<Frames>> early = client_->TryRecv();
      ASSERT_TRUE(early.ok());
      EXPECT_FALSE(early->has_value()) << "a reply left before the batch was handled";
    }
  }
  // The three replies, in order, out of one message.
  for (int i = 0; i < 3; ++i) {
    Result<Frames> r = client_->Recv(milliseconds(5000));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ(Text((*r)[0]), "reply " + std::to_string(i));
  }
}

TEST_F(BatchSocketTest, RepliesToAnotherPeerAreNotHeldBehindABatch) {
  auto other = transport_.Connect(server_->BoundEndpoint()).value();
  ASSERT_TRUE(other->Send(Message("single")).ok());
  Result<Incoming> single = server_->Recv(milliseconds(5000));
  ASSERT_TRUE(single.ok());
  std::vector<Frames> batch;
  batch.push_back(Message("first"));
  batch.push_back(Message("second"));
  ASSERT_TRUE(client_->SendBatch(std::move(batch)).ok());
  Result<Incoming> first = server_->Recv(milliseconds(5000));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(server_->HasQueued());
  ASSERT_TRUE(server_->Send(single->peer, Message("to the other")).ok());
  Result<Frames> got = other->Recv(milliseconds(5000));
  ASSERT_TRUE(got.ok()) << "held behind the batch: " << got.status().ToString();
  EXPECT_EQ(Text((*got)[0]), "to the other");
  // The batch's first reply waits for its second request; a request that gets no reply
  // (a held pull) leaves it to Flush, which Recv does before it waits.
  ASSERT_TRUE(server_->Send(first->peer, Message("reply to first")).ok());
  Result<Incoming> second = server_->Recv(milliseconds(5000));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Text(second->frames[0]), "second");
  EXPECT_FALSE(client_->TryRecv().value().has_value());
  ASSERT_TRUE(server_->Flush().ok());
  Result<Frames> reply = client_->Recv(milliseconds(5000));
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(Text((*reply)[0]), "reply to first");
}

TEST_F(BatchSocketTest, AMalformedBatchIsABadFrameAndTheSocketGoesOn) {
  std::vector<Frames> batch;
  batch.push_back(Message("a"));
  batch.push_back(Message("b"));
  Frames packed = PackBatch(std::move(batch));
  packed.push_back(CopyFrame("extra", 5));  // the header counts 2 frames, 3 follow
  ASSERT_TRUE(client_->Send(std::move(packed)).ok());
  Result<Incoming> in = server_->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(in->frames.empty());
  EXPECT_EQ(in->bad_frame.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in->bad_frame.message().find("counts 2 frames, but 3 follow"), std::string::npos)
      << in->bad_frame.ToString();
  EXPECT_FALSE(server_->HasQueued());
  ASSERT_TRUE(client_->Send(Message("after")).ok());
  Result<Incoming> next = server_->Recv(milliseconds(5000));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Text(next->frames[0]), "after");
}

}  // namespace
}  // namespace ps
