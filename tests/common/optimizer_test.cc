// Every optimizer against a reference written out here in double, one scalar at a time,
// from the formulas (PyTorch's torch.optim conventions), not from the implementation: several
// steps on rows of odd width, with a second row first touched mid-training, and weight decay
// and clipping on and off.
#include "common/optimizer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace ps {
namespace {

constexpr size_t kWidth = 5;
constexpr double kRelTol = 1e-6;

JobConfig Config(const std::string& optimizer, double weight_decay, double clip) {
  JobConfig c;
  c.optimizer = optimizer;
  c.momentum = 0.9;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  // Large enough that where eps enters the formula shows at the tests' tolerance.
  c.epsilon = 1e-3;
  c.weight_decay = weight_decay;
  c.clip_grad_norm = clip;
  return c;
}

// One row of the reference: weights and the optimizer's memory, all in double.
struct RefRow {
  std::vector<double> w;
  std::vector<double> a = std::vector<double>(kWidth, 0.0);  // momentum buffer, sum, or m
  std::vector<double> b = std::vector<double>(kWidth, 0.0);  // adam: v
  int t = 0;                                                 // adam: the row's steps
};

// One step of `c.optimizer` on `r`; returns whether the gradient was clipped.
bool RefStep(const JobConfig& c, RefRow& r, const std::vector<float>& grad, double lr) {
  std::vector<double> g(grad.begin(), grad.end());
  bool clipped = false;
  if (c.clip_grad_norm > 0) {
    double norm = 0;
    for (double x : g) norm += x * x;
    norm = std::sqrt(norm);
    if (norm > c.clip_grad_norm) {
      clipped = true;
      for (double& x : g) x *= c.clip_grad_norm / norm;
    }
  }
  const double wd = c.weight_decay;
  if (c.optimizer != "adamw") {
    for (size_t i = 0; i < kWidth; ++i) g[i] += wd * r.w[i];
  }
  if (c.optimizer == "sgd") {
    for (size_t i = 0; i < kWidth; ++i) r.w[i] -= lr * g[i];
  } else if (c.optimizer == "momentum") {
    for (size_t i = 0; i < kWidth; ++i) {
      r.a[i] = c.momentum * r.a[i] + g[i];
      r.w[i] -= lr * r.a[i];
    }
  } else if (c.optimizer == "nesterov") {
    for (size_t i = 0; i < kWidth; ++i) {
      r.a[i] = c.momentum * r.a[i] + g[i];
      r.w[i] -= lr * (g[i] + c.momentum * r.a[i]);
    }
  } else if (c.optimizer == "adagrad") {
    for (size_t i = 0; i < kWidth; ++i) {
      r.a[i] += g[i] * g[i];
      r.w[i] -= lr * g[i] / (std::sqrt(r.a[i]) + c.epsilon);
    }
  } else if (c.optimizer == "adam" || c.optimizer == "adamw") {
    r.t += 1;
    const double bc1 = 1 - std::pow(c.beta1, r.t);
    const double bc2 = 1 - std::pow(c.beta2, r.t);
    for (size_t i = 0; i < kWidth; ++i) {
      if (c.optimizer == "adamw") r.w[i] -= lr * wd * r.w[i];
      r.a[i] = c.beta1 * r.a[i] + (1 - c.beta1) * g[i];
      r.b[i] = c.beta2 * r.b[i] + (1 - c.beta2) * g[i] * g[i];
      const double m_hat = r.a[i] / bc1;
      const double v_hat = r.b[i] / bc2;
      r.w[i] -= lr * m_hat / (std::sqrt(v_hat) + c.epsilon);
    }
  } else {
    ADD_FAILURE() << "no reference for " << c.optimizer;
  }
  return clipped;
}

void ExpectRowNear(const std::vector<float>& got, const RefRow& want, const std::string& what) {
  for (size_t i = 0; i < kWidth; ++i) {
    EXPECT_NEAR(got[i], want.w[i], kRelTol * std::abs(want.w[i])) << what << ", element " << i;
  }
}

// A row of implementation storage: values, then state, as the table keeps it.
struct Row {
  std::vector<float> values;
  std::vector<float> state;
};

using Case = std::tuple<std::string, double, double>;  // optimizer, weight_decay, clip

class OptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerTest, MatchesReferenceIncludingRowTouchedMidTraining) {
  const auto& [name, wd, clip] = GetParam();
  const JobConfig config = Config(name, wd, clip);
  Result<std::unique_ptr<Optimizer>> made = MakeOptimizer(config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const Optimizer& opt = *made.value();

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> magnitude(1.0f, 2.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // Weights away from zero so that a relative tolerance is meaningful throughout.
  auto initial = [&] {
    std::vector<float> w(kWidth);
    for (float& x : w) x = (rng() % 2 ? 1.0f : -1.0f) * magnitude(rng);
    return w;
  };
  Row rows[2];
  RefRow refs[2];
  for (int r = 0; r < 2; ++r) {
    rows[r].values = initial();
    rows[r].state.assign(opt.StateFloats(kWidth), 0.0f);  // a new row's state is zero
    refs[r].w.assign(rows[r].values.begin(), rows[r].values.end());
  }

  // Gradient sizes vary by step so that clipping applies to some steps and not others.
  const float grad_scale[] = {0.3f, 2.5f, 1.0f, 0.2f, 3.0f, 0.5f, 1.5f, 0.1f};
  const float lrs[] = {0.02f, 0.015f, 0.01f, 0.02f, 0.005f, 0.01f, 0.02f, 0.015f};
  constexpr int kSteps = 8;
  constexpr int kSecondRowFrom = 3;  // row 1 is first touched when row 0 has taken 3 steps
  int clipped = 0;
  int unclipped = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && step < kSecondRowFrom) continue;
      std::vector<float> grad(kWidth);
      for (float& x : grad) x = grad_scale[(step + r) % kSteps] * unit(rng);
      opt.Apply(rows[r].values, rows[r].state, grad, lrs[step]);
      (RefStep(config, refs[r], grad, lrs[step]) ? clipped : unclipped)++;
      ExpectRowNear(rows[r].values, refs[r],
                    name + " row " + std::to_string(r) + " step " + std::to_string(step));
    }
  }
  if (clip > 0) {
    // The case is only a test of clipping if it both clipped and left gradients alone.
    EXPECT_GT(clipped, 0);
    EXPECT_GT(unclipped, 0);
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto& [name, wd, clip] = info.param;
  return name + (wd > 0 ? "_Decay" : "") + (clip > 0 ? "_Clip" : "");
}

