// Exactly-once pushes and evictions on the server: the table of recent request ids, a
// retried push applied once and answered again, a dead worker dropped from the clock table
// and refused, and a worker that joins a running job entering at the slowest clock.
#include "server/recent_requests.h"

#include <gtest/gtest.h>

#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ClockTick;
using testing::RangePull;
using testing::ReplyHeader;
using testing::ReplyStatus;
using testing::VersionedPush;

TEST(RecentRequestsTest, RemembersTheLastRepliesPerWorker) {
  RecentRequests r(3);
  EXPECT_EQ(r.Find(0, 7), nullptr);
  r.Insert(0, 7, "seven");
  r.Insert(1, 7, "other worker");
  ASSERT_NE(r.Find(0, 7), nullptr);
  EXPECT_EQ(*r.Find(0, 7), "seven");
  EXPECT_EQ(*r.Find(1, 7), "other worker");
  r.Insert(0, 7, "again");  // a request id keeps its first reply
  EXPECT_EQ(*r.Find(0, 7), "seven");
  for (uint64_t id = 8; id < 11; ++id) r.Insert(0, id, std::to_string(id));
  EXPECT_EQ(r.size(0), 3u) << "bounded";
  EXPECT_EQ(r.Find(0, 7), nullptr) << "the oldest is forgotten first";
  EXPECT_NE(r.Find(0, 8), nullptr);
  EXPECT_NE(r.Find(1, 7), nullptr) << "another worker's table is its own";
}

TEST(RecentRequestsTest, TheTotalOverAllWorkersIsBounded) {
  RecentRequests r(/*capacity_per_worker=*/4, /*total_capacity=*/10);
  for (int w = 0; w < 100; ++w) {
    for (uint64_t id = 0; id < 3; ++id) r.Insert(w, id, "x");
  }
  EXPECT_EQ(r.total(), 10u);
  EXPECT_EQ(r.Find(0, 0), nullptr) << "the oldest went first";
  EXPECT_NE(r.Find(99, 2), nullptr) << "the newest stays";
  for (uint64_t id = 0; id < 1000; ++id) r.Insert(5, id, "y");  // one worker's own bound
  EXPECT_EQ(r.size(5), 4u);
  EXPECT_LE(r.total(), 10u);
}

std::unique_ptr<ServerCore> MakeCore(const std::string& staleness) {
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "a:4:2:zeros"},
                                             {"num_servers", "1"},
                                             {"num_workers", "2"},
                                             {"staleness", staleness},
                                             {"base_lr", "1"}})
                         .value();
  return ServerCore::Create(config, 0).value();
}

std::vector<Outgoing> Send(ServerCore& core, Frames f) {
  std::vector<Outgoing> out;
  ServerCore::After after;
  core.Handle("peer", f, &out, &after);
  return out;
}

std::string Bytes(const zmq::message_t& m) {
  return std::string(static_cast<const char*>(m.data()), m.size());
}

Frames Evict(uint64_t rid, int worker) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, rid, -1).getBody().initEvict().setWorker(worker);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

TEST(ExactlyOnceTest, ARetriedPushIsAppliedOnceAndAnsweredAgain) {
  auto core = MakeCore("-1");
  const std::vector<float> g(8, 1.0f);
  auto first = Send(*core, VersionedPush(1000, 0, 0, 4, g, 0, 0, 0));
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(ReplyStatus(first[0].frames).ok());
  auto retry = Send(*core, VersionedPush(1000, 0, 0, 4, g, 0, 0, 0));
  ASSERT_EQ(retry.size(), 1u);
  EXPECT_EQ(Bytes(retry[0].frames[0]), Bytes(first[0].frames[0])) << "the same reply";
  EXPECT_EQ(ReplyHeader(retry[0].frames).get().getRequestId(), 1000u);
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>({-1.0f, -1.0f})) << "applied once";
  EXPECT_EQ(core->stats().pushes_applied, 1u);
  EXPECT_EQ(core->stats().pushes_duplicate, 1u);
  // The same id from another worker, and a new id from the same one, are new pushes.
  ASSERT_TRUE(ReplyStatus(Send(*core, VersionedPush(1000, 0, 0, 4, g, 1, 0, 0))[0].frames).ok());
  ASSERT_TRUE(ReplyStatus(Send(*core, VersionedPush(1001, 0, 0, 4, g, 0, 0, 0))[0].frames).ok());
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>({-3.0f, -3.0f}));
  EXPECT_EQ(core->stats().pushes_applied, 3u);
}

