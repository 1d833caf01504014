// Each layer's Backward against a central-difference gradient of its Forward (CPU backend),
// the network end to end (parameters through the loss), and a dense network against the MLP.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/network_config.h"
#include "kernels/kernels.h"
#include "worker/layer.h"
#include "worker/network.h"

namespace ps {
namespace {

std::unique_ptr<Kernels> Cpu() {
  Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return std::move(k).value();
}

// The first layer of "input:IN,LAYER,flatten,dense:2,softmax_ce".
LayerSpec SpecOf(const std::string& input, const std::string& layer) {
  const std::string text = "input:" + input + "," + layer + ",flatten,dense:2,softmax_ce";
  Result<NetworkSpec> r = ParseNetwork(text);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->layers[0] : LayerSpec{};
}

// How the input is drawn: kinks of ReLU and ties of max pooling must stay further away than
// the finite-difference step.
enum class InputKind { kNormal, kAwayFromZero, kDistinct };

class LayerGradientCheck {
 public:
  LayerGradientCheck(const LayerSpec& spec, int batch, InputKind input) : spec_(spec), b_() {
    b_.batch = batch;
    b_.training = true;
    b_.seed = 7;
    kernels_ = Cpu();
    Result<std::unique_ptr<Layer>> l = MakeLayer(spec);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    layer_ = std::move(l).value();
    Status s = layer_->Allocate(kernels_.get(), batch);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::normal_distribution<float> normal(0.0f, 0.5f);
    x_.resize(static_cast<size_t>(batch) * spec.in.size());
    for (float& v : x_) v = normal(rng_);
    if (input == InputKind::kAwayFromZero) {
      for (float& v : x_) v = v >= 0 ? v + 0.1f : v - 0.1f;
    } else if (input == InputKind::kDistinct) {
      std::vector<int> order(x_.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng_);
      for (size_t i = 0; i < x_.size(); ++i) x_[i] = 0.05f * (order[i] - x_.size() / 2.0f);
    }
    for (const TableSpec& t : spec.tables) {
      params_.emplace_back(t.rows * t.width);
      for (float& v : params_.back()) v = normal(rng_);
    }
    r_.resize(static_cast<size_t>(batch) * spec.out.size());
    for (float& v : r_) v = normal(rng_);
  }

