// Sparse logistic regression, the network kSparseLrNetwork (input:sparse,wide,sigmoid_ce)
// on LIBSVM rows, against a double-precision reference (loss and finite-difference
// gradients), AUC on cases worked by hand, bad input, the synthetic data generator, and an
// end-to-end check that plain SGD recovers a model from generated data written to and read
// back from LIBSVM files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/network_config.h"
#include "kernels/kernels.h"
#include "worker/auc.h"
#include "worker/ctr_data.h"
#include "worker/libsvm_reader.h"
#include "worker/sparse_data_gen.h"
#include "worker/wide_deep.h"

namespace ps {
namespace {

namespace fs = std::filesystem;

// A data set from (label, {id, value}...) rows, as a job loads LIBSVM rows.
CtrDataset MakeData(
    const std::vector<std::pair<int32_t, std::vector<std::pair<uint64_t, float>>>>& rows) {
  SparseDataset d;
  d.offsets.push_back(0);
  for (const auto& [label, features] : rows) {
    for (const auto& [id, value] : features) {
      d.features.push_back(id);
      d.values.push_back(value);
    }
    d.labels.push_back(label);
    d.offsets.push_back(static_cast<int64_t>(d.features.size()));
    ++d.count;
  }
  Result<CtrDataset> c = CtrFromLibsvm(std::move(d));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : CtrDataset{};
}

CtrBatch Batch(const CtrDataset& d, std::span<const int64_t> examples) {
  Result<CtrBatch> b = MakeCtrBatch(d, examples);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : CtrBatch{};
}

// The sparse LR network on the CPU backend, called as the job's model calls it.
class SparseLr {
 public:
  SparseLr() {
    Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
    EXPECT_TRUE(k.ok());
    kernels_ = std::move(k).value();
    Result<NetworkSpec> spec = ParseNetwork(kSparseLrNetwork);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    Result<std::unique_ptr<WideDeep>> net = WideDeep::Create(*spec, kernels_.get(), 4096, 1);
    EXPECT_TRUE(net.ok()) << net.status().ToString();
    net_ = std::move(net).value();
  }
  Status Train(const CtrDataset& d, const CtrBatch& b, std::span<const float> w, float bias,
               std::span<float> grads, float* bias_grad, BatchResult* r) {
    return net_->ForwardBackward(d, b, {{}, w, bias, {}}, {{}, grads, bias_grad, {}}, r);
  }
  Status Evaluate(const CtrDataset& d, const CtrBatch& b, std::span<const float> w, float bias,
                  BatchResult* r, std::vector<float>* scores) {
    return net_->Evaluate(d, b, {{}, w, bias, {}}, r, scores);
  }

 private:
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<WideDeep> net_;
};

// The mean log loss in double, straight from the definition, weights by id.
double ReferenceMeanLoss(const CtrDataset& d, const std::vector<int64_t>& examples,
                         const std::map<uint64_t, double>& w, double bias) {
  double sum = 0;
  for (const int64_t e : examples) {
    double z = bias;
    for (int64_t f = d.ids_begin(e); f < d.ids_end(e); ++f) {
      z += w.at(d.ids[f]) * d.id_values[f];
    }
    const double p = 1.0 / (1.0 + std::exp(-z));
    sum += d.labels[e] == 1 ? -std::log(p) : -std::log(1.0 - p);
  }
  return sum / static_cast<double>(examples.size());
}

TEST(SparseBatchTest, KeysAreSortedDistinctAndIndexed) {
  const CtrDataset d = MakeData({{1, {{30, 1}, {10, 1}}},
                                 {0, {{20, 1}, {30, 2}, {30, 3}}},  // a repeated id
                                 {1, {}},
                                 {0, {{99, 1}}}});
  const std::vector<int64_t> examples = {1, 0, 2, 1};  // example 3 left out, 1 twice
  const CtrBatch b = Batch(d, examples);
  EXPECT_EQ(b.keys, (std::vector<uint64_t>{10, 20, 30}));
  EXPECT_EQ(b.examples, examples);
  // Example 1 (20 30 30), example 0 (30 10), example 2 (), example 1 again.
  EXPECT_EQ(b.key_index, (std::vector<uint32_t>{1, 2, 2, 2, 0, 1, 2, 2}));
  EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 3, 5, 5, 8}));
  EXPECT_EQ(b.values, (std::vector<float>{1, 2, 3, 1, 1, 1, 2, 3}));

  const CtrBatch empty = Batch(d, {});
  EXPECT_TRUE(empty.keys.empty());
  EXPECT_TRUE(empty.key_index.empty());
  EXPECT_EQ(empty.offsets, (std::vector<int64_t>{0}));
  // An example outside the data set is refused by name.
  Result<CtrBatch> far = MakeCtrBatch(d, std::vector<int64_t>{0, 4});
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("example 4 is outside [0, 4)"), std::string::npos)
      << far.status().message();
}

