// The CPU backend against naive double-precision references, on random shapes including
// 1, odd sizes and empty ones; and device-string parsing in MakeKernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <climits>
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

// ---- sparse embedding rows ----

struct SparseCase {
  int rows;
  int width;
  int table_rows;
};
const std::vector<SparseCase> kSparseCases = {{0, 5, 3},   {5, 0, 3},    {1, 1, 1},
                                              {7, 3, 10},  {64, 33, 17}, {100, 128, 50},
                                              {3, 257, 2}, {0, 0, 0},    {50, 4, 1}};

std::vector<int32_t> RandomIndices(int rows, int table_rows, std::mt19937& rng) {
  std::vector<int32_t> idx(rows);
  if (table_rows == 0) return idx;
  std::uniform_int_distribution<int32_t> pick(0, table_rows - 1);
  for (int32_t& i : idx) i = pick(rng);
  return idx;
}

TEST_F(CpuKernelsTest, GatherRows) {
  for (const SparseCase& c : kSparseCases) {
    SCOPED_TRACE(testing::Message()
                 << c.rows << " rows of " << c.width << " from " << c.table_rows);
    std::vector<float> table = RandomVector(static_cast<size_t>(c.table_rows) * c.width, rng_);
    std::vector<int32_t> idx = RandomIndices(c.rows, c.table_rows, rng_);
    std::vector<float> out(static_cast<size_t>(c.rows) * c.width, 99.0f);
    ASSERT_TRUE(
        k_->GatherRows(c.rows, c.width, table.data(), c.table_rows, idx.data(), out.data()).ok());
    for (int i = 0; i < c.rows; ++i) {
      for (int j = 0; j < c.width; ++j) {
        ASSERT_EQ(out[static_cast<size_t>(i) * c.width + j],
                  table[static_cast<size_t>(idx[i]) * c.width + j])
            << i << "," << j;
      }
    }
  }
}

TEST_F(CpuKernelsTest, ScatterAddRowsAccumulatesDuplicates) {
  for (const SparseCase& c : kSparseCases) {
    SCOPED_TRACE(testing::Message()
                 << c.rows << " rows of " << c.width << " into " << c.table_rows);
    std::vector<float> table = RandomVector(static_cast<size_t>(c.table_rows) * c.width, rng_);
    std::vector<float> src = RandomVector(static_cast<size_t>(c.rows) * c.width, rng_);
    std::vector<int32_t> idx = RandomIndices(c.rows, c.table_rows, rng_);
    if (c.rows >= 3) idx[2] = idx[0];  // a duplicate at least
    std::vector<double> ref(table.begin(), table.end());
    std::vector<int> hits(c.table_rows, 0);
    for (int i = 0; i < c.rows; ++i) {
      ++hits[idx[i]];
      for (int j = 0; j < c.width; ++j) {
        ref[static_cast<size_t>(idx[i]) * c.width + j] += src[static_cast<size_t>(i) * c.width + j];
      }
    }
    ASSERT_TRUE(
        k_->ScatterAddRows(c.rows, c.width, src.data(), idx.data(), c.table_rows, table.data())
            .ok());
    for (size_t e = 0; e < table.size(); ++e) {
      ASSERT_NEAR(table[e], ref[e], 1e-6 * (hits[e / c.width] + 1)) << "element " << e;
    }
  }
}

