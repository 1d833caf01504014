// The MLP (--model=mlp: the Network of MlpNetwork's layers) against a double-precision
// reference: loss and finite-difference gradients, a few SGD steps on a separable toy
// problem, and bad input. Runs on the CPU, and on the first GPU where one is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/network_config.h"
#include "kernels/kernels.h"
#include "worker/network.h"

namespace ps {
namespace {

// --mlp_layers: widths, input first and classes last.
using Widths = std::vector<int>;

// Float counts of the tables: W0 [w0 x w1], b0 [w1], W1, b1, ...
std::vector<size_t> ParamSizes(const Widths& w) {
  std::vector<size_t> sizes;
  for (size_t l = 0; l + 1 < w.size(); ++l) {
    sizes.push_back(static_cast<size_t>(w[l]) * static_cast<size_t>(w[l + 1]));
    sizes.push_back(static_cast<size_t>(w[l + 1]));
  }
  return sizes;
}

NetworkSpec MlpSpec(const Widths& w) { return ParseNetwork(MlpNetwork(w).value()).value(); }

// Parameters as the server would hold them: one vector per tensor.
struct Params {
  std::vector<std::vector<float>> tensors;
  std::vector<const float*> Const() const {
    std::vector<const float*> p;
    for (const auto& t : tensors) p.push_back(t.data());
    return p;
  }
  std::vector<float*> Mutable() {
    std::vector<float*> p;
    for (auto& t : tensors) p.push_back(t.data());
    return p;
  }
};

Params MakeParams(const Widths& shape, std::mt19937& rng, bool zero = false) {
  Params p;
  const std::vector<size_t> sizes = ParamSizes(shape);
  for (size_t i = 0; i < sizes.size(); ++i) {
    // He initialization for weights, small values for biases.
    const float fan_in = static_cast<float>(shape[i / 2]);
    std::normal_distribution<float> dist(0.0f, i % 2 == 0 ? std::sqrt(2.0f / fan_in) : 0.1f);
    std::vector<float> t(sizes[i]);
    for (float& v : t) v = zero ? 0.0f : dist(rng);
    p.tensors.push_back(std::move(t));
  }
  return p;
}

// Mean cross-entropy of the MLP in double, from float inputs and parameters given as
// doubles (so that finite differences see no float rounding).
double ReferenceMeanLoss(const Widths& shape, const std::vector<std::vector<double>>& params,
                         const std::vector<float>& x, const std::vector<int32_t>& y, int batch) {
  const std::vector<int>& w = shape;
  const int layers = static_cast<int>(w.size()) - 1;
  double total = 0;
  for (int n = 0; n < batch; ++n) {
    std::vector<double> h(x.begin() + static_cast<size_t>(n) * w[0],
                          x.begin() + static_cast<size_t>(n + 1) * w[0]);
    for (int l = 0; l < layers; ++l) {
      std::vector<double> out(w[l + 1]);
      for (int j = 0; j < w[l + 1]; ++j) {
        double s = params[2 * l + 1][j];
        for (int i = 0; i < w[l]; ++i)
          s += h[i] * params[2 * l][static_cast<size_t>(i) * w[l + 1] + j];
        out[j] = (l + 1 < layers && s < 0) ? 0.0 : s;
      }
      h = std::move(out);
    }
    double max = h[0];
    for (double v : h) max = std::max(max, v);
    double sum = 0;
    for (double v : h) sum += std::exp(v - max);
    total += std::log(sum) + max - h[y[n]];
  }
  return total / batch;
}

std::vector<std::string> Devices() {
  std::vector<std::string> d = {"cpu"};
  if (CudaDeviceCount() > 0) d.push_back("cuda");
  return d;
}

class MlpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Kernels>> k = MakeKernels(GetParam());
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    kernels_ = std::move(k).value();
  }
  std::unique_ptr<Network> MakeMlp(const Widths& shape, int max_batch) {
    Result<std::unique_ptr<Network>> m = Network::Create(MlpSpec(shape), kernels_.get(), max_batch);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }
  std::unique_ptr<Kernels> kernels_;
  std::mt19937 rng_{2024};
};

TEST_P(MlpTest, TablesAreTheWeightAndBiasOfEachDenseLayer) {
  std::unique_ptr<Network> mlp = MakeMlp({784, 256, 128, 10}, 8);
  ASSERT_NE(mlp, nullptr);
  EXPECT_EQ(mlp->ParamSizes(), (std::vector<size_t>{784 * 256, 256, 256 * 128, 128, 128 * 10, 10}));
  EXPECT_EQ(MakeMlp({5, 3}, 8)->ParamSizes(), (std::vector<size_t>{15, 3}));
}