TEST(ExactlyOnceTest, ARefusedPushIsNotRememberedSoItsRetryIsCheckedAgain) {
  auto core = MakeCore("-1");
  auto bad = Send(*core, VersionedPush(5, 0, 0, 4, std::vector<float>(3, 1.0f), 0, 0, 0));
  EXPECT_EQ(ReplyStatus(bad[0].frames).code(), StatusCode::kInvalidArgument);
  auto again = Send(*core, VersionedPush(5, 0, 0, 4, std::vector<float>(3, 1.0f), 0, 0, 0));
  EXPECT_EQ(ReplyStatus(again[0].frames).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core->stats().pushes_duplicate, 0u);
}

TEST(EvictionTest, AnEvictedWorkerReleasesHeldPullsAndIsRefused) {
  auto core = MakeCore("0");  // BSP
  ASSERT_EQ(Send(*core, ClockTick(1, 0, 1)).size(), 1u);
  // Worker 0 at clock 1 waits for worker 1, which died at clock 0.
  EXPECT_TRUE(Send(*core, RangePull(2, 0, 0, 4, 0, 1)).empty()) << "held";
  auto out = Send(*core, Evict(3, 1));
  ASSERT_EQ(out.size(), 2u) << "the evict reply and the released pull";
  EXPECT_EQ(ReplyHeader(out[0].frames).get().getBody().which(), wire::Header::Body::EVICT_REPLY);
  EXPECT_TRUE(ReplyStatus(out[1].frames).ok());
  EXPECT_EQ(ReplyHeader(out[1].frames).get().getRequestId(), 2u);
  EXPECT_TRUE(core->evicted(1));
  EXPECT_EQ(core->stats().workers_evicted, 1u);
  // Woken from SIGSTOP, its requests change nothing.
  std::vector<Frames> late;
  late.push_back(VersionedPush(4, 0, 0, 4, std::vector<float>(8, 1.0f), 1, 0, 0));
  late.push_back(RangePull(5, 0, 0, 4, 1, 0));
  late.push_back(ClockTick(6, 1, 3));
  for (Frames& f : late) {
    auto r = Send(*core, std::move(f));
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(ReplyStatus(r[0].frames).code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>({0.0f, 0.0f}));
  // Worker 0 runs alone now.
  ASSERT_EQ(Send(*core, ClockTick(7, 0, 2)).size(), 1u);
  EXPECT_EQ(Send(*core, RangePull(8, 0, 0, 4, 0, 2)).size(), 1u) << "nobody waits on worker 1";
}

TEST(EvictionTest, AJoinedWorkerEntersAtTheSlowestClock) {
  auto core = MakeCore("1");
  ASSERT_EQ(Send(*core, ClockTick(1, 0, 5)).size(), 1u);
  ASSERT_EQ(Send(*core, ClockTick(2, 1, 4)).size(), 1u);
  // Worker 7 joined the running job (ids past num_workers): out of the clock table until
  // its first tick, so a pull of worker 0 at clock 5 (needs 4) is not held by it.
  EXPECT_EQ(Send(*core, RangePull(3, 0, 0, 4, 0, 5)).size(), 1u);
  auto out = Send(*core, ClockTick(4, 7, 0));  // its rejoin tick
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ReplyHeader(out[0].frames).get().getBody().getClockReply().getMinClock(), 4);
  EXPECT_EQ(core->worker_clock(7), 4) << "starts at the slowest live clock";
}

}  // namespace
}  // namespace ps
