// The staleness bound and gradient staleness on one ServerCore, message by message.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <filesystem>
#include <functional>

#include "common/wire_dtype.h"
#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ClockTick;
using testing::RangePull;
using testing::ReplyHeader;
using testing::ReplyStatus;
using testing::VersionedPush;

std::unique_ptr<ServerCore> MakeCore(std::map<std::string, std::string> flags) {
  flags.emplace("model", "none");
  flags.emplace("tables", "a:4:2:zeros,b:4:2:zeros");
  flags.emplace("num_servers", "1");
  flags.emplace("num_workers", "2");
  flags.emplace("base_lr", "1");
  JobConfig config = JobConfig::FromFlagMap(flags).value();
  return ServerCore::Create(config, 0).value();
}

std::vector<Outgoing> Send(ServerCore& core, const std::string& peer, Frames f) {
  std::vector<Outgoing> out;
  ServerCore::After after;
  core.Handle(peer, f, &out, &after);
  return out;
}

TEST(StalenessTest, BspHoldsAPullUntilEveryWorkerTicked) {
  auto core = MakeCore({{"staleness", "0"}});
  // Both at clock 0: a pull at clock 0 is served at once.
  ASSERT_EQ(Send(*core, "w0", RangePull(1, 0, 0, 4, 0, 0)).size(), 1u);
  // Worker 0 finishes clock 1 and pulls at clock 1: it must see worker 1's clock 0 updates.
  ASSERT_EQ(Send(*core, "w0", ClockTick(2, 0, 1)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(3, 0, 0, 4, 0, 1)).empty()) << "pull was not held";
  EXPECT_EQ(core->held_pulls(), 1u);
  // Worker 1 ticks: its tick is answered, and worker 0's pull released.
  std::vector<Outgoing> out = Send(*core, "w1", ClockTick(4, 1, 1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].peer, "w1");
  EXPECT_EQ(ReplyHeader(out[0].frames).get().getBody().which(), wire::Header::Body::CLOCK_REPLY);
  EXPECT_EQ(out[1].peer, "w0");
  auto reply = ReplyHeader(out[1].frames);
  ASSERT_EQ(reply.get().getBody().which(), wire::Header::Body::PULL_REPLY);
  EXPECT_EQ(reply.get().getRequestId(), 3u);
  EXPECT_EQ(reply.get().getBody().getPullReply().getClockLag(), 0);
  EXPECT_EQ(core->held_pulls(), 0u);
  EXPECT_EQ(core->stats().pulls_held, 1u);
}

TEST(StalenessTest, SspLetsAWorkerRunAheadByTheBoundOnly) {
  auto core = MakeCore({{"staleness", "2"}});
  // Worker 1 stays at clock 0. Worker 0 may pull at clocks 0, 1, 2 but not 3.
  for (int c = 1; c <= 2; ++c) {
    ASSERT_EQ(Send(*core, "w0", ClockTick(10 + c, 0, c)).size(), 1u);
    std::vector<Outgoing> out = Send(*core, "w0", RangePull(20 + c, 0, 0, 4, 0, c));
    ASSERT_EQ(out.size(), 1u) << "clock " << c;
    EXPECT_EQ(ReplyHeader(out[0].frames).get().getBody().getPullReply().getClockLag(), c);
  }
  ASSERT_EQ(Send(*core, "w0", ClockTick(13, 0, 3)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(23, 0, 0, 4, 0, 3)).empty());
  EXPECT_EQ(core->stats().max_clock_lag, 2);
  // A tick of the slow worker to 1 releases it (lag 2 again).
  std::vector<Outgoing> out = Send(*core, "w1", ClockTick(30, 1, 1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(ReplyHeader(out[1].frames).get().getBody().getPullReply().getClockLag(), 2);
  EXPECT_LE(core->stats().max_clock_lag, 2);
}

TEST(StalenessTest, AspNeverHolds) {
  auto core = MakeCore({{"staleness", "-1"}});
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 100)).size(), 1u);
  ASSERT_EQ(Send(*core, "w0", RangePull(2, 0, 0, 4, 0, 100)).size(), 1u);
  EXPECT_EQ(core->stats().pulls_held, 0u);
}