TEST_P(MlpTest, CreateRejectsABadBatchOrNoKernels) {
  EXPECT_EQ(Network::Create(MlpSpec({5, 3}), kernels_.get(), 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Network::Create(MlpSpec({5, 3}), nullptr, 8).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_P(MlpTest, GradientsMatchFiniteDifferences) {
  for (const Widths& shape : {Widths{5, 7, 3}, Widths{6, 8, 5, 4}, Widths{3, 4}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    const int batch = 4;
    std::unique_ptr<Network> mlp = MakeMlp(shape, 8);
    ASSERT_NE(mlp, nullptr);
    Params params = MakeParams(shape, rng_);
    Params grads = MakeParams(shape, rng_);  // garbage: must be overwritten
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(batch) * shape[0]);
    for (float& v : x) v = normal(rng_);
    std::vector<int32_t> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % shape.back();

    BatchResult result;
    ASSERT_TRUE(
        mlp->ForwardBackward(x.data(), y.data(), batch, params.Const(), grads.Mutable(), &result)
            .ok());
    EXPECT_EQ(result.examples, batch);

    std::vector<std::vector<double>> p64;
    for (const auto& t : params.tensors) p64.emplace_back(t.begin(), t.end());
    const double loss = ReferenceMeanLoss(shape, p64, x, y, batch);
    EXPECT_NEAR(result.loss_sum / batch, loss, 1e-5 * (1 + loss));

    // Central differences in double: truncation error ~eps^2, rounding ~1e-16/eps.
    const double eps = 1e-5;
    for (size_t t = 0; t < p64.size(); ++t) {
      for (size_t i = 0; i < p64[t].size(); ++i) {
        const double saved = p64[t][i];
        p64[t][i] = saved + eps;
        const double up = ReferenceMeanLoss(shape, p64, x, y, batch);
        p64[t][i] = saved - eps;
        const double down = ReferenceMeanLoss(shape, p64, x, y, batch);
        p64[t][i] = saved;
        const double numeric = (up - down) / (2 * eps);
        // The analytic gradient is computed in float.
        EXPECT_NEAR(grads.tensors[t][i], numeric, 1e-4 + 1e-3 * std::abs(numeric))
            << "tensor " << t << " element " << i;
      }
    }
  }
}

TEST_P(MlpTest, SgdReducesLossOnSeparableData) {
  // Three well-separated Gaussian blobs in 2-D.
  const Widths shape{2, 16, 3};
  const int n = 300, batch = 30;
  const float centers[3][2] = {{-2, -2}, {2, -2}, {0, 2}};
  std::normal_distribution<float> noise(0.0f, 0.4f);
  std::vector<float> x(n * 2);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = i % 3;
    x[2 * i] = centers[y[i]][0] + noise(rng_);
    x[2 * i + 1] = centers[y[i]][1] + noise(rng_);
  }
  std::unique_ptr<Network> mlp = MakeMlp(shape, batch);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params grads = MakeParams(shape, rng_, /*zero=*/true);

  BatchResult before;
  ASSERT_TRUE(mlp->Evaluate(x.data(), y.data(), n, params.Const(), &before).ok());
  EXPECT_EQ(before.examples, n);
  for (int step = 0; step < 100; ++step) {
    const int start = (step * batch) % n;
    ASSERT_TRUE(mlp->ForwardBackward(&x[start * 2], &y[start], batch, params.Const(),
                                     grads.Mutable(), nullptr)
                    .ok());
    for (size_t t = 0; t < params.tensors.size(); ++t) {
      for (size_t i = 0; i < params.tensors[t].size(); ++i) {
        params.tensors[t][i] -= 0.2f * grads.tensors[t][i];
      }
    }
  }
  BatchResult after;
  ASSERT_TRUE(mlp->Evaluate(x.data(), y.data(), n, params.Const(), &after).ok());
  EXPECT_LT(after.loss_sum, 0.25 * before.loss_sum)
      << "mean loss " << before.loss_sum / n << " -> " << after.loss_sum / n;
  EXPECT_GE(after.correct, n * 95 / 100);
}

TEST_P(MlpTest, EvaluateSlicesLargeBatchesAndAccumulates) {
  const Widths shape{4, 6, 3};
  const int n = 10;
  std::unique_ptr<Network> mlp = MakeMlp(shape, 3);  // 10 = 3 + 3 + 3 + 1
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n * 4);
  for (float& v : x) v = normal(rng_);
  std::vector<int32_t> y(n);
  for (int i = 0; i < n; ++i) y[i] = (i * 7) % 3;
  BatchResult r;
  r.loss_sum = 1.0;
  r.correct = 2;
  r.examples = 5;
  ASSERT_TRUE(mlp->Evaluate(x.data(), y.data(), n, params.Const(), &r).ok());
  std::vector<std::vector<double>> p64;
  for (const auto& t : params.tensors) p64.emplace_back(t.begin(), t.end());
  EXPECT_NEAR(r.loss_sum - 1.0, n * ReferenceMeanLoss(shape, p64, x, y, n), 1e-4);
  EXPECT_EQ(r.examples, 5 + n);
  EXPECT_GE(r.correct, 2);
  // The same examples one at a time give the same sums.
  BatchResult single;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(mlp->Evaluate(&x[i * 4], &y[i], 1, params.Const(), &single).ok());
  }
  EXPECT_NEAR(single.loss_sum, r.loss_sum - 1.0, 1e-5);
  EXPECT_EQ(single.correct, r.correct - 2);
}