INSTANTIATE_TEST_SUITE_P(AllRules, OptimizerTest,
                         ::testing::Combine(::testing::Values("sgd", "momentum", "nesterov",
                                                              "adagrad", "adam", "adamw"),
                                            ::testing::Values(0.0, 0.1),   // weight_decay
                                            ::testing::Values(0.0, 1.0)),  // clip_grad_norm
                         CaseName);

TEST(OptimizerStateTest, StateFloatsPerRule) {
  const std::pair<const char*, size_t> want[] = {{"sgd", 0},     {"momentum", 7}, {"nesterov", 7},
                                                 {"adagrad", 7}, {"adam", 15},    {"adamw", 15}};
  for (const auto& [name, floats] : want) {
    auto opt = MakeOptimizer(Config(name, 0, 0));
    ASSERT_TRUE(opt.ok()) << name;
    EXPECT_EQ(opt.value()->StateFloats(7), floats) << name;
  }
}

TEST(OptimizerStateTest, UnknownOptimizerIsInvalidArgument) {
  auto opt = MakeOptimizer(Config("rmsprop", 0, 0));
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("rmsprop"), std::string::npos);
}

// Hand-computed: g = (3, 4) has norm 5; clipped to 1 it is (0.6, 0.8).
TEST(OptimizerStateTest, ClipScalesTheRowToTheBound) {
  auto opt = MakeOptimizer(Config("sgd", 0, 1.0)).value();
  std::vector<float> w = {1.0f, 1.0f};
  std::vector<float> g = {3.0f, 4.0f};
  opt->Apply(w, {}, g, 1.0f);
  EXPECT_FLOAT_EQ(w[0], 0.4f);
  EXPECT_FLOAT_EQ(w[1], 0.2f);
  // Within the bound: unchanged gradient.
  std::vector<float> small = {0.3f, 0.4f};
  opt->Apply(w, {}, small, 1.0f);
  EXPECT_NEAR(w[0], 0.1, 1e-6);
  EXPECT_NEAR(w[1], -0.2, 1e-6);
}

