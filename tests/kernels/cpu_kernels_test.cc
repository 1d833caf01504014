// The CPU backend against naive double-precision references, on random shapes including
// 1, odd sizes and empty ones; and device-string parsing in MakeKernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "kernels/kernels.h"

namespace ps {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class CpuKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    k_ = std::move(k).value();
  }
  std::unique_ptr<Kernels> k_;
  std::mt19937 rng_{12345};
};

TEST_F(CpuKernelsTest, DeviceNameAndMemory) {
  EXPECT_EQ(k_->DeviceName().rfind("cpu: ", 0), 0u) << k_->DeviceName();
  EXPECT_FALSE(k_->IsCuda());
  Result<DeviceBuffer<float>> buf = DeviceBuffer<float>::Make(k_.get(), 1000);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->get()) % 64, 0u) << "not 64-byte aligned";
  std::vector<float> in = RandomVector(1000, rng_), out(1000);
  ASSERT_TRUE(k_->CopyToDevice(buf->get(), in.data(), in.size() * sizeof(float)).ok());
  ASSERT_TRUE(k_->CopyToHost(out.data(), buf->get(), out.size() * sizeof(float)).ok());
  EXPECT_EQ(in, out);
  EXPECT_TRUE(k_->Synchronize().ok());
  // Empty buffers allocate nothing and free cleanly.
  Result<DeviceBuffer<float>> empty = DeviceBuffer<float>::Make(k_.get(), 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->get(), nullptr);
}

// ---- Gemm ----

// C = alpha op(A) op(B) + beta C in double; *bound gets, per element, the sum of the
// magnitudes of the terms, which scales the float rounding error.
void ReferenceGemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& a,
                   const std::vector<float>& b, float beta, const std::vector<float>& c,
                   std::vector<double>* out, std::vector<double>* bound) {
  out->assign(static_cast<size_t>(m) * n, 0.0);
  bound->assign(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        const double av =
            ta ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p];
        const double bv =
            tb ? b[static_cast<size_t>(j) * k + p] : b[static_cast<size_t>(p) * n + j];
        sum += av * bv;
        mag += std::abs(av * bv);
      }
      const size_t idx = static_cast<size_t>(i) * n + j;
      // BLAS: beta == 0 means C is not read.
      const double cv = beta == 0.0f ? 0.0 : beta * static_cast<double>(c[idx]);
      (*out)[idx] = alpha * sum + cv;
      (*bound)[idx] = std::abs(alpha) * mag + std::abs(cv);
    }
  }
}

using GemmCase = std::tuple<int, int, int>;

TEST_F(CpuKernelsTest, GemmMatchesReferenceOnAllTransposes) {
  const std::vector<GemmCase> shapes = {{1, 1, 1}, {3, 5, 7},   {17, 33, 9}, {64, 10, 128},
                                        {1, 7, 1}, {31, 1, 65}, {2, 3, 1},   {0, 5, 3},
                                        {5, 0, 3}, {5, 3, 0},   {0, 0, 0},   {128, 96, 200}};
  const std::vector<std::pair<float, float>> scalars = {{1.0f, 0.0f}, {0.5f, 2.0f}, {-1.5f, 1.0f}};
  for (const auto& [m, n, k] : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const auto& [alpha, beta] : scalars) {
        SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta
                                        << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
        std::vector<float> a = RandomVector(static_cast<size_t>(m) * k, rng_);
        std::vector<float> b = RandomVector(static_cast<size_t>(k) * n, rng_);
        std::vector<float> c = RandomVector(static_cast<size_t>(m) * n, rng_);
        std::vector<double> ref, bound;
        ReferenceGemm(ta, tb, m, n, k, alpha, a, b, beta, c, &ref, &bound);
        ASSERT_TRUE(k_->Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data()).ok());
        for (size_t i = 0; i < c.size(); ++i) {
          ASSERT_NEAR(c[i], ref[i], 1e-6 * (k + 2) * bound[i] + 1e-6) << "element " << i;
        }
      }
    }
  }
}