TEST(SparseLrTest, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint64_t> id(0, 40);
  std::uniform_real_distribution<float> value(-2, 2);
  std::vector<std::pair<int32_t, std::vector<std::pair<uint64_t, float>>>> rows;
  for (int i = 0; i < 30; ++i) {
    std::vector<std::pair<uint64_t, float>> f;
    const int n = i % 7;  // includes empty examples
    for (int j = 0; j < n; ++j) f.push_back({id(rng) * 1'000'003, value(rng)});
    rows.push_back({static_cast<int32_t>(rng() % 2), f});
  }
  const CtrDataset d = MakeData(rows);
  std::vector<int64_t> examples;
  for (int i = 0; i < 30; ++i) examples.push_back((i * 7) % 30);
  examples.push_back(3);  // a repeat counts twice
  const CtrBatch b = Batch(d, examples);
  SparseLr lr;

  std::normal_distribution<float> normal(0, 0.7f);
  std::vector<float> w(b.keys.size());
  for (float& x : w) x = normal(rng);
  const float bias = -0.3f;
  std::vector<float> grads(w.size(), 123.0f);  // overwritten, not accumulated
  float bias_grad = 123.0f;
  BatchResult result;
  result.loss_sum = 1.0;  // added to, not overwritten
  ASSERT_TRUE(lr.Train(d, b, w, bias, grads, &bias_grad, &result).ok());

  std::map<uint64_t, double> wd;
  for (size_t k = 0; k < w.size(); ++k) wd[b.keys[k]] = w[k];
  const double loss = ReferenceMeanLoss(d, examples, wd, bias);
  EXPECT_EQ(result.examples, static_cast<int64_t>(examples.size()));
  EXPECT_NEAR((result.loss_sum - 1.0) / result.examples, loss, 1e-5);

  // Central differences in double, so the reference is exact to ~1e-9; the model's float
  // gradients are then off by float rounding only.
  const double eps = 1e-5;
  for (size_t k = 0; k < w.size(); ++k) {
    auto plus = wd, minus = wd;
    plus[b.keys[k]] += eps;
    minus[b.keys[k]] -= eps;
    const double numeric =
        (ReferenceMeanLoss(d, examples, plus, bias) - ReferenceMeanLoss(d, examples, minus, bias)) /
        (2 * eps);
    EXPECT_NEAR(grads[k], numeric, 1e-5 + 1e-4 * std::fabs(numeric)) << "key " << b.keys[k];
  }
  const double numeric_bias = (ReferenceMeanLoss(d, examples, wd, bias + eps) -
                               ReferenceMeanLoss(d, examples, wd, bias - eps)) /
                              (2 * eps);
  EXPECT_NEAR(bias_grad, numeric_bias, 1e-5 + 1e-4 * std::fabs(numeric_bias));

  // Correct counts p > 0.5 against the label.
  int64_t correct = 0;
  for (const int64_t e : examples) {
    double z = bias;
    for (int64_t f = d.ids_begin(e); f < d.ids_end(e); ++f) z += wd[d.ids[f]] * d.id_values[f];
    correct += (z > 0) == (d.labels[e] == 1);
  }
  EXPECT_EQ(result.correct, correct);
}