// Adam's first step of a row moves each weight by about lr * sign(g), whatever steps other
// rows have taken: the bias correction uses the row's own count, kept in its state.
TEST(OptimizerStateTest, AdamFirstStepOfAFreshRowIsBiasCorrected) {
  JobConfig config = Config("adam", 0, 0);
  config.epsilon = 1e-8;
  auto opt = MakeOptimizer(config).value();
  std::vector<float> old_w(3, 0.0f), old_s(opt->StateFloats(3), 0.0f);
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f};
  for (int i = 0; i < 100; ++i) opt->Apply(old_w, old_s, g, 0.01f);
  std::vector<float> w(3, 0.0f), s(opt->StateFloats(3), 0.0f);
  opt->Apply(w, s, g, 0.01f);
  EXPECT_NEAR(w[0], -0.01, 1e-7);
  EXPECT_NEAR(w[1], 0.01, 1e-7);
  EXPECT_NEAR(w[2], -0.01, 1e-6);
  EXPECT_EQ(s.back(), 1.0f);  // the row's step count
  EXPECT_EQ(old_s.back(), 100.0f);
}

// optimizer.cc is built to vectorize (-O3 -fno-math-errno); a vector loop with a scalar tail
// must still give every element the bits of the per-element formula (no reassociation, no
// contraction). Width 37: several vector iterations plus a remainder.
TEST(OptimizerVectorTest, AdagradIsBitIdenticalToTheScalarFormula) {
  constexpr size_t n = 37;
  const JobConfig c = Config("adagrad", 0.1, 0);
  auto opt = MakeOptimizer(c).value();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> w(n), s(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = dist(rng);
    s[i] = std::abs(dist(rng));
    g[i] = dist(rng);
  }
  std::vector<float> ew = w, es = s;
  const float lr = 0.05f, wd = 0.1f, eps = static_cast<float>(c.epsilon);
  for (size_t i = 0; i < n; ++i) {
    const float gi = 1.0f * g[i] + wd * ew[i];
    es[i] += gi * gi;
    ew[i] -= lr * gi / (std::sqrt(es[i]) + eps);
  }
  opt->Apply(w, s, g, lr);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(w[i]), std::bit_cast<uint32_t>(ew[i])) << "w[" << i << "]";
    EXPECT_EQ(std::bit_cast<uint32_t>(s[i]), std::bit_cast<uint32_t>(es[i])) << "s[" << i << "]";
  }
}

// --pull_lookahead: Extrapolate(LookaheadStep(k)) is where k updates that bring no gradient leave a
// row, checked against Apply with zero gradients; a fraction of an update lies between.
TEST(OptimizerExtrapolateTest, MatchesUpdatesWithoutGradient) {
  for (const std::string name : {"momentum", "nesterov"}) {
    auto opt = MakeOptimizer(Config(name, 0, 0)).value();
    ASSERT_TRUE(opt->HasVelocity()) << name;
    std::vector<float> w = {1.0f, -2.0f, 0.5f}, v = {0.3f, -0.1f, 2.0f};
    const std::vector<float> zero(3, 0.0f);
    const float lr = 0.05f;
    std::vector<float> ahead(3), stepped_w = w, stepped_v = v;
    std::vector<float> before(3);
    for (int k = 1; k <= 3; ++k) {
      before = stepped_w;
      opt->Apply(stepped_w, stepped_v, zero, lr);
      opt->Extrapolate(w, v, opt->LookaheadStep(lr, k), ahead);
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_NEAR(ahead[i], stepped_w[i], 1e-6) << name << " k=" << k << " i=" << i;
      }
    }
    // Half an update: between the row now and the row after one update.
    opt->Extrapolate(w, v, opt->LookaheadStep(lr, 0.5), ahead);
    std::vector<float> one(3);
    opt->Extrapolate(w, v, opt->LookaheadStep(lr, 1), one);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LT(std::abs(ahead[i] - w[i]), std::abs(one[i] - w[i])) << name << " i=" << i;
      EXPECT_GT(std::abs(ahead[i] - w[i]), 0.0f) << name << " i=" << i;
    }
  }
}

TEST(OptimizerExtrapolateTest, RulesWithoutVelocityCopy) {
  for (const std::string name : {"sgd", "adagrad", "adam"}) {
    auto opt = MakeOptimizer(Config(name, 0, 0)).value();
    EXPECT_FALSE(opt->HasVelocity()) << name;
    const std::vector<float> w = {1.0f, -2.0f};
    std::vector<float> state(opt->StateFloats(2), 0.7f), out(2, 0.0f);
    opt->Extrapolate(w, state, opt->LookaheadStep(0.1f, 2), out);
    EXPECT_EQ(out, w) << name;
  }
  JobConfig no_momentum = Config("momentum", 0, 0);
  no_momentum.momentum = 0;
  EXPECT_FALSE(MakeOptimizer(no_momentum).value()->HasVelocity());
}

}  // namespace
}  // namespace ps