TEST_F(CpuKernelsTest, GemmBetaZeroIgnoresNanInC) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = RandomVector(4 * 3, rng_), b = RandomVector(3 * 5, rng_);
  std::vector<float> c(4 * 5, nan);
  ASSERT_TRUE(k_->Gemm(false, false, 4, 5, 3, 1.0f, a.data(), b.data(), 0.0f, c.data()).ok());
  for (float v : c) EXPECT_TRUE(std::isfinite(v));
  // k == 0: C = beta C, and beta == 0 still overwrites.
  std::vector<float> d(6, nan);
  ASSERT_TRUE(k_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, d.data()).ok());
  for (float v : d) EXPECT_EQ(v, 0.0f);
  std::vector<float> e(6, 1.5f);
  ASSERT_TRUE(k_->Gemm(true, true, 2, 3, 0, 1.0f, nullptr, nullptr, 2.0f, e.data()).ok());
  for (float v : e) EXPECT_EQ(v, 3.0f);
}

TEST_F(CpuKernelsTest, GemmRejectsNegativeSizes) {
  float c = 0;
  Status s = k_->Gemm(false, false, -1, 1, 1, 1.0f, &c, &c, 0.0f, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("m = -1"), std::string::npos) << s.message();
  EXPECT_EQ(k_->Gemm(false, false, 1, 1, -3, 1.0f, &c, &c, 0.0f, &c).code(),
            StatusCode::kInvalidArgument);
}

// ---- elementwise ops ----

const std::vector<std::pair<int, int>> kMatrixShapes = {{0, 5},   {5, 0},   {1, 1}, {13, 7},
                                                        {64, 10}, {3, 257}, {0, 0}};

TEST_F(CpuKernelsTest, AddBias) {
  for (const auto& [rows, cols] : kMatrixShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    std::vector<float> y = RandomVector(static_cast<size_t>(rows) * cols, rng_);
    std::vector<float> bias = RandomVector(cols, rng_);
    std::vector<float> expected = y;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) expected[static_cast<size_t>(i) * cols + j] += bias[j];
    }
    ASSERT_TRUE(k_->AddBias(rows, cols, bias.data(), y.data()).ok());
    EXPECT_EQ(y, expected);
  }
  EXPECT_EQ(k_->AddBias(-1, 2, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(CpuKernelsTest, ReluAndBackward) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}}) {
    SCOPED_TRACE(n);
    std::vector<float> y = RandomVector(n, rng_);
    if (n > 2) y[1] = 0.0f;  // the boundary: the gradient is taken as 0 there
    std::vector<float> dy = RandomVector(n, rng_);
    std::vector<float> relu = y, ddy = dy;
    ASSERT_TRUE(k_->Relu(n, relu.data()).ok());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(relu[i], y[i] > 0 ? y[i] : 0.0f);
    ASSERT_TRUE(k_->ReluBackward(n, relu.data(), ddy.data()).ok());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(ddy[i], y[i] > 0 ? dy[i] : 0.0f);
  }
  // NaN is passed on, not hidden: a diverging run must stay visible.
  std::vector<float> v = {std::numeric_limits<float>::quiet_NaN(), -2.0f};
  ASSERT_TRUE(k_->Relu(v.size(), v.data()).ok());
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 0.0f);
}

TEST_F(CpuKernelsTest, BiasGrad) {
  for (const auto& [rows, cols] : kMatrixShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    std::vector<float> dy = RandomVector(static_cast<size_t>(rows) * cols, rng_);
    std::vector<float> db(cols, 99.0f);  // overwritten, not added to
    ASSERT_TRUE(k_->BiasGrad(rows, cols, dy.data(), db.data()).ok());
    for (int j = 0; j < cols; ++j) {
      double sum = 0;
      for (int i = 0; i < rows; ++i) sum += dy[static_cast<size_t>(i) * cols + j];
      EXPECT_NEAR(db[j], sum, 1e-6 * (rows + 1));
    }
  }
}