TEST_F(CpuKernelsTest, SparseRowsRejectBadIndicesBeforeWriting) {
  const int width = 3, table_rows = 4;
  std::vector<float> table = RandomVector(table_rows * width, rng_);
  const std::vector<float> table_before = table;
  std::vector<float> src = RandomVector(3 * width, rng_);
  std::vector<float> out(3 * width, 5.0f);
  for (int32_t bad : {-1, table_rows, 1000, INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> idx = {0, bad, 1};
    const std::string want = "index " + std::to_string(bad) + " of row 1";
    Status s = k_->GatherRows(3, width, table.data(), table_rows, idx.data(), out.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("GatherRows: " + want), std::string::npos) << s.message();
    s = k_->ScatterAddRows(3, width, src.data(), idx.data(), table_rows, table.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("ScatterAddRows: " + want), std::string::npos) << s.message();
  }
  for (float v : out) EXPECT_EQ(v, 5.0f) << "a rejected gather must not write";
  EXPECT_EQ(table, table_before) << "a rejected scatter must not write";
  // An empty table has no valid index.
  std::vector<int32_t> zero = {0};
  EXPECT_EQ(k_->GatherRows(1, width, table.data(), 0, zero.data(), out.data()).code(),
            StatusCode::kInvalidArgument);
  // Negative sizes.
  EXPECT_EQ(k_->GatherRows(-1, 1, nullptr, 1, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(k_->ScatterAddRows(1, -2, nullptr, nullptr, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(k_->ScatterAddRows(1, 1, nullptr, nullptr, -1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// ---- precision conversion ----

float Bits(uint32_t x) { return std::bit_cast<float>(x); }
uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
bool IsNanHalf(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
bool IsNanBf16(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

// The value of a half by its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
double NaiveHalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Rounds x to a half by searching the finite halves (monotonic in their bit patterns for
// one sign) for the nearest, taking the even pattern on ties. Beyond 65504 + 16 (half an
// ulp past the largest half) is infinity.
uint16_t NaiveToHalf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7e00;
  const double a = std::abs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7bff;  // largest pattern whose value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (NaiveHalfValue(mid) <= a) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  if (lo == 0x7bff) return sign | lo;
  const double below = a - NaiveHalfValue(lo), above = NaiveHalfValue(lo + 1) - a;
  if (below < above || (below == above && lo % 2 == 0)) return sign | lo;
  return sign | static_cast<uint16_t>(lo + 1);
}

// The nearest of the two bfloat16 values around x (its float bits truncated, and the next
// pattern up), ties to the even pattern, compared in double.
uint16_t NaiveToBfloat16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7fc0;
  if (std::isinf(x)) return sign | 0x7f80;
  const uint32_t abs = Bits(x) & 0x7fffffffu;
  const uint16_t lo = static_cast<uint16_t>(abs >> 16);
  const double a = Bits(abs);
  const double lo_v = Bits(static_cast<uint32_t>(lo) << 16);
  // The pattern after the largest finite one is infinity; its "value" for rounding is
  // 2^128, where the exponent would go.
  const double hi_v =
      lo == 0x7f7f ? std::ldexp(1.0, 128) : Bits(static_cast<uint32_t>(lo + 1) << 16);
  const double below = a - lo_v, above = hi_v - a;
  if (below < above || (below == above && lo % 2 == 0)) return sign | lo;
  return sign | static_cast<uint16_t>(lo + 1);
}

std::vector<float> SpecialFloats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.0f,
                          65520.0f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          Bits(0x7f800001u),  // signalling NaN
                          Bits(0xffbfffffu),  // negative NaN with payload
                          0.1f,
                          3.14159265f};
  for (int e = -27; e <= -13; ++e) {  // around the half subnormals and the first normals
    for (double f : {1.0, 1.5, 2.5, 0.75}) v.push_back(static_cast<float>(std::ldexp(f, e)));
  }
  return v;
}

TEST_F(CpuKernelsTest, ToHalfKnownValues) {
  const std::vector<std::pair<float, uint16_t>> cases = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {65504.0f, 0x7bff},   // the largest half
      {65519.99f, 0x7bff},  // just below the tie
      {65520.0f, 0x7c00},   // the tie rounds to even: infinity
      {1e10f, 0x7c00},      // overflow
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {std::ldexp(1.0f, -14), 0x0400},               // the smallest normal half
      {std::ldexp(1023.0f, -24), 0x03ff},            // the largest subnormal
      {std::ldexp(1.0f, -24), 0x0001},               // the smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},               // tie between 0 and 2^-24: to 0
      {std::ldexp(1.0f, -25) * 1.0000001f, 0x0001},  // just above that tie
      {std::ldexp(3.0f, -25), 0x0002},               // 1.5 ulp: tie to even (2)
      {std::ldexp(5.0f, -25), 0x0002},               // 2.5 ulp: tie to even (2)
      {-std::ldexp(7.0f, -25), 0x8004},              // 3.5 ulp: tie to even (4)
      {std::ldexp(2047.0f, -25), 0x0400},            // rounds up into the normals
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},        // tie: to even (1.0)
      {1.0f + std::ldexp(3.0f, -11), 0x3c02},        // tie: to even
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3c01},
      {0.1f, 0x2e66},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-std::numeric_limits<float>::denorm_min(), 0x8000},
  };
  for (const auto& [f, want] : cases) {
    uint16_t got = 0;
    ASSERT_TRUE(k_->ToHalf(1, &f, &got).ok());
    EXPECT_EQ(got, want) << std::hexfloat << f << " gave 0x" << std::hex << got;
    EXPECT_EQ(NaiveToHalf(f), want) << "the reference disagrees on " << std::hexfloat << f;
  }
}

TEST_F(CpuKernelsTest, ToBfloat16KnownValues) {
  const std::vector<std::pair<float, uint16_t>> cases = {
      {1.0f, 0x3f80},
      {-2.0f, 0xc000},
      {-0.0f, 0x8000},
      {3.14159265f, 0x4049},
      {1.0f + std::ldexp(1.0f, -8), 0x3f80},  // tie: to even
      {1.0f + std::ldexp(3.0f, -8), 0x3f82},  // tie: to even
      {1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), 0x3f81},
      {std::numeric_limits<float>::max(), 0x7f80},  // rounds past the largest bfloat16
      {Bits(0x7f7f7fffu), 0x7f7f},                  // just below that tie
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {std::ldexp(1.0f, -133), 0x0001},  // the smallest bfloat16 subnormal
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {Bits(0x00008000u), 0x0000},  // subnormal tie: to even (0)
      {Bits(0x00018000u), 0x0002},  // subnormal tie: to even (2)
      {65504.0f, 0x4780},           // bfloat16 has 8 bits of mantissa: 65536
  };
  for (const auto& [f, want] : cases) {
    uint16_t got = 0;
    ASSERT_TRUE(k_->ToBfloat16(1, &f, &got).ok());
    EXPECT_EQ(got, want) << std::hexfloat << f << " gave 0x" << std::hex << got;
    EXPECT_EQ(NaiveToBfloat16(f), want) << "the reference disagrees on " << std::hexfloat << f;
  }
}

TEST_F(CpuKernelsTest, NanStaysNanWithItsSign) {
  const std::vector<float> nans = {std::numeric_limits<float>::quiet_NaN(),
                                   -std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::signaling_NaN(),
                                   Bits(0x7f800001u),
                                   Bits(0xffffffffu),
                                   Bits(0x7fc01234u)};
  std::vector<uint16_t> h(nans.size()), b(nans.size());
  ASSERT_TRUE(k_->ToHalf(nans.size(), nans.data(), h.data()).ok());
  ASSERT_TRUE(k_->ToBfloat16(nans.size(), nans.data(), b.data()).ok());
  for (size_t i = 0; i < nans.size(); ++i) {
    const uint16_t sign = std::signbit(nans[i]) ? 0x8000 : 0;
    EXPECT_EQ(h[i], sign | 0x7e00) << i;
    EXPECT_EQ(b[i], sign | 0x7fc0) << i;
  }
  // Widening: every NaN pattern becomes the quiet float NaN with the same sign.
  const std::vector<uint16_t> half_nans = {0x7c01, 0x7e00, 0x7fff, 0xfc01, 0xfe00};
  const std::vector<uint16_t> bf16_nans = {0x7f81, 0x7fc0, 0x7fff, 0xff81, 0xffc0};
  std::vector<float> out(5);
  ASSERT_TRUE(k_->FromHalf(5, half_nans.data(), out.data()).ok());
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(Bits(out[i]), ((half_nans[i] & 0x8000u) << 16) | 0x7fc00000u) << i;
  }
  ASSERT_TRUE(k_->FromBfloat16(5, bf16_nans.data(), out.data()).ok());
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(Bits(out[i]), ((bf16_nans[i] & 0x8000u) << 16) | 0x7fc00000u) << i;
  }
}