TEST_P(MlpTest, GradientsAreOverwrittenNotAccumulated) {
  const Widths shape{5, 7, 3};
  std::unique_ptr<Network> mlp = MakeMlp(shape, 4);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params g1 = MakeParams(shape, rng_, true), g2 = MakeParams(shape, rng_);
  std::vector<float> x(4 * 5, 0.3f);
  std::vector<int32_t> y = {0, 1, 2, 0};
  ASSERT_TRUE(
      mlp->ForwardBackward(x.data(), y.data(), 4, params.Const(), g1.Mutable(), nullptr).ok());
  ASSERT_TRUE(
      mlp->ForwardBackward(x.data(), y.data(), 4, params.Const(), g2.Mutable(), nullptr).ok());
  ASSERT_TRUE(
      mlp->ForwardBackward(x.data(), y.data(), 4, params.Const(), g2.Mutable(), nullptr).ok());
  EXPECT_EQ(g1.tensors, g2.tensors);
}

TEST_P(MlpTest, EmptyBatchZeroesGradients) {
  const Widths shape{5, 7, 3};
  std::unique_ptr<Network> mlp = MakeMlp(shape, 4);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params grads = MakeParams(shape, rng_);
  BatchResult r;
  r.loss_sum = 3.5;
  r.correct = 2;
  r.examples = 9;
  ASSERT_TRUE(mlp->ForwardBackward(nullptr, nullptr, 0, params.Const(), grads.Mutable(), &r).ok());
  for (const auto& t : grads.tensors) {
    for (float v : t) ASSERT_EQ(v, 0.0f);
  }
  EXPECT_EQ(r.loss_sum, 3.5);
  EXPECT_EQ(r.correct, 2);
  EXPECT_EQ(r.examples, 9);
  ASSERT_TRUE(mlp->Evaluate(nullptr, nullptr, 0, params.Const(), &r).ok());
  EXPECT_EQ(r.examples, 9);
}

TEST_P(MlpTest, BadInputIsInvalidArgument) {
  const Widths shape{5, 7, 3};
  std::unique_ptr<Network> mlp = MakeMlp(shape, 4);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params grads = MakeParams(shape, rng_);
  std::vector<float> x(5 * 5, 0.1f);
  std::vector<int32_t> y = {0, 1, 2, 0, 1};
  BatchResult r;
  auto fb = [&](int batch) {
    return mlp->ForwardBackward(x.data(), y.data(), batch, params.Const(), grads.Mutable(), &r);
  };
  Status s = fb(-1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("-1"), std::string::npos) << s.message();
  s = fb(5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_batch 4"), std::string::npos) << s.message();
  EXPECT_EQ(mlp->Evaluate(x.data(), y.data(), -3, params.Const(), &r).code(),
            StatusCode::kInvalidArgument);

  y[2] = 3;  // classes are 0..2
  s = fb(4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("label 3 of example 2"), std::string::npos) << s.message();
  EXPECT_EQ(mlp->Evaluate(x.data(), y.data(), 5, params.Const(), &r).code(),
            StatusCode::kInvalidArgument);
  y[2] = -1;
  EXPECT_EQ(fb(4).code(), StatusCode::kInvalidArgument);
  y[2] = 2;

  std::vector<const float*> too_few = params.Const();
  too_few.pop_back();
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 4, too_few, grads.Mutable(), &r).code(),
            StatusCode::kInvalidArgument);
  std::vector<float*> null_grad = grads.Mutable();
  null_grad[1] = nullptr;
  EXPECT_EQ(mlp->ForwardBackward(x.data(), y.data(), 4, params.Const(), null_grad, &r).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(r.examples, 0) << "a rejected batch must not count";
  EXPECT_TRUE(fb(4).ok());
}