  // L = sum(r * layer(x)), in double.
  double Loss() {
    std::vector<float> y(r_.size());
    Status s = layer_->Forward(b_, Params(), x_.data(), y.data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(r_[i]) * y[i];
    return l;
  }

  // Compares dL/dx and dL/dparams from Backward with central differences.
  void Run(float eps = 1e-2f, double tol = 2e-2) {
    std::vector<float> y(r_.size());
    ASSERT_TRUE(layer_->Forward(b_, Params(), x_.data(), y.data()).ok());
    std::vector<float> dx(x_.size(), -99.0f);
    std::vector<std::vector<float>> grads;
    std::vector<float*> g;
    for (const auto& p : params_) grads.emplace_back(p.size(), -99.0f);
    for (auto& v : grads) g.push_back(v.data());
    Status s = layer_->Backward(b_, Params(), x_.data(), y.data(), r_.data(), g, dx.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    Compare("dx", x_, dx, eps, tol);
    for (size_t t = 0; t < params_.size(); ++t) {
      Compare(spec_.tables[t].name, params_[t], grads[t], eps, tol);
    }
  }

 private:
  std::vector<const float*> Params() const {
    std::vector<const float*> p;
    for (const auto& v : params_) p.push_back(v.data());
    return p;
  }

  void Compare(const std::string& what, std::vector<float>& values,
               const std::vector<float>& analytic, float eps, double tol) {
    for (size_t i = 0; i < values.size(); ++i) {
      const float keep = values[i];
      values[i] = keep + eps;
      const double up = Loss();
      values[i] = keep - eps;
      const double down = Loss();
      values[i] = keep;
      const double numeric = (up - down) / (2.0 * eps);
      ASSERT_NEAR(analytic[i], numeric, tol * std::max(1.0, std::fabs(numeric)))
          << spec_.text << ": " << what << "[" << i << "]";
    }
  }

  LayerSpec spec_;
  LayerBatch b_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<Layer> layer_;
  std::mt19937 rng_{17};
  std::vector<float> x_, r_;
  std::vector<std::vector<float>> params_;
};

TEST(NetworkLayersTest, DenseBackwardMatchesNumericalGradient) {
  LayerGradientCheck(SpecOf("7", "dense:5"), 3, InputKind::kNormal).Run();
}

TEST(NetworkLayersTest, Conv2dBackwardMatchesNumericalGradient) {
  LayerGradientCheck(SpecOf("2x6x5", "conv2d:3:3:pad=1"), 2, InputKind::kNormal).Run();
  LayerGradientCheck(SpecOf("3x7x7", "conv2d:2:3:stride=2"), 2, InputKind::kNormal).Run();
  LayerGradientCheck(SpecOf("4x3x3", "conv2d:2:1"), 2, InputKind::kNormal).Run();  // pointwise
}

TEST(NetworkLayersTest, ReluBackwardMatchesNumericalGradient) {
  LayerGradientCheck(SpecOf("2x3x3", "relu"), 3, InputKind::kAwayFromZero).Run();
}

TEST(NetworkLayersTest, MaxPoolBackwardMatchesNumericalGradient) {
  LayerGradientCheck(SpecOf("2x6x6", "maxpool:2"), 2, InputKind::kDistinct).Run();
  LayerGradientCheck(SpecOf("1x5x5", "maxpool:3:stride=2:pad=1"), 2, InputKind::kDistinct).Run();
}

TEST(NetworkLayersTest, FlattenAndDropoutBackwardMatchNumericalGradient) {
  LayerGradientCheck(SpecOf("2x3x4", "flatten"), 2, InputKind::kNormal).Run();
  LayerGradientCheck(SpecOf("10", "dropout:0.5"), 4, InputKind::kNormal).Run();
}

TEST(NetworkLayersTest, DropoutDropsWhileTrainingAndPassesThroughInEvaluation) {
  std::unique_ptr<Kernels> k = Cpu();
  const LayerSpec spec = SpecOf("1000", "dropout:0.3");
  Result<std::unique_ptr<Layer>> l = MakeLayer(spec);
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE((*l)->Allocate(k.get(), 1).ok());
  std::vector<float> x(1000, 1.0f), y(1000);
  ASSERT_TRUE((*l)->Forward(LayerBatch{1, true, 5}, {}, x.data(), y.data()).ok());
  const int dropped = static_cast<int>(std::count(y.begin(), y.end(), 0.0f));
  EXPECT_GT(dropped, 230);
  EXPECT_LT(dropped, 370);
  for (float v : y) {
    if (v != 0.0f) {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
    }
  }
  ASSERT_TRUE((*l)->Forward(LayerBatch{1, false, 5}, {}, x.data(), y.data()).ok());
  EXPECT_EQ(y, x);
}

// The mean loss of a whole network (through Evaluate) against ForwardBackward's parameter
// gradients: checks how layers, tables and the loss are wired together.
TEST(NetworkLayersTest, NetworkParameterGradientsMatchNumericalGradient) {
  std::unique_ptr<Kernels> k = Cpu();
  Result<NetworkSpec> spec = ParseNetwork(
      "input:1x6x6,conv2d:2:3:pad=1,relu,maxpool:2,conv2d:3:2,relu,flatten,dense:4,relu,"
      "dense:3,softmax_ce");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const int batch = 3;
  Result<std::unique_ptr<Network>> net = Network::Create(*spec, k.get(), batch);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> x(batch * 36);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y = {0, 2, 1};
  std::vector<std::vector<float>> params, grads;
  for (size_t n : (*net)->ParamSizes()) {
    params.emplace_back(n);
    for (float& v : params.back()) v = normal(rng);
    grads.emplace_back(n);
  }
  auto ptrs = [&] {
    std::vector<const float*> p;
    for (const auto& v : params) p.push_back(v.data());
    return p;
  };
  std::vector<float*> g;
  for (auto& v : grads) g.push_back(v.data());
  BatchResult r;
  ASSERT_TRUE((*net)->ForwardBackward(x.data(), y.data(), batch, ptrs(), g, &r).ok());
  EXPECT_EQ(r.examples, batch);
  auto mean_loss = [&] {
    BatchResult e;
    EXPECT_TRUE((*net)->Evaluate(x.data(), y.data(), batch, ptrs(), &e).ok());
    return e.loss_sum / batch;
  };
  EXPECT_NEAR(mean_loss(), r.loss_sum / batch, 1e-6);
  const float eps = 1e-3f;
  int checked = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    for (size_t i = 0; i < params[t].size(); ++i) {
      const float keep = params[t][i];
      params[t][i] = keep + eps;
      const double up = mean_loss();
      params[t][i] = keep - eps;
      const double down = mean_loss();
      params[t][i] = keep;
      const double numeric = (up - down) / (2.0 * eps);
      // ReLU kinks may sit within eps of a few values: allow a looser bound on those.
      EXPECT_NEAR(grads[t][i], numeric, 5e-3 + 2e-2 * std::fabs(numeric))
          << spec->Tables()[t].name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

// sigmoid_ce: one logit per example, labels 0 or 1; the mean log loss by hand.
TEST(NetworkLayersTest, SigmoidLossGradientsMatchNumericalGradient) {
  std::unique_ptr<Kernels> k = Cpu();
  Result<NetworkSpec> spec = ParseNetwork("input:5,dense:4,relu,dense:1,sigmoid_ce");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const int batch = 4;
  Result<std::unique_ptr<Network>> net = Network::Create(*spec, k.get(), batch);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 0.7f);
  std::vector<float> x(batch * 5);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y = {1, 0, 0, 1};
  std::vector<std::vector<float>> params, grads;
  for (size_t n : (*net)->ParamSizes()) {
    params.emplace_back(n);
    for (float& v : params.back()) v = normal(rng);
    grads.emplace_back(n);
  }
  std::vector<const float*> p;
  std::vector<float*> g;
  for (size_t i = 0; i < params.size(); ++i) {
    p.push_back(params[i].data());
    g.push_back(grads[i].data());
  }
  BatchResult r;
  ASSERT_TRUE((*net)->ForwardBackward(x.data(), y.data(), batch, p, g, &r).ok());
  auto mean_loss = [&] {
    BatchResult e;
    EXPECT_TRUE((*net)->Evaluate(x.data(), y.data(), batch, p, &e).ok());
    return e.loss_sum / batch;
  };
  const float eps = 1e-3f;
  for (size_t t = 0; t < params.size(); ++t) {
    for (size_t i = 0; i < params[t].size(); ++i) {
      const float keep = params[t][i];
      params[t][i] = keep + eps;
      const double up = mean_loss();
      params[t][i] = keep - eps;
      const double down = mean_loss();
      params[t][i] = keep;
      EXPECT_NEAR(grads[t][i], (up - down) / (2.0 * eps), 5e-3) << t << "[" << i << "]";
    }
  }
  std::vector<int32_t> bad = {1, 2, 0, 1};
  Status s = (*net)->ForwardBackward(x.data(), bad.data(), batch, p, g, nullptr);
  EXPECT_NE(s.message().find("label 2 of example 1"), std::string::npos) << s.ToString();
}

// A ReLU runs in place on the output of the layer before it, but not on the caller's input
// (first layer) nor after another ReLU (whose backward reads its output): relu,relu is relu,
// so both networks below compute the same loss and gradients, bit for bit, and x is left as
// it was given.
TEST(NetworkLayersTest, AReluRunsInPlaceOnlyWhereThatIsSafe) {
  std::unique_ptr<Kernels> k = Cpu();
  const int batch = 3;
  auto run = [&](const std::string& text, std::vector<float> x, BatchResult* r) {
    Result<NetworkSpec> spec = ParseNetwork(text);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    Result<std::unique_ptr<Network>> net = Network::Create(*spec, k.get(), batch);
    EXPECT_TRUE(net.ok()) << net.status().ToString();
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.8f);
    std::vector<std::vector<float>> params, grads;
    std::vector<const float*> p;
    std::vector<float*> g;
    for (size_t n : (*net)->ParamSizes()) {
      params.emplace_back(n);
      for (float& v : params.back()) v = normal(rng);
      grads.emplace_back(n, std::nanf(""));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      p.push_back(params[i].data());
      g.push_back(grads[i].data());
    }
    const std::vector<float> given = x;
    const std::vector<int32_t> y = {2, 0, 1};
    EXPECT_TRUE((*net)->ForwardBackward(x.data(), y.data(), batch, p, g, r).ok());
    EXPECT_EQ(x, given) << "the input was written: " << text;
    return grads;
  };
  std::vector<float> x(batch * 6);
  std::mt19937 rng(3);
  for (float& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  BatchResult twice, once;
  const auto g_twice = run("input:6,relu,dense:5,relu,relu,dense:3,softmax_ce", x, &twice);
  const auto g_once = run("input:6,relu,dense:5,relu,dense:3,softmax_ce", x, &once);
  EXPECT_EQ(g_twice, g_once);
  EXPECT_EQ(twice.loss_sum, once.loss_sum);
  EXPECT_TRUE(std::isfinite(once.loss_sum));
}

TEST(NetworkLayersTest, BadBatchesAreRefused) {
  std::unique_ptr<Kernels> k = Cpu();
  Result<NetworkSpec> spec = ParseNetwork("input:4,dense:3,softmax_ce");
  ASSERT_TRUE(spec.ok());
  Result<std::unique_ptr<Network>> net = Network::Create(*spec, k.get(), 2);
  ASSERT_TRUE(net.ok());
  std::vector<float> x(12), w(12), b(3), gw(12), gb(3);
  std::vector<int32_t> y = {0, 3, 1};
  Status s = (*net)->ForwardBackward(x.data(), y.data(), 3, {w.data(), b.data()},
                                     {gw.data(), gb.data()}, nullptr);
  EXPECT_NE(s.message().find("exceeds max_batch 2"), std::string::npos) << s.ToString();
  s = (*net)->ForwardBackward(x.data(), y.data(), 2, {w.data(), b.data()}, {gw.data(), gb.data()},
                              nullptr);
  EXPECT_NE(s.message().find("label 3 of example 1"), std::string::npos) << s.ToString();
  s = (*net)->ForwardBackward(x.data(), y.data(), 1, {w.data()}, {gw.data()}, nullptr);
  EXPECT_NE(s.message().find("got 1 parameter tensors"), std::string::npos) << s.ToString();
}

// Data whose examples do not fill the network's input is refused, naming the setting the
// job wrote (--mlp_layers for the MLP, --network otherwise) and both sizes.
TEST(NetworkLayersTest, DataOfAnotherWidthIsRefusedNamingTheJobsSetting) {
  JobConfig c;
  c.model = "mlp";
  c.mlp_layers = "784,10";
  Result<NetworkSpec> mlp = JobNetwork(c);
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  EXPECT_TRUE(CheckNetworkInput(c, *mlp, 784, "28x28").ok());
  Status s = CheckNetworkInput(c, *mlp, 1024, "32x32");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the data has 1024 inputs per example (32x32) but --mlp_layers "
                             "starts with 784"),
            std::string::npos)
      << s.message();
  c.model = "network";
  c.network = "input:1x28x28,flatten,dense:10,softmax_ce";
  Result<NetworkSpec> net = JobNetwork(c);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  s = CheckNetworkInput(c, *net, 1024, "32x32");
  EXPECT_NE(s.message().find("--network's input is 1x28x28"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ps