TEST_F(CpuKernelsTest, FromHalfAndBfloat16AllPatterns) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> h(all.size()), b(all.size());
  ASSERT_TRUE(k_->FromHalf(all.size(), all.data(), h.data()).ok());
  ASSERT_TRUE(k_->FromBfloat16(all.size(), all.data(), b.data()).ok());
  for (size_t i = 0; i < all.size(); ++i) {
    const uint16_t p = all[i];
    if (IsNanHalf(p)) {
      EXPECT_TRUE(std::isnan(h[i])) << std::hex << p;
    } else {
      ASSERT_EQ(static_cast<double>(h[i]), NaiveHalfValue(p)) << std::hex << p;
      ASSERT_EQ(std::signbit(h[i]), (p & 0x8000) != 0) << std::hex << p;
    }
    if (IsNanBf16(p)) {
      EXPECT_TRUE(std::isnan(b[i])) << std::hex << p;
    } else {
      ASSERT_EQ(Bits(b[i]), static_cast<uint32_t>(p) << 16) << std::hex << p;  // exact
    }
  }
  // And back: every value that is not NaN converts to its own pattern.
  std::vector<uint16_t> h2(all.size()), b2(all.size());
  ASSERT_TRUE(k_->ToHalf(all.size(), h.data(), h2.data()).ok());
  ASSERT_TRUE(k_->ToBfloat16(all.size(), b.data(), b2.data()).ok());
  for (size_t i = 0; i < all.size(); ++i) {
    if (!IsNanHalf(all[i])) {
      ASSERT_EQ(h2[i], all[i]) << std::hex << all[i];
    }
    if (!IsNanBf16(all[i])) {
      ASSERT_EQ(b2[i], all[i]) << std::hex << all[i];
    }
  }
}

