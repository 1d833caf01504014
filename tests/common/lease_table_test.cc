#include "common/lease_table.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

TEST(LeaseTableTest, EveryExampleOfEveryEpochIsLeasedOnce) {
  LeaseTable t(/*epochs=*/3, /*chunk_examples=*/100);
  ASSERT_TRUE(t.SetDatasetSize(1050).ok());
  EXPECT_EQ(t.chunks_per_epoch(), 11u);
  std::vector<std::vector<int>> covered(3, std::vector<int>(1050, 0));
  int worker = 0;
  while (auto lease = t.Acquire(worker)) {
    for (uint64_t i = lease->begin; i < lease->end; ++i) ++covered[lease->epoch - 1][i];
    ASSERT_TRUE(t.Complete(worker, lease->epoch, lease->chunk).ok());
    worker = (worker + 1) % 3;
  }
  EXPECT_TRUE(t.AllDone());
  for (const auto& epoch : covered) {
    for (int c : epoch) EXPECT_EQ(c, 1);
  }
  EXPECT_EQ(t.examples_per_epoch(), (std::vector<uint64_t>{1050, 1050, 1050}));
  EXPECT_EQ(t.TakeCompletedEpochs(), (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(t.TakeCompletedEpochs().empty());
}

TEST(LeaseTableTest, TheNextEpochOpensOnceTheLastChunkIsHandedOut) {
  LeaseTable t(2, 10);
  ASSERT_TRUE(t.SetDatasetSize(20).ok());
  auto a = t.Acquire(0);
  auto b = t.Acquire(1);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->epoch, 1);
  EXPECT_EQ(b->epoch, 1);
  // Epoch 1 is all handed out (not completed): worker 0 may start epoch 2.
  auto c = t.Acquire(0);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->epoch, 2);
  EXPECT_TRUE(t.TakeCompletedEpochs().empty());
}

TEST(LeaseTableTest, ALeavingWorkersChunksGoBackToTheFrontOfTheQueue) {
  LeaseTable t(1, 10);
  ASSERT_TRUE(t.SetDatasetSize(50).ok());
  auto a = t.Acquire(0);
  auto b = t.Acquire(1);
  auto c = t.Acquire(1);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(t.Release(1), 2);
  EXPECT_EQ(t.outstanding(), 1u);
  auto d = t.Acquire(0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->chunk, b->chunk);  // the returned chunks come first, in order
  // A worker cannot complete a chunk it does not hold.
  EXPECT_EQ(t.Complete(1, c->epoch, c->chunk).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.Complete(0, a->epoch, a->chunk).ok());
  ASSERT_TRUE(t.Complete(0, d->epoch, d->chunk).ok());
  while (auto l = t.Acquire(2)) ASSERT_TRUE(t.Complete(2, l->epoch, l->chunk).ok());
  EXPECT_TRUE(t.AllDone());
  EXPECT_EQ(t.examples_per_epoch()[0], 50u);
}

TEST(LeaseTableTest, WorkersMustAgreeOnTheDataSetSize) {
  LeaseTable t(1, 10);
  EXPECT_FALSE(t.Acquire(0).has_value());  // nothing before the size is known
  EXPECT_FALSE(t.SetDatasetSize(0).ok());
  ASSERT_TRUE(t.SetDatasetSize(30).ok());
  Status s = t.SetDatasetSize(31);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("31"), std::string::npos);
}

TEST(LeaseTableTest, ARestoredJobStartsAtItsEpochAndTrainsOnlyTheRemainingOnes) {
  LeaseTable t(4, 10);
  t.StartAtEpoch(3);
  ASSERT_TRUE(t.SetDatasetSize(20).ok());
  std::vector<int> epochs;
  while (auto l = t.Acquire(0)) {
    epochs.push_back(l->epoch);
    ASSERT_TRUE(t.Complete(0, l->epoch, l->chunk).ok());
  }
  EXPECT_EQ(epochs, (std::vector<int>{3, 3, 4, 4}));
  EXPECT_TRUE(t.AllDone());
  EXPECT_EQ(t.TakeCompletedEpochs(), (std::vector<int>{3, 4}));
  EXPECT_EQ(t.examples_per_epoch(), (std::vector<uint64_t>{0, 0, 20, 20}));
}

}  // namespace
}  // namespace ps