TEST(SparseLrTest, LossIsFiniteForHugeLogits) {
  const CtrDataset d = MakeData({{0, {{1, 1}}}, {1, {{1, 1}}}, {1, {{2, 1}}}});
  const std::vector<int64_t> examples = {0, 1, 2};
  const CtrBatch b = Batch(d, examples);
  const std::vector<float> w = {1000.0f, -1000.0f};
  std::vector<float> grads(2);
  float bias_grad = 0;
  BatchResult r;
  SparseLr lr;
  ASSERT_TRUE(lr.Train(d, b, w, 0, grads, &bias_grad, &r).ok());
  // Example 0 is wrong by a logit of 1000, 1 right by 1000, 2 wrong by 1000.
  EXPECT_TRUE(std::isfinite(r.loss_sum));
  EXPECT_NEAR(r.loss_sum, 2000.0, 1e-6);
  EXPECT_EQ(r.correct, 1);
  EXPECT_NEAR(grads[0], 1.0 / 3, 1e-6);   // (p - y) = 1 for example 0, 0 for example 1
  EXPECT_NEAR(grads[1], -1.0 / 3, 1e-6);  // (p - y) = -1 for example 2
  EXPECT_TRUE(std::isfinite(bias_grad));
}

TEST(SparseLrTest, EvaluateMatchesForwardBackwardAndReturnsProbabilities) {
  const CtrDataset d = MakeData({{1, {{5, 1}, {6, 2}}}, {0, {{6, 1}}}, {1, {}}});
  const std::vector<int64_t> examples = {0, 1, 2};
  const CtrBatch b = Batch(d, examples);
  const std::vector<float> w = {0.5f, -0.25f};
  const float bias = 0.1f;
  std::vector<float> grads(2);
  float bias_grad = 0;
  BatchResult train, eval;
  SparseLr lr;
  ASSERT_TRUE(lr.Train(d, b, w, bias, grads, &bias_grad, &train).ok());
  std::vector<float> scores = {42.0f};  // appended to
  ASSERT_TRUE(lr.Evaluate(d, b, w, bias, &eval, &scores).ok());
  EXPECT_DOUBLE_EQ(eval.loss_sum, train.loss_sum);
  EXPECT_EQ(eval.correct, train.correct);
  EXPECT_EQ(eval.examples, 3);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_EQ(scores[0], 42.0f);
  const double z[] = {0.1 + 0.5 - 0.5, 0.1 - 0.25, 0.1};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(scores[i + 1], 1 / (1 + std::exp(-z[i])), 1e-6);
  ASSERT_TRUE(lr.Evaluate(d, b, w, bias, nullptr, nullptr).ok());

  // An empty batch: zero gradients, no change to the result.
  const CtrBatch none = Batch(d, {});
  BatchResult untouched;
  float g = 5;
  ASSERT_TRUE(lr.Train(d, none, {}, bias, {}, &g, &untouched).ok());
  EXPECT_EQ(g, 0.0f);
  EXPECT_EQ(untouched.examples, 0);
}

