#include "common/divergence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ps {
namespace {

TEST(LossWatchTest, ALossPastTheRatioOfTheFirstIsDivergence) {
  LossWatch watch(10);
  EXPECT_FALSE(watch.OnLoss(2.3));
  EXPECT_FALSE(watch.OnLoss(22.9)) << "just under 10x";
  std::optional<std::string> why = watch.OnLoss(23.5);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("--divergence_loss_ratio=10"), std::string::npos) << *why;
}

TEST(LossWatchTest, ANonFiniteLossIsDivergenceEvenWithTheRatioOff) {
  LossWatch watch(0);
  EXPECT_FALSE(watch.OnLoss(2.3));
  EXPECT_FALSE(watch.OnLoss(1e6)) << "ratio 0: only non-finite losses count";
  EXPECT_TRUE(watch.OnLoss(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(watch.OnLoss(std::numeric_limits<double>::infinity()));
}

TEST(DivergenceTest, JsonRoundTripAndConsoleBlock) {
  Divergence d;
  d.reason = "table 'fc1.weight' has a gradient of 1e+20";
  d.worker = 3;
  d.clock = 17;
  d.table = "fc1.weight";
  d.advice = {"--base_lr=0.05 (half of 0.1)"};
  std::optional<Divergence> back = Divergence::FromJson(d.ToJson());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->reason, d.reason);
  EXPECT_EQ(back->worker, 3);
  EXPECT_EQ(back->clock, 17);
  EXPECT_EQ(back->table, d.table);
  EXPECT_FALSE(back->loss);
  EXPECT_EQ(back->advice, d.advice);
  EXPECT_FALSE(Divergence::FromJson(nlohmann::json::object()));
  const std::string text = d.Describe();
  EXPECT_NE(text.find("worker 3, clock 17"), std::string::npos) << text;
  EXPECT_NE(text.find("--base_lr=0.05"), std::string::npos) << text;
}

TEST(DivergenceTest, AdviceComesFromTheJobsOwnSettings) {
  JobConfig config;
  config.base_lr = 0.4;
  config.num_workers = 16;
  config.staleness = 2;
  std::vector<std::string> advice = DivergenceAdvice(config);
  ASSERT_FALSE(advice.empty());
  EXPECT_EQ(advice[0].rfind("--base_lr=0.2", 0), 0u) << advice[0];
  bool staleness_lr = false;
  for (const std::string& a : advice) staleness_lr |= a.rfind("--staleness_lr=sqrt", 0) == 0;
  EXPECT_TRUE(staleness_lr);
  config.staleness_lr = "sqrt";
  config.warmup_iters = 100;
  for (const std::string& a : DivergenceAdvice(config)) {
    EXPECT_EQ(a.find("--staleness_lr"), std::string::npos) << "already set: " << a;
    EXPECT_EQ(a.find("--warmup_iters"), std::string::npos) << "already set: " << a;
  }
}

}  // namespace
}  // namespace ps
