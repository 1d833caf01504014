// The coordinator's lease desk: requests held until a chunk is free, `wait` for those that
// may not wait, `finished` at the end, evaluations for the evaluator, and the batch sizes
// of --batch_size=auto.
#include "server/coord_leases.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

LeaseDeskOptions Options(bool auto_batch = false) {
  LeaseDeskOptions o;
  o.epochs = 2;
  o.chunk_examples = 10;
  o.batch_size = 8;
  o.auto_batch = auto_batch;
  return o;
}

TEST(CoordLeases, HoldsAnswersAndFinishes) {
  LeaseDesk desk(Options());
  ASSERT_TRUE(desk.table().SetDatasetSize(20).ok());  // 2 chunks per epoch
  const std::vector<bool> live = {true, true};
  desk.Hold({"w0", 1, 0, true});
  desk.Hold({"w1", 2, 1, true});
  std::vector<LeaseAnswer> a = desk.Answer(0, live);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_TRUE(a[0].chunk && a[1].chunk);
  EXPECT_EQ(a[0].peer, "w0");
  EXPECT_EQ(a[0].batch_size, 8u);
  EXPECT_EQ(a[0].chunk->epoch, 1);
  // Epoch 2 opened once epoch 1 was handed out: two more chunks, then none.
  desk.Hold({"w0", 3, 0, true});
  desk.Hold({"w1", 4, 1, true});
  ASSERT_EQ(desk.Answer(0, live).size(), 2u);
  desk.Hold({"w0", 5, 0, true});
  desk.Hold({"w1", 6, 1, false});
  a = desk.Answer(0, live);
  ASSERT_EQ(a.size(), 1u);  // w0 is held
  EXPECT_EQ(a[0].request_id, 6u);
  EXPECT_TRUE(a[0].wait);
  // Epoch 1 completes: its evaluation goes to the evaluator with its next answer.
  Result<std::vector<int>> done = desk.Complete(0, 1, 0);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->empty());
  done = desk.Complete(1, 1, 1);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(*done, (std::vector<int>{1}));
  EXPECT_FALSE(desk.Complete(1, 1, 1).ok());  // not held any more
  // Worker 1 leaves with its epoch-2 chunk: it goes back, and the held w0 gets it.
  EXPECT_EQ(desk.Release(1), 1);
  a = desk.Answer(0, live);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].request_id, 5u);
  ASSERT_TRUE(a[0].chunk);
  EXPECT_EQ(a[0].evaluate_epoch, 1);
  ASSERT_TRUE(desk.Complete(0, 2, 0).ok());
  ASSERT_TRUE(desk.Complete(0, 2, 1).ok());
  desk.Hold({"w0", 7, 0, true});
  a = desk.Answer(0, live);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_TRUE(a[0].finished);
  EXPECT_FALSE(a[0].evaluate_epoch);  // the last epoch's is the final evaluation
}

TEST(CoordLeases, AutoBatchFollowsThroughput) {
  LeaseDesk desk(Options(true));
  const std::vector<bool> live = {true, true};
  EXPECT_EQ(desk.BatchSizeFor(0, live), 8u);  // no rates yet
  desk.SetRate(0, 300);
  EXPECT_EQ(desk.BatchSizeFor(0, live), 8u);  // worker 1's is unknown
  desk.SetRate(1, 100);
  EXPECT_EQ(desk.BatchSizeFor(0, live), 12u);  // 8 x 2 x 300 / 400
  EXPECT_EQ(desk.BatchSizeFor(1, live), 4u);
  EXPECT_EQ(desk.BatchSizeFor(0, {true, false}), 8u);  // alone: the mean
}

}  // namespace
}  // namespace ps