TEST(SparseLrTest, RejectsBadInput) {
  CtrDataset d = MakeData({{1, {{5, 1}, {6, 2}}}, {0, {{6, 1}}}});
  const std::vector<int64_t> both = {0, 1};
  const CtrBatch b = Batch(d, both);
  std::vector<float> w(2), grads(2);
  float bias_grad = 0;
  BatchResult r;
  SparseLr lr;
  const auto code = [](const Status& s) { return s.code(); };
  const StatusCode kBad = StatusCode::kInvalidArgument;

  std::vector<float> short_w(1);
  EXPECT_EQ(code(lr.Train(d, b, short_w, 0, grads, &bias_grad, &r)), kBad);
  EXPECT_EQ(code(lr.Train(d, b, w, 0, std::span<float>(grads).first(1), &bias_grad, &r)), kBad);
  EXPECT_EQ(code(lr.Train(d, b, w, 0, grads, nullptr, &r)), kBad);
  EXPECT_EQ(code(lr.Evaluate(d, b, short_w, 0, &r, nullptr)), kBad);

  CtrBatch far = b;
  far.examples[1] = 2;  // outside the data set
  EXPECT_EQ(code(lr.Train(d, far, w, 0, grads, &bias_grad, &r)), kBad);
  EXPECT_EQ(code(lr.Evaluate(d, far, w, 0, &r, nullptr)), kBad);

  // A batch made from another data set.
  const CtrDataset other = MakeData({{1, {{5, 1}}}, {0, {{6, 1}}}});
  const CtrBatch foreign = Batch(other, both);
  EXPECT_EQ(code(lr.Train(d, foreign, w, 0, grads, &bias_grad, &r)), kBad);

  CtrBatch bad_index = b;
  bad_index.key_index[0] = 7;
  EXPECT_EQ(code(lr.Train(d, bad_index, w, 0, grads, &bias_grad, &r)), kBad);

  CtrBatch short_values = b;
  short_values.values.pop_back();
  EXPECT_EQ(code(lr.Train(d, short_values, w, 0, grads, &bias_grad, &r)), kBad);

  CtrDataset bad_label = d;
  bad_label.labels[1] = 2;
  EXPECT_EQ(code(lr.Train(bad_label, b, w, 0, grads, &bias_grad, &r)), kBad);

  CtrDataset truncated = d;
  truncated.id_offsets.pop_back();
  EXPECT_EQ(code(lr.Evaluate(truncated, b, w, 0, &r, nullptr)), kBad);
  EXPECT_FALSE(MakeCtrBatch(truncated, both).ok());

  // Rows the LIBSVM reader would never give are refused when converted.
  SparseDataset rows;
  rows.count = 1;
  rows.offsets = {0, 1};
  rows.features = {3};
  rows.values = {1};
  rows.labels = {2};
  EXPECT_EQ(code(CtrFromLibsvm(rows).status()), kBad);
  rows.labels = {1};
  rows.offsets = {0, 2};
  EXPECT_EQ(code(CtrFromLibsvm(rows).status()), kBad);

  EXPECT_EQ(r.examples, 0);  // no failed call touched the result
}

TEST(AucTest, HandComputedCases) {
  const std::vector<int32_t> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, labels), 0.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels), 0.5);
  // Positives 0.35 and 0.8 against negatives 0.1 and 0.4: 0.35 beats 0.1 only, 0.8 beats
  // both: 3 of 4 pairs.
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, labels), 0.75);
  // Positives 0.5 and 0.9 against negatives 0.2 and 0.5: 0.5 beats 0.2 and ties 0.5
  // (half), 0.9 beats both: 3.5 of 4 pairs.
  EXPECT_DOUBLE_EQ(
      Auc(std::vector<float>{0.2f, 0.5f, 0.5f, 0.9f}, std::vector<int32_t>{0, 1, 0, 1}), 0.875);
  // 3 positives x 2 negatives, unsorted input: positives 0.7, 0.3, 0.6; negatives 0.4, 0.6.
  // 0.7 beats both (2), 0.3 beats none (0), 0.6 beats 0.4 and ties 0.6 (1.5): 3.5 / 6.
  EXPECT_DOUBLE_EQ(
      Auc(std::vector<float>{0.7f, 0.4f, 0.3f, 0.6f, 0.6f}, std::vector<int32_t>{1, 0, 1, 0, 1}),
      3.5 / 6);
}

TEST(AucTest, DegenerateInput) {
  EXPECT_DOUBLE_EQ(Auc({}, {}), 0.5);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.9f}, std::vector<int32_t>{1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.9f}, std::vector<int32_t>{0, 0}), 0.5);
  // A NaN score ranks below everything.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{nan, 0.1f}, std::vector<int32_t>{0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{nan, 0.1f, nan}, std::vector<int32_t>{1, 0, 0}), 0.25);
}

TEST(SparseDataGenTest, RejectsBadOptions) {
  EXPECT_FALSE(SparseDataGenerator::Create({.features = 0}).ok());
  EXPECT_FALSE(SparseDataGenerator::Create({.features = 10, .nnz = 11}).ok());
  EXPECT_FALSE(SparseDataGenerator::Create({.features = 10, .nnz = 0}).ok());
  EXPECT_FALSE(SparseDataGenerator::Create({.features = 10, .nnz = 2, .zipf = -1}).ok());
  EXPECT_FALSE(
      SparseDataGenerator::Create({.features = 10, .nnz = 2, .nonzero_fraction = 1.5}).ok());
  EXPECT_FALSE(
      SparseDataGenerator::Create(
          {.features = 10, .nnz = 2, .logit_std = std::numeric_limits<double>::quiet_NaN()})
          .ok());
}

