// The network on CUDA against the same network on the CPU (the reference): loss, correct
// count and every parameter gradient, for a CNN with every layer kind. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/network_config.h"
#include "kernels/kernels.h"
#include "worker/network.h"

namespace ps {
namespace {

struct Outcome {
  BatchResult train, eval;
  std::vector<std::vector<float>> grads;
};

Outcome RunOn(const std::string& device, const NetworkSpec& spec, int batch) {
  Outcome out;
  Result<std::unique_ptr<Kernels>> k = MakeKernels(device);
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  if (!k.ok()) return out;
  Result<std::unique_ptr<Network>> net = Network::Create(spec, k->get(), batch, /*seed=*/9);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  if (!net.ok()) return out;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> x(static_cast<size_t>(batch) * spec.input.size());
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y(batch);
  for (int i = 0; i < batch; ++i) y[i] = i % spec.classes;
  std::vector<std::vector<float>> params;
  std::vector<const float*> p;
  std::vector<float*> g;
  for (size_t n : (*net)->ParamSizes()) {
    params.emplace_back(n);
    for (float& v : params.back()) v = normal(rng);
    out.grads.emplace_back(n);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    p.push_back(params[i].data());
    g.push_back(out.grads[i].data());
  }
  Status s = (*net)->ForwardBackward(x.data(), y.data(), batch, p, g, &out.train);
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = (*net)->Evaluate(x.data(), y.data(), batch, p, &out.eval);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(NetworkCudaTest, MatchesTheCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Result<NetworkSpec> spec = ParseNetwork(
      "input:1x28x28,conv2d:8:3:pad=1,relu,maxpool:2,conv2d:16:3:pad=1,relu,maxpool:2,"
      "flatten,dense:32,relu,dropout:0.5,dense:10,softmax_ce");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const int batch = 16;
  const Outcome cpu = RunOn("cpu", *spec, batch);
  const Outcome gpu = RunOn("cuda", *spec, batch);
  ASSERT_EQ(cpu.grads.size(), gpu.grads.size());
  EXPECT_NEAR(cpu.train.loss_sum, gpu.train.loss_sum, 1e-3 * std::fabs(cpu.train.loss_sum));
  EXPECT_NEAR(cpu.eval.loss_sum, gpu.eval.loss_sum, 1e-3 * std::fabs(cpu.eval.loss_sum));
  EXPECT_EQ(cpu.eval.correct, gpu.eval.correct);
  for (size_t t = 0; t < cpu.grads.size(); ++t) {
    double scale = 0;
    for (float v : cpu.grads[t]) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (size_t i = 0; i < cpu.grads[t].size(); ++i) {
      ASSERT_NEAR(cpu.grads[t][i], gpu.grads[t][i], 1e-3 * scale + 1e-6)
          << spec->Tables()[t].name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace ps
