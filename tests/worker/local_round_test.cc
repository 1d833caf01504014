// LocalRound (--local_steps): the round's gradients add up, the copy moves by SGD between
// its steps, and the round's sum is what is left to push, after T steps or when it ends
// early; a dropped round leaves nothing behind.
#include "worker/local_round.h"

#include <gtest/gtest.h>

#include <vector>

namespace ps {
namespace {

JobConfig Config(int local_steps, const char* lr_policy = "fixed") {
  return JobConfig::FromFlagMap({{"local_steps", std::to_string(local_steps)},
                                 {"base_lr", "0.5"},
                                 {"lr_policy", lr_policy},
                                 {"warmup_iters", "0"},
                                 {"num_workers", "2"}})
      .value();
}

struct Buffers {
  std::vector<float> w{1, 2}, b{3};
  std::vector<float> gw{0, 0}, gb{0};
  std::vector<std::span<float>> params() { return {w, b}; }
  std::vector<std::span<float>> grads() { return {gw, gb}; }
  void SetGrads(float x, float y, float z) { gw = {x, y}, gb = {z}; }
};

TEST(LocalRoundTest, StepsMoveTheCopyAndTheLastLeavesTheSumToPush) {
  const JobConfig config = Config(3);
  LocalRound round(config);
  ASSERT_TRUE(round.active());
  Buffers m;
  EXPECT_TRUE(round.starting());
  m.SetGrads(1, 2, 4);
  EXPECT_FALSE(round.Add(m.params(), m.grads(), 0.5f));
  EXPECT_FALSE(round.starting());
  EXPECT_EQ(m.w, (std::vector<float>{0.5f, 1.0f}));
  EXPECT_EQ(m.b, (std::vector<float>{1.0f}));
  m.SetGrads(-1, 0, 2);
  EXPECT_FALSE(round.Add(m.params(), m.grads(), 0.25f));
  EXPECT_EQ(m.w, (std::vector<float>{0.75f, 1.0f}));
  m.SetGrads(0.5f, 1, 1);
  EXPECT_TRUE(round.Add(m.params(), m.grads(), 0.25f));
  // The last step pushes: the copy stays (the next round pulls), the sum is in the grads.
  EXPECT_EQ(m.w, (std::vector<float>{0.75f, 1.0f}));
  EXPECT_EQ(m.gw, (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ(m.gb, (std::vector<float>{7.0f}));
  EXPECT_TRUE(round.starting());
  // A new round starts from zero.
  m.SetGrads(1, 1, 1);
  EXPECT_FALSE(round.Add(m.params(), m.grads(), 0));
  EXPECT_TRUE(round.Finish(m.grads()));
  EXPECT_EQ(m.gw, (std::vector<float>{1.0f, 1.0f}));
}

TEST(LocalRoundTest, FinishWithoutAStepPushesNothingAndDropForgets) {
  LocalRound round(Config(4));
  Buffers m;
  EXPECT_FALSE(round.Finish(m.grads()));
  m.SetGrads(1, 2, 3);
  EXPECT_FALSE(round.Add(m.params(), m.grads(), 0));
  round.Drop();
  EXPECT_TRUE(round.starting());
  EXPECT_FALSE(round.Finish(m.grads()));
  m.SetGrads(5, 5, 5);
  EXPECT_FALSE(round.Add(m.params(), m.grads(), 0));
  EXPECT_TRUE(round.Finish(m.grads()));
  EXPECT_EQ(m.gw, (std::vector<float>{5.0f, 5.0f})) << "the dropped step stayed in the sum";
}

TEST(LocalRoundTest, TheRateIsTheServersOrElseTheSchedulesAtTheClock) {
  LocalRound fixed(Config(2));
  EXPECT_FLOAT_EQ(fixed.Rate(0.125, 10), 0.125f);
  EXPECT_FLOAT_EQ(fixed.Rate(0, 10), 0.5f);
  // exp with gamma 0.5: at clock 1 of 2 workers' rounds of 2 steps, iteration 4.
  JobConfig config = Config(2, "exp");
  config.gamma = 0.5;
  LocalRound exp(config);
  EXPECT_FLOAT_EQ(exp.Rate(0, 1), 0.5f * 0.0625f);
  EXPECT_FALSE(LocalRound(Config(1)).active());
  // Nesterov moves a row by lr x (1 + momentum) x g on a new gradient: so does a local step.
  JobConfig nesterov = Config(2);
  nesterov.optimizer = "nesterov";
  nesterov.momentum = 0.5;
  EXPECT_FLOAT_EQ(LocalRound(nesterov).Rate(0.125, 10), 0.1875f);
  nesterov.optimizer = "momentum";
  EXPECT_FLOAT_EQ(LocalRound(nesterov).Rate(0.125, 10), 0.125f);
}

}  // namespace
}  // namespace ps