TEST_F(CpuKernelsTest, ToHalfAndBfloat16MatchNaiveRounding) {
  // Random bit patterns (every exponent equally likely), the specials, and for every
  // positive finite half the midpoint to the next one and the floats either side of it.
  std::vector<float> in = SpecialFloats();
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) in.push_back(Bits(bits(rng_)));
  for (uint16_t p = 0; p < 0x7bff; p += 7) {
    const float mid = static_cast<float>((NaiveHalfValue(p) + NaiveHalfValue(p + 1)) / 2);
    in.push_back(mid);
    in.push_back(std::nextafter(mid, 0.0f));
    in.push_back(-std::nextafter(mid, 1e9f));
  }
  for (uint32_t p = 0; p < 0x7f80; p += 13) {  // bfloat16 midpoints the same way
    const float mid = Bits((p << 16) | 0x8000u);
    in.push_back(mid);
    in.push_back(std::nextafter(mid, 0.0f));
    in.push_back(-std::nextafter(mid, 1e38f));
  }
  std::vector<uint16_t> h(in.size()), b(in.size());
  ASSERT_TRUE(k_->ToHalf(in.size(), in.data(), h.data()).ok());
  ASSERT_TRUE(k_->ToBfloat16(in.size(), in.data(), b.data()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(h[i], NaiveToHalf(in[i])) << std::hexfloat << in[i];
    ASSERT_EQ(b[i], NaiveToBfloat16(in[i])) << std::hexfloat << in[i];
  }
  // Empty input: nothing is touched.
  EXPECT_TRUE(k_->ToHalf(0, nullptr, nullptr).ok());
  EXPECT_TRUE(k_->FromBfloat16(0, nullptr, nullptr).ok());
}