TEST(StalenessTest, PerTableBoundsOverrideTheJobBound) {
  auto core = MakeCore({{"staleness", "0"}, {"table_staleness", "b:-1"}});
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 1)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(2, 0, 0, 4, 0, 1)).empty());   // a: BSP
  EXPECT_EQ(Send(*core, "w0", RangePull(3, 1, 0, 4, 0, 1)).size(), 1u);  // b: ASP
}

TEST(StalenessTest, AWorkerThatLeavesIsNotWaitedOn) {
  auto core = MakeCore({{"staleness", "0"}});
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 5)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(2, 0, 0, 4, 0, 5)).empty());
  std::vector<Outgoing> out = Send(*core, "w1", ClockTick(3, 1, 0, /*leave=*/true));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(ReplyHeader(out[1].frames).get().getRequestId(), 2u);
}

TEST(StalenessTest, AHeldPullTimesOutNamingTheWorkerItWaitsOn) {
  auto core = MakeCore({{"staleness", "0"}, {"staleness_wait_seconds", "5"}});
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 1)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(7, 0, 0, 4, 0, 1)).empty());
  std::vector<Outgoing> out;
  core->ExpireHeldPulls(ServerCore::Clock::now() + std::chrono::seconds(1), &out);
  EXPECT_TRUE(out.empty()) << "expired before its time";
  core->ExpireHeldPulls(ServerCore::Clock::now() + std::chrono::seconds(6), &out);
  ASSERT_EQ(out.size(), 1u);
  Status s = ReplyStatus(out[0].frames);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("for worker 1"), std::string::npos) << s.message();
  EXPECT_EQ(ReplyHeader(out[0].frames).get().getRequestId(), 7u);
  EXPECT_EQ(core->held_pulls(), 0u);
}

TEST(StalenessTest, BadPullsAreRefusedRatherThanHeld) {
  auto core = MakeCore({{"staleness", "0"}});
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 1)).size(), 1u);
  auto out = Send(*core, "w0", RangePull(2, 0, 0, 9, 0, 1));  // rows past the table
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ReplyStatus(out[0].frames).code(), StatusCode::kInvalidArgument);
  // Not a worker id (ids past num_workers are workers that joined a running job).
  out = Send(*core, "x", RangePull(3, 0, 0, 4, /*worker=*/1 << 20, 0));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_NE(ReplyStatus(out[0].frames).message().find("not a worker"), std::string::npos);
  out = Send(*core, "x", ClockTick(4, 1 << 20, 1));
  EXPECT_EQ(ReplyStatus(out[0].frames).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core->held_pulls(), 0u);
}

TEST(StalenessTest, GradientStalenessIsVersionsSinceThePull) {
  auto core = MakeCore({});
  std::vector<float> g(8, 1.0f);
  // Three pushes computed from version 0: staleness 0, 1, 2.
  for (uint64_t i = 0; i < 3; ++i) {
    auto out = Send(*core, "w0", VersionedPush(i, 0, 0, 4, g, 0, 0, 0));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(ReplyHeader(out[0].frames).get().getBody().getPushReply().getStaleness(), i);
  }
  auto pull = Send(*core, "w0", RangePull(9, 0, 0, 4));
  EXPECT_EQ(ReplyHeader(pull[0].frames).get().getBody().getPullReply().getVersion(), 3u);
  ServerStats st = core->stats();
  EXPECT_EQ(st.staleness_max, 2u);
  EXPECT_EQ(st.staleness_sum, 3u);
  EXPECT_EQ(st.staleness_histogram[0], 1u);
  EXPECT_EQ(st.staleness_histogram[2], 1u);
  // A version from the future is refused.
  auto bad = Send(*core, "w0", VersionedPush(10, 0, 0, 4, g, 0, 0, 99));
  EXPECT_EQ(ReplyStatus(bad[0].frames).code(), StatusCode::kInvalidArgument);
}

