// Kernels::ApplyUpdate on the CPU backend against the servers' own optimizer
// (common/optimizer.h) applied row by row: the same rows bit for bit, for every rule with
// clipping and weight decay on, over rows laid out with a stride (values, state, padding),
// and bad arguments refused; and the gradient check's scan, FlagOutOfRange. The CUDA backend is
// checked against this one in cuda_kernels_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/gradient_check.h"
#include "common/optimizer.h"
#include "kernels/kernels.h"

namespace ps {
namespace {

constexpr float kPadding = 12345.0f;  // what lies between one row's state and the next row

UpdateRule Rule(UpdateRule::Kind kind) {
  UpdateRule rule;
  rule.kind = kind;
  rule.weight_decay = 0.01f;
  rule.clip_grad_norm = 0.8;  // below most rows' norms here: the clip is exercised
  rule.momentum = 0.9f;
  rule.epsilon = 1e-6f;
  return rule;
}

TEST(UpdateKernelsTest, EveryRuleMovesTheRowsAsTheServersOptimizerDoes) {
  std::unique_ptr<Kernels> cpu = MakeKernels("cpu").value();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int rows = 5;
  const int width = 37;
  for (UpdateRule::Kind kind :
       {UpdateRule::Kind::kSgd, UpdateRule::Kind::kMomentum, UpdateRule::Kind::kNesterov,
        UpdateRule::Kind::kAdagrad, UpdateRule::Kind::kAdam, UpdateRule::Kind::kAdamW}) {
    const UpdateRule rule = Rule(kind);
    const size_t state = rule.StateFloats(width);
    const int stride = width + static_cast<int>(state) + 3;
    std::vector<float> table(static_cast<size_t>(rows) * stride, kPadding);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < width; ++i) table[r * stride + i] = dist(rng);
      for (size_t i = 0; i < state; ++i) table[r * stride + width + i] = 0.0f;
    }
    std::vector<float> expected = table;
    const std::unique_ptr<Optimizer> reference = MakeOptimizer(rule);
    for (float lr : {0.1f, 0.05f, 0.2f}) {
      std::vector<float> grad(static_cast<size_t>(rows) * width);
      for (float& g : grad) g = dist(rng);
      grad[0] = 0.0f;  // a row whose norm is under the clip: row 4 is scaled down below
      for (int i = 0; i < width; ++i) grad[4 * width + i] *= 0.01f;
      ASSERT_TRUE(cpu->ApplyUpdate(rule, lr, rows, width, stride, table.data(), grad.data()).ok());
      for (int r = 0; r < rows; ++r) {
        float* row = expected.data() + static_cast<size_t>(r) * stride;
        reference->Apply(std::span<float>(row, width), std::span<float>(row + width, state),
                         std::span<const float>(grad.data() + r * width, width), lr);
      }
    }
    EXPECT_EQ(table, expected) << "rule " << static_cast<int>(kind);
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(table[r * stride + stride - 1], kPadding) << "the padding after row " << r;
    }
  }
}

TEST(UpdateKernelsTest, ABadShapeIsRefusedAndNothingMoves) {
  std::unique_ptr<Kernels> cpu = MakeKernels("cpu").value();
  const UpdateRule adam = Rule(UpdateRule::Kind::kAdam);
  std::vector<float> table(2 * 10, 1.0f);
  const std::vector<float> before = table;
  const std::vector<float> grad(2 * 4, 1.0f);
  // Adam's state for width 4 is 9 floats: a row needs 13.
  Status s = cpu->ApplyUpdate(adam, 0.1f, 2, 4, 10, table.data(), grad.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("stride 10"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("13 floats"), std::string::npos) << s.ToString();
  s = cpu->ApplyUpdate(adam, 0.1f, -1, 4, 13, table.data(), grad.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(table, before);
  EXPECT_TRUE(cpu->ApplyUpdate(adam, 0.1f, 0, 4, 13, nullptr, nullptr).ok()) << "no rows";
}

// The gradient check's scan: NaN, Inf and values beyond the limit set the flag, wherever
// they are; nothing clears it.
TEST(UpdateKernelsTest, FlagOutOfRangeCatchesNanInfAndHugeValues) {
  std::unique_ptr<Kernels> cpu = MakeKernels("cpu").value();
  std::vector<float> x(1003, 0.5f);
  x[7] = -kMaxAbsGradient;  // at the limit: in range
  int32_t flag = 0;
  ASSERT_TRUE(cpu->FlagOutOfRange(x.size(), x.data(), kMaxAbsGradient, &flag).ok());
  EXPECT_EQ(flag, 0);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -2e18f}) {
    for (size_t at : {size_t{0}, size_t{500}, x.size() - 1}) {
      std::vector<float> y = x;
      y[at] = bad;
      flag = 0;
      ASSERT_TRUE(cpu->FlagOutOfRange(y.size(), y.data(), kMaxAbsGradient, &flag).ok());
      EXPECT_EQ(flag, 1) << bad << " at " << at;
      ASSERT_TRUE(cpu->FlagOutOfRange(x.size(), x.data(), kMaxAbsGradient, &flag).ok());
      EXPECT_EQ(flag, 1) << "a clean scan leaves the flag set";
    }
  }
}

}  // namespace
}  // namespace ps
