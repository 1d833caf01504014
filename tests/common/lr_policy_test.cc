// Each schedule at several iterations against its formula (Caffe's definitions, plus
// cosine), warmup, and staleness-aware scaling.
#include "common/lr_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>
#include <string>

namespace ps {
namespace {

constexpr double kRelTol = 1e-12;

// A validated config (as every process gets it) with base_lr 0.1 and `flags` on top.
LrPolicy Policy(std::map<std::string, std::string> flags) {
  flags.emplace("base_lr", "0.1");
  Result<JobConfig> config = JobConfig::FromFlagMap(flags);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  Result<LrPolicy> policy = LrPolicy::Create(config.value());
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return policy.value();
}

void ExpectRate(const LrPolicy& p, int64_t iter, double want) {
  EXPECT_NEAR(p.ScheduleRate(iter), want, kRelTol * std::abs(want) + 1e-300)
      << "iteration " << iter;
}

TEST(LrPolicyTest, Fixed) {
  LrPolicy p = Policy({{"lr_policy", "fixed"}});
  for (int64_t iter : {0, 1, 1000, 1000000}) ExpectRate(p, iter, 0.1);
}

TEST(LrPolicyTest, StepDropsEveryStepsize) {
  LrPolicy p = Policy({{"lr_policy", "step"}, {"gamma", "0.5"}, {"stepsize", "10"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 9, 0.1);
  ExpectRate(p, 10, 0.05);
  ExpectRate(p, 19, 0.05);
  ExpectRate(p, 20, 0.025);
  ExpectRate(p, 35, 0.0125);
}

TEST(LrPolicyTest, MultistepDropsWhenTheIterationReachesEachValue) {
  LrPolicy p = Policy({{"lr_policy", "multistep"}, {"gamma", "0.5"}, {"stepvalue", "5,10,20"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 4, 0.1);
  ExpectRate(p, 5, 0.05);  // a step value counts from its own iteration on
  ExpectRate(p, 9, 0.05);
  ExpectRate(p, 10, 0.025);
  ExpectRate(p, 19, 0.025);
  ExpectRate(p, 20, 0.0125);
  ExpectRate(p, 1000000, 0.0125);  // past the last value: stays
}

TEST(LrPolicyTest, Exp) {
  LrPolicy p = Policy({{"lr_policy", "exp"}, {"gamma", "0.99"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 1, 0.099);
  ExpectRate(p, 3, 0.1 * 0.99 * 0.99 * 0.99);
  ExpectRate(p, 500, 0.1 * std::pow(0.99, 500));
}

TEST(LrPolicyTest, Inv) {
  LrPolicy p = Policy({{"lr_policy", "inv"}, {"gamma", "0.01"}, {"power", "0.75"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 100, 0.1 * std::pow(2.0, -0.75));
  ExpectRate(p, 300, 0.1 * std::pow(4.0, -0.75));
  ExpectRate(p, 12345, 0.1 * std::pow(1 + 0.01 * 12345, -0.75));
}

TEST(LrPolicyTest, PolyReachesZeroAtMaxIter) {
  LrPolicy p = Policy({{"lr_policy", "poly"}, {"power", "2"}, {"max_iter", "100"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 50, 0.025);
  ExpectRate(p, 90, 0.1 * 0.1 * 0.1);
  ExpectRate(p, 99, 0.1 * 0.01 * 0.01);
  EXPECT_EQ(p.ScheduleRate(100), 0.0);
  EXPECT_EQ(p.ScheduleRate(1000), 0.0);
}

TEST(LrPolicyTest, PolyOfPowerZeroStillStopsAtMaxIter) {
  LrPolicy p = Policy({{"lr_policy", "poly"}, {"power", "0"}, {"max_iter", "100"}});
  ExpectRate(p, 99, 0.1);
  EXPECT_EQ(p.ScheduleRate(100), 0.0);
}

TEST(LrPolicyTest, CosineHalvesAtMidpointAndStaysZeroAfterMaxIter) {
  LrPolicy p = Policy({{"lr_policy", "cosine"}, {"max_iter", "100"}});
  ExpectRate(p, 0, 0.1);
  ExpectRate(p, 25, 0.05 * (1 + std::sqrt(0.5)));
  ExpectRate(p, 50, 0.05);
  ExpectRate(p, 75, 0.05 * (1 - std::sqrt(0.5)));
  ExpectRate(p, 30, 0.05 * (1 + std::cos(0.3 * std::numbers::pi)));
  EXPECT_NEAR(p.ScheduleRate(100), 0.0, 1e-18);
  EXPECT_NEAR(p.ScheduleRate(5000), 0.0, 1e-18);
}

TEST(LrPolicyTest, WarmupRampsLinearlyFromTheFirstIteration) {
  LrPolicy p = Policy({{"lr_policy", "fixed"}, {"warmup_iters", "4"}});
  ExpectRate(p, 0, 0.025);  // (0 + 1) / 4 of the rate
  ExpectRate(p, 1, 0.05);
  ExpectRate(p, 2, 0.075);
  ExpectRate(p, 3, 0.1);  // the last warmup iteration takes the full rate
  ExpectRate(p, 4, 0.1);
  ExpectRate(p, 100, 0.1);
}

TEST(LrPolicyTest, WarmupScalesTheScheduleItself) {
  LrPolicy p =
      Policy({{"lr_policy", "step"}, {"gamma", "0.5"}, {"stepsize", "2"}, {"warmup_iters", "4"}});
  ExpectRate(p, 1, 0.1 * 2 / 4);
  ExpectRate(p, 2, 0.05 * 3 / 4);
  ExpectRate(p, 4, 0.025);
}

TEST(LrPolicyTest, NegativeIterationCountsAsZero) {
  LrPolicy p = Policy({{"lr_policy", "exp"}, {"gamma", "0.5"}});
  ExpectRate(p, -3, 0.1);
}

TEST(LrPolicyTest, StalenessNoneLeavesTheRate) {
  LrPolicy p = Policy({{"lr_policy", "step"}, {"gamma", "0.5"}, {"stepsize", "10"}});
  EXPECT_DOUBLE_EQ(p.Rate(10, 0), 0.05);
  EXPECT_DOUBLE_EQ(p.Rate(10, 7), 0.05);
}

TEST(LrPolicyTest, StalenessInverse) {
  LrPolicy p = Policy(
      {{"lr_policy", "step"}, {"gamma", "0.5"}, {"stepsize", "10"}, {"staleness_lr", "inverse"}});
  EXPECT_DOUBLE_EQ(p.Rate(0, 0), 0.1);  // fresh: the whole rate
  EXPECT_DOUBLE_EQ(p.Rate(0, 1), 0.05);
  EXPECT_DOUBLE_EQ(p.Rate(0, 3), 0.025);
  EXPECT_DOUBLE_EQ(p.Rate(10, 4), 0.01);  // schedule and staleness together
  EXPECT_DOUBLE_EQ(p.Rate(0, -2), 0.1);
  EXPECT_DOUBLE_EQ(p.StalenessWeight(1), 0.5);
}

TEST(LrPolicyTest, StalenessSqrt) {
  LrPolicy p = Policy({{"lr_policy", "fixed"}, {"staleness_lr", "sqrt"}, {"warmup_iters", "2"}});
  EXPECT_DOUBLE_EQ(p.Rate(5, 0), 0.1);
  EXPECT_DOUBLE_EQ(p.Rate(5, 3), 0.05);
  EXPECT_DOUBLE_EQ(p.Rate(5, 8), 0.1 / 3);
  EXPECT_DOUBLE_EQ(p.Rate(0, 3), 0.025);  // warmup and staleness together
  EXPECT_DOUBLE_EQ(p.StalenessWeight(0), 1.0);
}

TEST(LrPolicyTest, StalenessNoneKeepsTheRate) {
  LrPolicy p = Policy({{"lr_policy", "fixed"}});
  EXPECT_DOUBLE_EQ(p.Rate(5, 7), 0.1);
  EXPECT_DOUBLE_EQ(p.StalenessWeight(7), 1.0);
}

TEST(LrPolicyTest, CreateRejectsWhatItCannotUse) {
  auto expect_invalid = [](JobConfig c, const std::string& mention) {
    Result<LrPolicy> p = LrPolicy::Create(c);
    ASSERT_FALSE(p.ok()) << mention;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(mention), std::string::npos) << p.status().ToString();
  };
  JobConfig unknown;
  unknown.lr_policy = "triangular";
  expect_invalid(unknown, "triangular");

  JobConfig no_steps;
  no_steps.lr_policy = "multistep";
  expect_invalid(no_steps, "stepvalue");

  JobConfig bad_steps;
  bad_steps.lr_policy = "multistep";
  bad_steps.stepvalue = "10,5";
  expect_invalid(bad_steps, "stepvalue");

  JobConfig bad_scaling;
  bad_scaling.staleness_lr = "log";
  expect_invalid(bad_scaling, "log");

  JobConfig zero_max_iter;
  zero_max_iter.lr_policy = "cosine";
  zero_max_iter.max_iter = 0;
  expect_invalid(zero_max_iter, "max_iter");
}

}  // namespace
}  // namespace ps