TEST(StalenessTest, TooStaleGradientsAreDroppedUnderAsp) {
  auto core = MakeCore({{"staleness", "-1"}, {"max_grad_staleness", "1"}});
  std::vector<float> g(8, 1.0f);
  for (uint64_t i = 0; i < 3; ++i) (void)Send(*core, "w0", VersionedPush(i, 0, 0, 4, g, 0, 0, 0));
  auto out = Send(*core, "w0", VersionedPush(5, 0, 0, 4, g, 0, 0, 0));  // staleness 2 > 1
  auto reply = ReplyHeader(out[0].frames);
  EXPECT_TRUE(reply.get().getBody().getPushReply().getDropped());
  ServerStats st = core->stats();
  EXPECT_EQ(st.pushes_dropped, 2u);  // the third (staleness 2) and this one
  EXPECT_EQ(st.pushes_applied, 2u);
  EXPECT_EQ(core->ReadRow(0, 0).value()[0], -2.0f);
}

TEST(StalenessTest, StalenessAwareLearningRateDividesByStaleness) {
  auto core = MakeCore({{"staleness_lr", "inverse"}, {"base_lr", "0.5"}});
  std::vector<float> g(8, 1.0f);
  std::vector<double> rates;
  for (uint64_t i = 0; i < 4; ++i) {
    auto out = Send(*core, "w0", VersionedPush(i, 0, 0, 4, g, 0, 0, 0));
    rates.push_back(ReplyHeader(out[0].frames).get().getBody().getPushReply().getLearningRate());
  }
  EXPECT_DOUBLE_EQ(rates[0], 0.5);   // fresh: the whole rate
  EXPECT_DOUBLE_EQ(rates[1], 0.25);  // one update old: half
  EXPECT_FLOAT_EQ(static_cast<float>(rates[2]), 0.5f / 3);
  EXPECT_DOUBLE_EQ(rates[3], 0.125);
  EXPECT_FLOAT_EQ(core->ReadRow(0, 0).value()[0], -(0.5f + 0.25f + 0.5f / 3 + 0.125f));
}

// --pull_lookahead: once pushes arrive stale, a pull of a nesterov table returns where the
// velocity carries the rows over (lookahead x recent staleness) updates; the stored values
// do not move, and without the setting (or with fresh pushes) a pull returns them as stored.
// A 16-bit pull returns the same rows, rounded.
TEST(StalenessTest, PullLookaheadReturnsWhereTheVelocityCarriesTheRows) {
  auto pulled_after = [](const std::string& lookahead, uint64_t stale_by) {
    auto core = MakeCore({{"staleness", "-1"},
                          {"optimizer", "nesterov"},
                          {"momentum", "0.5"},
                          {"pull_lookahead", lookahead}});
    std::vector<float> g(8, 1.0f);
    for (uint64_t i = 0; i < 1000; ++i) {
      const uint64_t pulled = i >= stale_by ? i - stale_by : 0;
      EXPECT_EQ(Send(*core, "w0", VersionedPush(i, 0, 0, 4, g, 0, 0, pulled)).size(), 1u);
    }
    auto out = Send(*core, "w0", RangePull(5000, 0, 0, 4, 0, 0));
    EXPECT_EQ(out.size(), 1u);
    const std::vector<float> pulled = testing::ReplyFloats(out[0].frames);
    // A bf16 pull (--pull_dtype) gets the same rows rounded to bf16.
    auto narrow =
        Send(*core, "w0", RangePull(5001, 0, 0, 4, 0, 0, static_cast<uint8_t>(WireDtype::kBf16)));
    EXPECT_EQ(narrow.size(), 1u);
    std::vector<float> got(pulled.size()), expected(pulled.size());
    std::vector<uint16_t> half(pulled.size());
    DecodeFloats(narrow[0].frames.at(1).data(), WireDtype::kBf16, got);
    EncodeFloats(pulled, WireDtype::kBf16, half.data());
    DecodeFloats(half.data(), WireDtype::kBf16, expected);
    EXPECT_EQ(got, expected) << "lookahead " << lookahead << ", stale by " << stale_by;
    return std::make_pair(pulled, core->ReadRow(0, 0).value()[0]);
  };
  auto [plain, stored_plain] = pulled_after("0", 1);
  EXPECT_EQ(plain[0], stored_plain) << "off: the stored values";
  auto [fresh, stored_fresh] = pulled_after("1", 0);
  EXPECT_EQ(fresh[0], stored_fresh) << "fresh pushes: nothing to look ahead over";
  auto [ahead, stored] = pulled_after("1", 1);
  // 1000 pushes of gradient 1 at lr 1, mu 0.5: the velocity is 2 (1 / (1 - mu)), the recent
  // staleness 1 (all but the first push), so one more update moves a value by
  // lr * mu^2 * v = 0.5 (nesterov), downhill.
  EXPECT_EQ(stored, stored_plain) << "the look-ahead does not change the model";
  EXPECT_NEAR(ahead[0], stored - 0.5f, 1e-3);
  auto [twice, stored_twice] = pulled_after("2", 1);
  EXPECT_NEAR(twice[0], stored_twice - 0.75f, 1e-3) << "two updates: 0.5 + 0.25";
}