TEST(SparseDataGenTest, ExamplesAreDistinctSkewedAndReproducible) {
  const SparseDataGenOptions options = {.features = 5000, .nnz = 8, .zipf = 1.1, .seed = 3};
  Result<SparseDataGenerator> a = SparseDataGenerator::Create(options);
  Result<SparseDataGenerator> b = SparseDataGenerator::Create(options);
  ASSERT_TRUE(a.ok() && b.ok());
  SparseDataset da, db;
  a->Generate(4000, &da, nullptr);
  b->Generate(4000, &db, nullptr);
  EXPECT_EQ(da.features, db.features);
  EXPECT_EQ(da.labels, db.labels);
  ASSERT_EQ(da.count, 4000);

  std::unordered_map<uint64_t, int> freq;
  for (int64_t e = 0; e < da.count; ++e) {
    ASSERT_EQ(da.offsets[e + 1] - da.offsets[e], 8);
    for (int64_t f = da.offsets[e]; f < da.offsets[e + 1]; ++f) {
      ASSERT_GE(da.features[f], 1u);
      ASSERT_LE(da.features[f], 5000u);
      if (f > da.offsets[e]) {
        ASSERT_LT(da.features[f - 1], da.features[f]);  // sorted, distinct
      }
      ++freq[da.features[f]];
    }
  }
  std::vector<int> counts;
  for (const auto& [id, n] : freq) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  // Zipf 1.1 over 5000 ids: the top id is in roughly 1 / H(5000, 1.1) ~ 14% of draws, far
  // above the uniform rate of 8 / 5000 per example.
  EXPECT_GT(counts[0], 4000 / 20);
  // The rarest ids are expected well under once in 32000 draws: some never appear.
  EXPECT_LT(freq.size(), 5000u);
  const int64_t positives = std::count(da.labels.begin(), da.labels.end(), 1);
  EXPECT_GT(positives, 4000 / 5);
  EXPECT_LT(positives, 4000 * 4 / 5);

  // Another seed, other data.
  Result<SparseDataGenerator> c =
      SparseDataGenerator::Create({.features = 5000, .nnz = 8, .zipf = 1.1, .seed = 4});
  ASSERT_TRUE(c.ok());
  SparseDataset dc;
  c->Generate(100, &dc, nullptr);
  EXPECT_NE(std::vector<uint64_t>(da.features.begin(), da.features.begin() + 800), dc.features);
}