// The job's default shape at its default batch: the loss is finite and every gradient is
// finite, and each tensor gets some (its time per step is ps_mlp_bench's to measure).
TEST_P(MlpTest, MnistSizedStepGivesFiniteGradients) {
  const Widths shape{784, 256, 128, 10};
  const int batch = 64;
  std::unique_ptr<Network> mlp = MakeMlp(shape, batch);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params grads = MakeParams(shape, rng_);  // garbage: must be overwritten
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch) * 784);
  for (float& v : x) v = pixel(rng_);
  std::vector<int32_t> y(batch);
  for (int i = 0; i < batch; ++i) y[i] = i % 10;
  BatchResult r;
  ASSERT_TRUE(
      mlp->ForwardBackward(x.data(), y.data(), batch, params.Const(), grads.Mutable(), &r).ok());
  EXPECT_EQ(r.examples, batch);
  EXPECT_TRUE(std::isfinite(r.loss_sum));
  EXPECT_GT(r.loss_sum, 0.0);
  for (size_t t = 0; t < grads.tensors.size(); ++t) {
    const std::vector<float>& g = grads.tensors[t];
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }))
        << "tensor " << t;
    EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; }))
        << "tensor " << t;
  }
}

// Parameters and gradients kept in the kernels' memory (TensorHome::kKernels, the
// standalone's model on the device): the same gradients and losses as host tensors give,
// bit for bit (the same kernels run in the same order), and an empty batch zeroes them there.
TEST_P(MlpTest, TensorsInTheKernelsMemoryGiveTheHostPathsResults) {
  const Widths shape{6, 9, 4};
  std::unique_ptr<Network> mlp = MakeMlp(shape, 5);
  ASSERT_NE(mlp, nullptr);
  Params params = MakeParams(shape, rng_);
  Params host_grads = MakeParams(shape, rng_);
  std::vector<float> x(5 * 6);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng_);
  const std::vector<int32_t> y = {0, 3, 1, 2, 3};
  BatchResult host;
  ASSERT_TRUE(
      mlp->ForwardBackward(x.data(), y.data(), 5, params.Const(), host_grads.Mutable(), &host)
          .ok());

  std::vector<DeviceBuffer<float>> d_params, d_grads;
  std::vector<const float*> param_ptrs;
  std::vector<float*> grad_ptrs;
  for (const std::vector<float>& t : params.tensors) {
    DeviceBuffer<float> p = DeviceBuffer<float>::Make(kernels_.get(), t.size()).value();
    ASSERT_TRUE(kernels_->CopyToDevice(p.get(), t.data(), t.size() * sizeof(float)).ok());
    DeviceBuffer<float> g = DeviceBuffer<float>::Make(kernels_.get(), t.size()).value();
    const std::vector<float> garbage(t.size(), std::nanf(""));
    ASSERT_TRUE(kernels_->CopyToDevice(g.get(), garbage.data(), t.size() * sizeof(float)).ok());
    param_ptrs.push_back(p.get());
    grad_ptrs.push_back(g.get());
    d_params.push_back(std::move(p));
    d_grads.push_back(std::move(g));
  }
  auto download = [&] {
    std::vector<std::vector<float>> out;
    for (const DeviceBuffer<float>& g : d_grads) {
      std::vector<float> h(g.size());
      EXPECT_TRUE(kernels_->CopyToHost(h.data(), g.get(), h.size() * sizeof(float)).ok());
      out.push_back(std::move(h));
    }
    return out;
  };
  BatchResult kept;
  ASSERT_TRUE(mlp->ForwardBackward(x.data(), y.data(), 5, param_ptrs, grad_ptrs, &kept,
                                   TensorHome::kKernels)
                  .ok());
  EXPECT_EQ(download(), host_grads.tensors);
  EXPECT_EQ(kept.loss_sum, host.loss_sum);
  EXPECT_EQ(kept.correct, host.correct);
  BatchResult eval_host, eval_kept;
  ASSERT_TRUE(mlp->Evaluate(x.data(), y.data(), 5, params.Const(), &eval_host).ok());
  ASSERT_TRUE(
      mlp->Evaluate(x.data(), y.data(), 5, param_ptrs, &eval_kept, TensorHome::kKernels).ok());
  EXPECT_EQ(eval_kept.loss_sum, eval_host.loss_sum);
  ASSERT_TRUE(mlp->ForwardBackward(nullptr, nullptr, 0, param_ptrs, grad_ptrs, nullptr,
                                   TensorHome::kKernels)
                  .ok());
  for (const std::vector<float>& g : download()) {
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MlpTest, ::testing::ValuesIn(Devices()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ps