// The schedule follows the job's steps (the workers' clocks added up), not the pushing
// worker's clock: under ASP a worker 90 clocks ahead of one at 10 is not 90% of the way
// down a 200-step schedule while the job has taken 100 steps.
TEST(StalenessTest, TheScheduleCountsTheJobsStepsNotTheFastWorkersClock) {
  // The rate of one push from `pusher` once worker 0 is at clock 90 and worker 1 at 10.
  auto rate_at_90_and_10 = [](std::map<std::string, std::string> flags, int32_t pusher) {
    flags.insert({{"staleness", "-1"}, {"lr_policy", "poly"}, {"power", "1"}, {"max_iter", "200"}});
    auto core = MakeCore(flags);
    EXPECT_EQ(Send(*core, "w0", ClockTick(1, 0, 90)).size(), 1u);
    EXPECT_EQ(Send(*core, "w1", ClockTick(2, 1, 10)).size(), 1u);
    auto out = Send(
        *core, "w",
        VersionedPush(3, 0, 0, 4, std::vector<float>(8, 1.0f), pusher, pusher == 0 ? 90 : 10, 0));
    EXPECT_EQ(out.size(), 1u);
    return ReplyHeader(out[0].frames).get().getBody().getPushReply().getLearningRate();
  };
  EXPECT_DOUBLE_EQ(rate_at_90_and_10({}, 0), 1.0 - 100.0 / 200.0);
  // With --global_batch_size the schedule counts global batches: 100 steps of 2 workers.
  EXPECT_DOUBLE_EQ(rate_at_90_and_10({{"global_batch_size", "128"}}, 1), 1.0 - 50.0 / 200.0);
}

// The schedule counts batches: a clock of an all-reduce group's leader covers its members'
// batches (its ticks say how many), and a worker that rejoins at the slowest clock adds none
// for the clocks it skipped. A tick that claims more batches than workers is refused.
TEST(StalenessTest, TheScheduleCountsAGroupLeadersClockAsItsGroupsBatches) {
  // The rate of a push after `ticks` sends its clock ticks.
  auto rate_after = [](const std::function<void(ServerCore&)>& ticks) {
    auto core =
        MakeCore({{"staleness", "-1"}, {"lr_policy", "poly"}, {"power", "1"}, {"max_iter", "200"}});
    ticks(*core);
    auto out = Send(*core, "w", VersionedPush(100, 0, 0, 4, std::vector<float>(8, 1), 0, 0, 0));
    EXPECT_EQ(out.size(), 1u);
    return ReplyHeader(out[0].frames).get().getBody().getPushReply().getLearningRate();
  };
  auto tick = [](ServerCore& core, Frames f) {
    EXPECT_EQ(Send(core, "w", std::move(f)).size(), 1u);
  };
  // Worker 1 is worker 0's group member: out of the clock table; 50 group clocks = 100 batches.
  EXPECT_FLOAT_EQ(rate_after([&](ServerCore& c) {
                    tick(c, ClockTick(1, 1, 0, /*leave=*/true));
                    tick(c, ClockTick(2, 0, 50, false, /*batches=*/2));
                  }),
                  1.0 - 100.0 / 200.0);
  // Worker 1 left, rejoins (adopting clock 50) and ticks once: 51 batches, not 101.
  EXPECT_FLOAT_EQ(rate_after([&](ServerCore& c) {
                    tick(c, ClockTick(1, 1, 0, true));
                    tick(c, ClockTick(2, 0, 50));
                    tick(c, ClockTick(3, 1, 0));
                    tick(c, ClockTick(4, 1, 51));
                  }),
                  1.0 - 51.0 / 200.0);
  auto core = MakeCore({{"staleness", "-1"}});
  Status refused = ReplyStatus(Send(*core, "w0", ClockTick(1, 0, 5, false, 3))[0].frames);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("covers 3 batches"), std::string::npos) << refused.message();
  EXPECT_EQ(core->worker_clock(0), 0) << "a refused tick changes nothing";
}