TEST(SparseDataGenTest, UniformAndSteepZipfFillEveryExample) {
  for (const double zipf : {0.0, 8.0}) {
    SCOPED_TRACE(zipf);
    Result<SparseDataGenerator> g =
        SparseDataGenerator::Create({.features = 50, .nnz = 40, .zipf = zipf, .seed = 1});
    ASSERT_TRUE(g.ok());
    SparseDataset d;
    g->Generate(200, &d, nullptr);
    for (int64_t e = 0; e < d.count; ++e) {
      std::vector<uint64_t> ids(d.features.begin() + d.offsets[e],
                                d.features.begin() + d.offsets[e + 1]);
      ASSERT_EQ(ids.size(), 40u);
      ASSERT_TRUE(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
    }
  }
}

class SparseLrRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sparse_lr_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Generated data -> LIBSVM files -> reader -> sequential minibatch SGD through the model's
// API, with the weights in a hash map as a sparse server table would hold them.
TEST_F(SparseLrRecoveryTest, SgdRecoversAModelFromGeneratedData) {
  const SparseDataGenOptions options = {.features = 20'000, .nnz = 10, .zipf = 1.1, .seed = 11};
  Result<SparseDataGenerator> gen = SparseDataGenerator::Create(options);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  const std::string train_path = (dir_ / "train.svm").string();
  const std::string test_path = (dir_ / "test.svm").string();
  ASSERT_TRUE(gen->WriteLibsvm(train_path, 30'000).ok());
  ASSERT_TRUE(gen->WriteLibsvm(test_path, 10'000).ok());
  ASSERT_TRUE(gen->WriteTruth((dir_ / "truth.txt").string()).ok());

  // Hashed ids, as a job with --hash_features would train.
  Result<SparseDataset> train_rows = LoadLibsvm(train_path, {.hash_features = true});
  Result<SparseDataset> test_rows = LoadLibsvm(test_path, {.hash_features = true});
  ASSERT_TRUE(train_rows.ok()) << train_rows.status().ToString();
  ASSERT_TRUE(test_rows.ok()) << test_rows.status().ToString();
  Result<CtrDataset> train = CtrFromLibsvm(std::move(train_rows).value());
  Result<CtrDataset> test = CtrFromLibsvm(std::move(test_rows).value());
  ASSERT_TRUE(train.ok() && test.ok());
  ASSERT_EQ(train->count, 30'000);
  ASSERT_EQ(test->count, 10'000);

  // The Bayes AUC: the true model's scores on the test set (unhashed ids).
  Result<SparseDataset> test_plain = LoadLibsvm(test_path);
  ASSERT_TRUE(test_plain.ok());
  std::vector<float> true_scores;
  for (int64_t e = 0; e < test_plain->count; ++e) {
    double z = options.bias;
    for (int64_t f = test_plain->offsets[e]; f < test_plain->offsets[e + 1]; ++f) {
      z += gen->weight(test_plain->features[f]);
    }
    true_scores.push_back(static_cast<float>(1 / (1 + std::exp(-z))));
  }
  const double bayes_auc = Auc(true_scores, test_plain->labels);

  std::unordered_map<uint64_t, float> table;
  float bias = 0;
  const float lr = 2.0f;
  const int batch_size = 16;
  std::vector<int64_t> order(train->count);
  for (int64_t i = 0; i < train->count; ++i) order[i] = i;
  std::mt19937 rng(5);
  std::vector<float> w, grads;
  SparseLr model;
  const auto evaluate = [&](std::vector<float>* scores) {
    std::vector<int64_t> all(test->count);
    for (int64_t i = 0; i < test->count; ++i) all[i] = i;
    const CtrBatch b = Batch(*test, all);
    w.assign(b.keys.size(), 0.0f);
    for (size_t k = 0; k < b.keys.size(); ++k) {
      if (auto it = table.find(b.keys[k]); it != table.end()) w[k] = it->second;
    }
    BatchResult r;
    scores->clear();
    EXPECT_TRUE(model.Evaluate(*test, b, w, bias, &r, scores).ok());
    return r;
  };
  std::vector<float> scores;
  evaluate(&scores);
  const double untrained_auc = Auc(scores, test->labels);

  BatchResult last_epoch;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    last_epoch = {};
    for (size_t start = 0; start < order.size(); start += batch_size) {
      const size_t n = std::min<size_t>(batch_size, order.size() - start);
      const CtrBatch b = Batch(*train, std::span(order).subspan(start, n));
      w.resize(b.keys.size());
      grads.resize(b.keys.size());
      for (size_t k = 0; k < b.keys.size(); ++k) w[k] = table[b.keys[k]];  // pull
      float bias_grad = 0;
      ASSERT_TRUE(model.Train(*train, b, w, bias, grads, &bias_grad, &last_epoch).ok());
      for (size_t k = 0; k < b.keys.size(); ++k) table[b.keys[k]] -= lr * grads[k];  // push
      bias -= lr * bias_grad;
    }
  }
  const BatchResult r = evaluate(&scores);
  const double auc = Auc(scores, test->labels);
  std::printf(
      "sparse LR: %zu weights learned; train loss %.4f; test loss %.4f, accuracy %.4f, "
      "AUC %.4f (untrained %.4f, Bayes %.4f)\n",
      table.size(), last_epoch.loss_sum / last_epoch.examples, r.loss_sum / r.examples,
      static_cast<double>(r.correct) / r.examples, auc, untrained_auc, bayes_auc);
  EXPECT_DOUBLE_EQ(untrained_auc, 0.5);  // every score is sigmoid(0): all tied
  EXPECT_GE(bayes_auc, 0.85);
  EXPECT_LE(bayes_auc, 0.95);
  EXPECT_GE(auc, 0.80);
  EXPECT_LE(auc, bayes_auc + 0.01);  // a learned model cannot beat the truth (beyond noise)
}

}  // namespace
}  // namespace ps