TEST_F(CpuKernelsTest, Scale) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{33}}) {
    std::vector<float> x = RandomVector(n, rng_), y = x;
    ASSERT_TRUE(k_->Scale(n, -0.25f, y.data()).ok());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(y[i], x[i] * -0.25f);
  }
}

// ---- softmax cross-entropy ----

struct CeReference {
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<double> grad;
};

CeReference ReferenceCe(int rows, int classes, const std::vector<float>& logits,
                        const std::vector<int32_t>& labels, double scale) {
  CeReference r;
  r.grad.resize(static_cast<size_t>(rows) * classes);
  for (int i = 0; i < rows; ++i) {
    const float* x = &logits[static_cast<size_t>(i) * classes];
    double max = x[0];
    int argmax = 0;
    for (int j = 1; j < classes; ++j) {
      if (x[j] > max) {
        max = x[j];
        argmax = j;
      }
    }
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(x[j] - max);
    r.loss_sum += std::log(sum) + max - x[labels[i]];
    r.correct += argmax == labels[i];
    for (int j = 0; j < classes; ++j) {
      r.grad[static_cast<size_t>(i) * classes + j] =
          (std::exp(x[j] - max) / sum - (j == labels[i])) * scale;
    }
  }
  return r;
}

void CheckCe(Kernels* k, int rows, int classes, const std::vector<float>& logits,
             const std::vector<int32_t>& labels) {
  const float scale = rows > 0 ? 1.0f / rows : 1.0f;
  const CeReference ref = ReferenceCe(rows, classes, logits, labels, scale);
  std::vector<float> grad(logits.size(), 123.0f);
  double loss = -1;
  int64_t correct = -1;
  ASSERT_TRUE(k->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), scale,
                                     grad.data(), &loss, &correct)
                  .ok());
  EXPECT_NEAR(loss, ref.loss_sum, 1e-5 * (std::abs(ref.loss_sum) + rows + 1));
  EXPECT_EQ(correct, ref.correct);
  for (size_t i = 0; i < grad.size(); ++i) {
    ASSERT_TRUE(std::isfinite(grad[i])) << i;
    ASSERT_NEAR(grad[i], ref.grad[i], 1e-6) << "element " << i;
  }
  // Without a gradient buffer: the same loss and count.
  double loss2 = -1;
  int64_t correct2 = -1;
  ASSERT_TRUE(k->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), scale, nullptr,
                                     &loss2, &correct2)
                  .ok());
  EXPECT_EQ(loss2, loss);
  EXPECT_EQ(correct2, correct);
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyRandom) {
  for (const auto& [rows, classes] :
       std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {7, 10}, {64, 10}, {5, 33}, {3, 1000}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << classes);
    std::vector<float> logits = RandomVector(static_cast<size_t>(rows) * classes, rng_, -5, 5);
    std::vector<int32_t> labels(rows);
    std::uniform_int_distribution<int> pick(0, classes - 1);
    for (int32_t& l : labels) l = pick(rng_);
    CheckCe(k_.get(), rows, classes, logits, labels);
  }
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyLargeLogitsStayFinite) {
  // exp(1e4) overflows float and double alike: only a max-shifted softmax survives.
  std::vector<float> logits = RandomVector(8 * 10, rng_, -100, 100);
  for (float& v : logits) v += 1e4f;
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  CheckCe(k_.get(), 8, 10, logits, labels);

  // One very confident wrong row: loss 2000, the gradient a clean -1/+1 pair.
  std::vector<float> two = {1000.0f, -1000.0f};
  std::vector<int32_t> label = {1};
  std::vector<float> grad(2);
  double loss = 0;
  int64_t correct = -1;
  ASSERT_TRUE(
      k_->SoftmaxCrossEntropy(1, 2, two.data(), label.data(), 1.0f, grad.data(), &loss, &correct)
          .ok());
  EXPECT_DOUBLE_EQ(loss, 2000.0);
  EXPECT_EQ(correct, 0);
  EXPECT_FLOAT_EQ(grad[0], 1.0f);
  EXPECT_FLOAT_EQ(grad[1], -1.0f);
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyTiesPickFirstClass) {
  std::vector<float> logits(2 * 4, 0.5f);
  std::vector<int32_t> labels = {0, 3};
  double loss = 0;
  int64_t correct = -1;
  ASSERT_TRUE(
      k_->SoftmaxCrossEntropy(2, 4, logits.data(), labels.data(), 1.0f, nullptr, &loss, &correct)
          .ok());
  EXPECT_NEAR(loss, 2 * std::log(4.0), 1e-12);
  EXPECT_EQ(correct, 1);
}