// Found by fuzz_server_core: clock arithmetic must not overflow, and a finite but huge
// gradient must not drive momentum or the weights to infinity.
TEST(StalenessTest, ClocksAndGradientsOutOfRangeAreRefused) {
  auto core = MakeCore({{"optimizer", "nesterov"}, {"staleness", "-1"}});
  std::vector<float> g(8, 1.0f);
  auto out = Send(*core, "w0", VersionedPush(1, 0, 0, 4, g, 0, int64_t{1} << 62, 0));
  EXPECT_EQ(ReplyStatus(out[0].frames).code(), StatusCode::kInvalidArgument);
  out = Send(*core, "w0", RangePull(2, 0, 0, 4, 0, INT64_MIN));
  EXPECT_EQ(ReplyStatus(out[0].frames).code(), StatusCode::kInvalidArgument);
  out = Send(*core, "w0", ClockTick(3, 0, INT64_MAX));
  EXPECT_EQ(ReplyStatus(out[0].frames).code(), StatusCode::kInvalidArgument);
  std::vector<float> huge(8, -3e38f);
  out = Send(*core, "w0", VersionedPush(4, 0, 0, 4, huge, 0, 0, 0));
  Status s = ReplyStatus(out[0].frames);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beyond the limit"), std::string::npos) << s.message();
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(core->ReadRow(0, r).value()[0], 0.0f);
  EXPECT_EQ(core->stats().pushes_applied, 0u);
}

// --softsync=2: two pushes make one update of their mean; a pull between them sees neither.
TEST(StalenessTest, SoftSyncAppliesTheMeanOfCPushesAsOneUpdate) {
  auto core = MakeCore({{"staleness", "-1"}, {"softsync", "2"}});
  ASSERT_TRUE(
      ReplyStatus(
          Send(*core, "w0", VersionedPush(1, 0, 0, 4, std::vector<float>(8, 1), 0, 0, 0))[0].frames)
          .ok());
  std::vector<Outgoing> pulled = Send(*core, "w1", RangePull(2, 0, 0, 4, 1, 0));
  ASSERT_EQ(pulled.size(), 1u);
  EXPECT_EQ(testing::ReplyFloats(pulled[0].frames), std::vector<float>(8, 0)) << "in the sum";
  ASSERT_TRUE(
      ReplyStatus(
          Send(*core, "w1", VersionedPush(3, 0, 0, 4, std::vector<float>(8, 3), 1, 0, 0))[0].frames)
          .ok());
  pulled = Send(*core, "w1", RangePull(4, 0, 0, 4, 1, 0));
  ASSERT_EQ(pulled.size(), 1u);
  EXPECT_EQ(testing::ReplyFloats(pulled[0].frames), std::vector<float>(8, -2)) << "lr 1 x mean 2";
  EXPECT_EQ(ReplyHeader(pulled[0].frames).get().getBody().getPullReply().getVersion(), 1u)
      << "the version counts updates";
  EXPECT_EQ(core->stats().pushes_applied, 2u);
}

