// --model=wide_deep's compute (worker/wide_deep.h): the gradients of the embedding rows, the
// wide weights and the MLP against central differences, and batches that do not fit.
#include "worker/wide_deep.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/network_config.h"
#include "kernels/kernels.h"
#include "worker/ctr_data.h"

namespace ps {
namespace {

// The mean loss of a batch, by the model's own forward pass.
struct GradFixture {
  std::unique_ptr<Kernels> kernels;
  NetworkSpec spec;
  std::unique_ptr<WideDeep> net;
  CtrDataset data;
  CtrBatch batch;
  std::vector<float> emb, wide, emb_g, wide_g;
  float bias = 0.3f, bias_g = 0;
  std::vector<std::vector<float>> mlp, mlp_g;

  WideDeepParams Params() const {
    WideDeepParams p{emb, wide, bias, {}};
    for (const auto& v : mlp) p.mlp.push_back(v.data());
    return p;
  }
  double MeanLoss() {
    BatchResult r;
    EXPECT_TRUE(net->Evaluate(data, batch, Params(), &r, nullptr).ok());
    return r.loss_sum / static_cast<double>(r.examples);
  }
};

TEST(WideDeepTest, GradientsMatchNumericalGradient) {
  GradFixture f;
  Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
  ASSERT_TRUE(k.ok());
  f.kernels = std::move(k).value();
  Result<NetworkSpec> spec =
      ParseNetwork("input:3:fields=2,embedding:2,concat,dense:5,relu,dense:1,wide,sigmoid_ce");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  f.spec = *spec;
  Result<std::unique_ptr<WideDeep>> net = WideDeep::Create(f.spec, f.kernels.get(), 8, 1);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  f.net = std::move(net).value();
  // 4 examples over 3 ids: id 7 is shared by examples and by both fields of example 3.
  f.data.dense = 3;
  f.data.fields = 2;
  f.data.count = 4;
  f.data.ids = {7, 9, 8, 7, 7, 9, 7, 7};
  f.data.labels = {1, 0, 0, 1};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (int i = 0; i < 12; ++i) f.data.values.push_back(normal(rng));
  const std::vector<int64_t> examples = {0, 1, 2, 3};
  Result<CtrBatch> batch = MakeCtrBatch(f.data, examples);
  ASSERT_TRUE(batch.ok());
  f.batch = *batch;
  ASSERT_EQ(f.batch.keys, (std::vector<uint64_t>{7, 8, 9}));
  auto fill = [&](std::vector<float>* v, size_t n) {
    v->resize(n);
    for (float& x : *v) x = normal(rng);
  };
  fill(&f.emb, 6);
  fill(&f.wide, 3);
  f.emb_g.resize(6);
  f.wide_g.resize(3);
  for (const size_t n : f.net->mlp_sizes()) {
    f.mlp.emplace_back();
    fill(&f.mlp.back(), n);
    f.mlp_g.emplace_back(n);
  }
  ASSERT_EQ(f.mlp.size(), 4u);  // fc0.weight, fc0.bias, fc1.weight, fc1.bias
  WideDeepGrads g{f.emb_g, f.wide_g, &f.bias_g, {}};
  for (auto& v : f.mlp_g) g.mlp.push_back(v.data());
  BatchResult r;
  ASSERT_TRUE(f.net->ForwardBackward(f.data, f.batch, f.Params(), g, &r).ok());
  EXPECT_EQ(r.examples, 4);
  EXPECT_NEAR(f.MeanLoss(), r.loss_sum / 4, 1e-6);

  const float eps = 1e-3f;
  auto check = [&](float* value, float analytic, const std::string& what) {
    const float keep = *value;
    *value = keep + eps;
    const double up = f.MeanLoss();
    *value = keep - eps;
    const double down = f.MeanLoss();
    *value = keep;
    const double numeric = (up - down) / (2.0 * eps);
    EXPECT_NEAR(analytic, numeric, 5e-3 + 2e-2 * std::fabs(numeric)) << what;
  };
  for (size_t i = 0; i < f.emb.size(); ++i)
    check(&f.emb[i], f.emb_g[i], "emb " + std::to_string(i));
  for (size_t i = 0; i < f.wide.size(); ++i) {
    check(&f.wide[i], f.wide_g[i], "wide " + std::to_string(i));
  }
  check(&f.bias, f.bias_g, "wide.bias");
  for (size_t t = 0; t < f.mlp.size(); ++t) {
    for (size_t i = 0; i < f.mlp[t].size(); ++i) {
      check(&f.mlp[t][i], f.mlp_g[t][i],
            "mlp table " + std::to_string(t) + "[" + std::to_string(i) + "]");
    }
  }
  // The shared id's gradient sums over its uses: not zero, unlike an unused row would be.
  EXPECT_NE(f.wide_g[0], 0.0f);
}

TEST(WideDeepTest, BatchesThatDoNotFitAreRefused) {
  Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
  ASSERT_TRUE(k.ok());
  Result<NetworkSpec> spec =
      ParseNetwork("input:3:fields=2,embedding:2,concat,dense:1,wide,sigmoid_ce");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  Result<std::unique_ptr<WideDeep>> net = WideDeep::Create(*spec, k->get(), 2, 1);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  CtrDataset d;
  d.dense = 3;
  d.fields = 2;
  d.count = 1;
  d.ids = {1, 2};
  d.values = {0, 0, 0};
  d.labels = {1};
  EXPECT_FALSE(MakeCtrBatch(d, std::vector<int64_t>{1}).ok());  // out of range
  Result<CtrBatch> b = MakeCtrBatch(d, std::vector<int64_t>{0});
  ASSERT_TRUE(b.ok());
  std::vector<float> emb(3), wide(2), w(8), bias(1);  // emb should be 2 keys x 2
  WideDeepParams p{emb, wide, 0, {w.data(), bias.data()}};
  BatchResult r;
  Status s = (*net)->Evaluate(d, *b, p, &r, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("do not fit the batch's 2 keys"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ps