TEST_F(CpuKernelsTest, SoftmaxCrossEntropyEmptyAndBadLabels) {
  double loss = 7;
  int64_t correct = 7;
  ASSERT_TRUE(
      k_->SoftmaxCrossEntropy(0, 10, nullptr, nullptr, 1.0f, nullptr, &loss, &correct).ok());
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(correct, 0);

  std::vector<float> logits(3 * 4, 0.0f), grad(3 * 4, 5.0f);
  for (int32_t bad : {-1, 4, 1000}) {
    std::vector<int32_t> labels = {0, bad, 1};
    Status s = k_->SoftmaxCrossEntropy(3, 4, logits.data(), labels.data(), 1.0f, grad.data(), &loss,
                                       &correct);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("label " + std::to_string(bad) + " of row 1"), std::string::npos)
        << s.message();
  }
  for (float g : grad) EXPECT_EQ(g, 5.0f) << "a rejected batch must not write gradients";
  std::vector<int32_t> labels = {0, 0, 0};
  EXPECT_EQ(
      k_->SoftmaxCrossEntropy(3, 0, logits.data(), labels.data(), 1.0f, nullptr, &loss, &correct)
          .code(),
      StatusCode::kInvalidArgument);
}

// ---- device selection ----

TEST(MakeKernelsTest, RejectsUnknownDeviceStrings) {
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda: 1", "cuda:1x",
                          "cuda0", "cpu:0", "cuda:99999999999999999999"}) {
    Result<std::unique_ptr<Kernels>> k = MakeKernels(bad);
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(k.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << k.status().message();
    EXPECT_NE(k.status().message().find("cuda:N"), std::string::npos) << k.status().message();
  }
}

TEST(MakeKernelsTest, CudaWithoutGpuIsFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  for (const char* device : {"cuda", "cuda:0", "cuda:3"}) {
    Result<std::unique_ptr<Kernels>> k = MakeKernels(device);
    ASSERT_FALSE(k.ok()) << device;
    EXPECT_EQ(k.status().code(), StatusCode::kFailedPrecondition) << k.status().ToString();
    EXPECT_NE(k.status().message().find("cuda"), std::string::npos) << k.status().message();
  }
}

TEST(MakeKernelsTest, MissingGpuIndexIsFailedPrecondition) {
  const int count = CudaDeviceCount();
  Result<std::unique_ptr<Kernels>> k = MakeKernels("cuda:" + std::to_string(count));
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kFailedPrecondition) << k.status().ToString();
}

#if defined(__x86_64__) || defined(__i386__)
TEST(EnableFlushToZeroTest, DenormalsBecomeZero) {
  const unsigned saved = _mm_getcsr();
  volatile float tiny = std::numeric_limits<float>::min();  // smallest normal
  volatile float half = 0.5f;
  EXPECT_NE(tiny * half, 0.0f) << "denormals should exist before the call";
  EnableFlushToZero();
  EXPECT_EQ(tiny * half, 0.0f);
  _mm_setcsr(saved);  // leave the thread as the other tests expect it
}
#endif

}  // namespace
}  // namespace ps