// BSP with --softsync=2: worker 1 pushes nothing to table a in clock 0; its tick releases
// worker 0's pull, which must see worker 0's own clock-0 push (a half share of one update).
TEST(StalenessTest, SoftSyncAppliesASumBeforeAPullThatMustSeeIt) {
  auto core = MakeCore({{"staleness", "0"}, {"softsync", "2"}});
  ASSERT_TRUE(
      ReplyStatus(
          Send(*core, "w0", VersionedPush(1, 0, 0, 4, std::vector<float>(8, 1), 0, 0, 0))[0].frames)
          .ok());
  ASSERT_EQ(Send(*core, "w0", ClockTick(2, 0, 1)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(3, 0, 0, 4, 0, 1)).empty()) << "BSP holds it";
  std::vector<Outgoing> out = Send(*core, "w1", ClockTick(4, 1, 1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(testing::ReplyFloats(out[1].frames), std::vector<float>(8, -0.5f));
}

// Worker 1's clock-0 push waits in a --softsync=2 sum, then both workers tick past clock 0.
// Returns table a's row 0 as worker 0 pulls it at clock 1.
float RowAfterTheSlowestWorkerPassesASum(ServerCore& core) {
  EXPECT_TRUE(
      ReplyStatus(
          Send(core, "w1", VersionedPush(1, 0, 0, 4, std::vector<float>(8, 1), 1, 0, 0))[0].frames)
          .ok());
  EXPECT_EQ(Send(core, "w0", ClockTick(2, 0, 1)).size(), 1u);
  EXPECT_EQ(Send(core, "w1", ClockTick(3, 1, 1)).size(), 1u);
  std::vector<Outgoing> pulled = Send(core, "w0", RangePull(4, 0, 0, 4, 0, 1));
  EXPECT_EQ(pulled.size(), 1u);
  return pulled.empty() ? NAN : testing::ReplyFloats(pulled[0].frames)[0];
}

// SSP: a pull at clock 1 must see every push of clock 0, so the slowest worker's tick applies
// the sum early, as its share (1/2) of one update. ASP: no pull waits on clocks, so the sum
// waits for its second push and the update is the mean of two.
TEST(StalenessTest, UnderAspASoftSyncSumWaitsForItsCPushesNotForTheSlowestClock) {
  auto ssp = MakeCore({{"staleness", "2"}, {"softsync", "2"}});
  EXPECT_EQ(RowAfterTheSlowestWorkerPassesASum(*ssp), -0.5f);
  auto asp = MakeCore({{"staleness", "-1"}, {"softsync", "2"}});
  EXPECT_EQ(RowAfterTheSlowestWorkerPassesASum(*asp), 0.0f) << "still in the sum";
  ASSERT_TRUE(
      ReplyStatus(
          Send(*asp, "w0", VersionedPush(5, 0, 0, 4, std::vector<float>(8, 3), 0, 1, 0))[0].frames)
          .ok());
  EXPECT_EQ(asp->ReadRow(0, 0).value()[0], -2.0f) << "lr 1 x mean 2";
}

// A checkpoint holds every acknowledged push: under ASP what waits in a sum is applied first.
TEST(StalenessTest, AnAspSoftSyncSumIsAppliedBeforeACheckpoint) {
  const std::string dir = ::testing::TempDir() + "/asp_softsync_checkpoint";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto core = MakeCore({{"staleness", "-1"}, {"softsync", "2"}});
  ASSERT_TRUE(
      ReplyStatus(
          Send(*core, "w0", VersionedPush(1, 0, 0, 4, std::vector<float>(8, 1), 0, 0, 0))[0].frames)
          .ok());
  EXPECT_EQ(core->ReadRow(0, 0).value()[0], 0.0f);
  ASSERT_TRUE(core->WriteCheckpointTo(dir, 0).ok());
  EXPECT_EQ(core->ReadRow(0, 0).value()[0], -0.5f) << "its share of one update";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps
