#include "server/softsync.h"

#include <gtest/gtest.h>

#include <climits>
#include <vector>

namespace ps {
namespace {

// One dense table of 2 rows x 2 floats held here, one sparse table.
SoftSync Make(int c) { return SoftSync(c, {RowRange{0, 2}, RowRange{}}, {2, 1}, {true, false}); }

TEST(SoftSyncTest, OneOrFewerBatchesPerUpdateIsOff) {
  EXPECT_FALSE(Make(1).enabled());
  EXPECT_FALSE(Make(1).sums(0));
  EXPECT_TRUE(Make(2).sums(0));
  EXPECT_FALSE(Make(2).sums(1)) << "sparse tables are applied as they come";
}

TEST(SoftSyncTest, CPushesMakeOneUpdateOfTheirMean) {
  SoftSync s = Make(2);
  const std::vector<float> a = {1, 2, 3, 4}, b = {3, 4, 5, 6};
  s.Add(0, RowRange{0, 2}, a, /*clock=*/5, true);
  EXPECT_FALSE(s.Due(0, /*min_live_clock=*/5)) << "one push of two, none of a passed clock";
  s.Add(0, RowRange{0, 2}, b, 6, true);
  ASSERT_TRUE(s.Due(0, 5));
  SoftSync::Pending p = s.TakeMean(0);
  EXPECT_EQ(std::vector<float>(p.mean.begin(), p.mean.end()), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_EQ(p.batches, 2u);
  s.Clear(0);
  EXPECT_TRUE(s.empty(0));
  EXPECT_FALSE(s.Due(0, INT64_MAX));
}

TEST(SoftSyncTest, APushOfAClockTheSlowestWorkerPassedIsDueAndWeighsItsShare) {
  SoftSync s = Make(4);
  const std::vector<float> g = {4, 8, 12, 16};
  s.Add(0, RowRange{0, 2}, g, /*clock=*/3, true);
  EXPECT_FALSE(s.Due(0, 3));
  EXPECT_TRUE(s.Due(0, 4)) << "a pull at clock 4 + S must see the pushes of clock 3";
  SoftSync::Pending p = s.TakeMean(0);
  EXPECT_EQ(std::vector<float>(p.mean.begin(), p.mean.end()), (std::vector<float>{1, 2, 3, 4}))
      << "one push of four: a quarter of a global batch's step";
}

// An ASP table (bound -1) has no clock rule: only c pushes, or no live worker, apply it.
TEST(SoftSyncTest, AnAspTablesSumIgnoresTheSlowestClock) {
  SoftSync s(4, {RowRange{0, 2}, RowRange{}}, {2, 1}, {true, false}, /*staleness=*/{-1, -1});
  EXPECT_FALSE(s.clock_rule(0));
  s.Add(0, RowRange{0, 2}, std::vector<float>{4, 8, 12, 16}, /*clock=*/3, true);
  EXPECT_FALSE(s.Due(0, 4)) << "the slowest clock passed it; ASP needs no flush";
  EXPECT_TRUE(s.Due(0, INT64_MAX)) << "no live worker: apply what is there";
}

// An all-reduce group's leader pushes the sum of its G members' batch gradients: with c = 4
// (four workers in two groups of two) two such pushes make the update, the mean of 4 batches.
TEST(SoftSyncTest, AGroupsPushCountsItsBatches) {
  SoftSync s = Make(4);
  s.Add(0, RowRange{0, 2}, std::vector<float>{2, 2, 2, 2}, 0, true, /*batches=*/2);
  EXPECT_FALSE(s.Due(0, 0)) << "2 batches of 4";
  s.Add(0, RowRange{0, 2}, std::vector<float>{6, 6, 6, 6}, 0, true, /*batches=*/2);
  ASSERT_TRUE(s.Due(0, 0));
  SoftSync::Pending p = s.TakeMean(0);
  EXPECT_EQ(p.batches, 4u);
  EXPECT_EQ(std::vector<float>(p.mean.begin(), p.mean.end()), (std::vector<float>{2, 2, 2, 2}));
}

TEST(SoftSyncTest, ChunksAddUpAndCountAsOnePush) {
  SoftSync s = Make(2);
  const std::vector<float> first = {1, 1}, second = {2, 2};
  s.Add(0, RowRange{0, 1}, first, 1, /*last_chunk=*/false);
  s.Add(0, RowRange{1, 2}, second, 1, true);
  s.Add(0, RowRange{0, 2}, std::vector<float>{1, 1, 2, 2}, 1, true);
  ASSERT_TRUE(s.Due(0, 0));
  SoftSync::Pending p = s.TakeMean(0);
  EXPECT_EQ(p.batches, 2u);
  EXPECT_EQ(std::vector<float>(p.mean.begin(), p.mean.end()), (std::vector<float>{1, 1, 2, 2}));
  EXPECT_EQ(p.counts[0], 2u);
}

// --staleness_lr: each push joins the sum times its own weight; the batches still count
// whole towards c, so a stale push takes a smaller share of the update, not a bigger one
// of the fresh pushes'.
TEST(SoftSyncTest, APushJoinsTheSumTimesItsWeight) {
  SoftSync s = Make(2);
  s.Add(0, RowRange{0, 2}, std::vector<float>{2, 2, 2, 2}, 0, true, 1, /*weight=*/1.0f);
  EXPECT_FALSE(s.Due(0, 0));
  s.Add(0, RowRange{0, 2}, std::vector<float>{4, 4, 8, 8}, 0, true, 1, /*weight=*/0.5f);
  ASSERT_TRUE(s.Due(0, 0)) << "a weighted push still counts one batch";
  SoftSync::Pending p = s.TakeMean(0);
  EXPECT_EQ(std::vector<float>(p.mean.begin(), p.mean.end()), (std::vector<float>{2, 2, 3, 3}))
      << "(2 + 0.5 x 4) / 2 and (2 + 0.5 x 8) / 2";
}

}  // namespace
}  // namespace ps