#if defined(__x86_64__) || defined(__i386__)
TEST_F(CpuKernelsTest, ConversionsIgnoreFlushToZero) {
  // The worker sets flush-to-zero; subnormal halves and bfloat16s must survive it.
  const unsigned saved = _mm_getcsr();
  EnableFlushToZero();
  const std::vector<uint16_t> sub = {0x0001, 0x03ff, 0x8001};
  std::vector<float> f(3);
  ASSERT_TRUE(k_->FromHalf(3, sub.data(), f.data()).ok());
  std::vector<uint16_t> back(3);
  ASSERT_TRUE(k_->ToHalf(3, f.data(), back.data()).ok());
  EXPECT_EQ(back, sub);
  ASSERT_TRUE(k_->FromBfloat16(3, sub.data(), f.data()).ok());
  EXPECT_EQ(Bits(f[0]), 0x00010000u);
  ASSERT_TRUE(k_->ToBfloat16(3, f.data(), back.data()).ok());
  EXPECT_EQ(back, sub);
  _mm_setcsr(saved);
}
#endif

// ---- host staging buffers and options ----

TEST_F(CpuKernelsTest, HostPinnedBuffers) {
  Result<void*> none = k_->AllocHostPinned(0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value(), nullptr);
  k_->FreeHostPinned(nullptr);
  Result<PinnedHostBuffer<float>> staging = PinnedHostBuffer<float>::Make(k_.get(), 1001);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(staging->get()) % 64, 0u);
  for (size_t i = 0; i < staging->size(); ++i) (*staging)[i] = static_cast<float>(i);
  Result<DeviceBuffer<float>> dev = DeviceBuffer<float>::Make(k_.get(), 1001);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(k_->CopyToDevice(dev->get(), staging->get(), 1001 * sizeof(float)).ok());
  ASSERT_TRUE(k_->Synchronize().ok());
  Result<PinnedHostBuffer<float>> back = PinnedHostBuffer<float>::Make(k_.get(), 1001);
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(k_->CopyToHost(back->get(), dev->get(), 1001 * sizeof(float)).ok());
  for (size_t i = 0; i < 1001; ++i) ASSERT_EQ((*back)[i], static_cast<float>(i));
}

TEST(CpuKernelsOptionsTest, EveryGemmPrecisionComputesInFp32) {
  std::mt19937 rng(99);
  const int m = 37, n = 29, k = 53;
  std::vector<float> a = RandomVector(m * k, rng), b = RandomVector(k * n, rng);
  std::vector<float> want(m * n, 0.0f);
  Result<std::unique_ptr<Kernels>> fp32 = MakeKernels("cpu");
  ASSERT_TRUE(fp32.ok());
  ASSERT_TRUE(
      (*fp32)->Gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, want.data()).ok());
  for (GemmPrecision p : {GemmPrecision::kTf32, GemmPrecision::kBf16}) {
    KernelsOptions options;
    options.gemm_precision = p;
    Result<std::unique_ptr<Kernels>> cpu = MakeKernels("cpu", options);
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    std::vector<float> got(m * n, 0.0f);
    ASSERT_TRUE(
        (*cpu)->Gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, got.data()).ok());
    EXPECT_EQ(got, want) << "precision " << static_cast<int>(p);
  }
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

TEST(MakeKernelsTest, AutoWithoutGpuIsTheCpu) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible (cuda_kernels_test covers that)";
  KernelsOptions options;
  options.gemm_precision = GemmPrecision::kTf32;
  for (const KernelsOptions& o : {KernelsOptions(), options}) {
    Result<std::unique_ptr<Kernels>> k = MakeKernels("auto", o);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_FALSE((*k)->IsCuda());
    EXPECT_EQ((*k)->DeviceName().rfind("cpu: ", 0), 0u) << (*k)->DeviceName();
  }
}

TEST(MakeKernelsTest, PeakBandwidthWithoutGpuIsFailedPrecondition) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible";
  Result<double> bw = CudaPeakMemoryBandwidth(0);
  ASSERT_FALSE(bw.ok());
  EXPECT_EQ(bw.status().code(), StatusCode::kFailedPrecondition) << bw.status().ToString();
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
