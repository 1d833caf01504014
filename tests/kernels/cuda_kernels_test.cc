// The CUDA backend against the CPU backend (itself tested against double references in
// cpu_kernels_test.cc), op by op on random shapes. Every case skips where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernels.h"

namespace ps {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    Result<std::unique_ptr<Kernels>> gpu = MakeKernels("cuda");
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    gpu_ = std::move(gpu).value();
    Result<std::unique_ptr<Kernels>> cpu = MakeKernels("cpu");
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
    cpu_ = std::move(cpu).value();
  }

  // A device copy of host data. Buffers of 0 elements hold nullptr.
  template <typename T>
  DeviceBuffer<T> Upload(const std::vector<T>& host) {
    Result<DeviceBuffer<T>> buf = DeviceBuffer<T>::Make(gpu_.get(), host.size());
    EXPECT_TRUE(buf.ok()) << buf.status().ToString();
    if (!buf.ok()) return DeviceBuffer<T>();
    Status s = gpu_->CopyToDevice(buf->get(), host.data(), host.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::move(buf).value();
  }
  template <typename T>
  std::vector<T> Download(const DeviceBuffer<T>& buf) {
    std::vector<T> host(buf.size());
    Status s = gpu_->CopyToHost(host.data(), buf.get(), host.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s.ToString();
    return host;
  }

  std::unique_ptr<Kernels> gpu_;
  std::unique_ptr<Kernels> cpu_;
  std::mt19937 rng_{777};
};

TEST_F(CudaKernelsTest, DeviceNameAndRoundTrip) {
  EXPECT_TRUE(gpu_->IsCuda());
  EXPECT_FALSE(gpu_->DeviceName().empty());
  std::vector<float> in = RandomVector(12345, rng_);
  DeviceBuffer<float> buf = Upload(in);
  EXPECT_EQ(Download(buf), in);
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaKernelsTest, AllocFailureIsAStatusNamingTheCall) {
  Result<void*> p = gpu_->AllocBytes(size_t{1} << 60);  // no GPU has an exabyte
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cudaMalloc("), std::string::npos) << p.status().ToString();
  // The failure is not sticky: the backend keeps working.
  std::vector<float> in = {1, 2, 3};
  DeviceBuffer<float> buf = Upload(in);
  EXPECT_EQ(Download(buf), in);
}

TEST_F(CudaKernelsTest, GemmMatchesCpuOnAllTransposes) {
  const std::vector<std::tuple<int, int, int>> shapes = {
      {1, 1, 1},   {3, 5, 7}, {17, 33, 9}, {64, 256, 784}, {1, 7, 1},
      {31, 1, 65}, {0, 5, 3}, {5, 0, 3},   {5, 3, 0},      {257, 129, 300}};
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
        DeviceBuffer<float> da = Upload(a), db = Upload(b), dc = Upload(c);
        ASSERT_TRUE(gpu_->Gemm(ta, tb, m, n, k, alpha, da.get(), db.get(), beta, dc.get()).ok());
        ASSERT_TRUE(cpu_->Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data()).ok());
        const std::vector<float> got = Download(dc);
        // Entries are sums of k products of numbers in [-1, 1].
        const double tol = 1e-5 * (k + 2) * (std::abs(alpha) + std::abs(beta));
        for (size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(got[i], c[i], tol) << "element " << i;
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmBetaZeroIgnoresNanInC) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = RandomVector(4 * 3, rng_), b = RandomVector(3 * 5, rng_);
  DeviceBuffer<float> da = Upload(a), db = Upload(b), dc = Upload(std::vector<float>(20, nan));
  ASSERT_TRUE(gpu_->Gemm(false, false, 4, 5, 3, 1.0f, da.get(), db.get(), 0.0f, dc.get()).ok());
  for (float v : Download(dc)) EXPECT_TRUE(std::isfinite(v));
  DeviceBuffer<float> dd = Upload(std::vector<float>(6, nan));
  ASSERT_TRUE(gpu_->Gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, dd.get()).ok());
  for (float v : Download(dd)) EXPECT_EQ(v, 0.0f);
  DeviceBuffer<float> de = Upload(std::vector<float>(6, 1.5f));
  ASSERT_TRUE(gpu_->Gemm(true, false, 2, 3, 0, 1.0f, nullptr, nullptr, 2.0f, de.get()).ok());
  for (float v : Download(de)) EXPECT_EQ(v, 3.0f);
}

const std::vector<std::pair<int, int>> kMatrixShapes = {{0, 5},   {5, 0},   {1, 1},     {13, 7},
                                                        {64, 10}, {3, 257}, {1000, 33}, {4096, 1}};

TEST_F(CudaKernelsTest, AddBiasAndBiasGrad) {
  for (const auto& [rows, cols] : kMatrixShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    std::vector<float> y = RandomVector(static_cast<size_t>(rows) * cols, rng_);
    std::vector<float> bias = RandomVector(cols, rng_);
    DeviceBuffer<float> dy = Upload(y), dbias = Upload(bias);
    ASSERT_TRUE(gpu_->AddBias(rows, cols, dbias.get(), dy.get()).ok());
    ASSERT_TRUE(cpu_->AddBias(rows, cols, bias.data(), y.data()).ok());
    EXPECT_EQ(Download(dy), y);

    std::vector<float> db(cols, 99.0f);
    DeviceBuffer<float> ddb = Upload(db);
    ASSERT_TRUE(gpu_->BiasGrad(rows, cols, dy.get(), ddb.get()).ok());
    ASSERT_TRUE(cpu_->BiasGrad(rows, cols, y.data(), db.data()).ok());
    const std::vector<float> got = Download(ddb);
    for (int j = 0; j < cols; ++j) EXPECT_NEAR(got[j], db[j], 1e-5 * (rows + 1)) << j;
  }
}

TEST_F(CudaKernelsTest, ReluReluBackwardScale) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}, size_t{1} << 22}) {
    SCOPED_TRACE(n);
    std::vector<float> y = RandomVector(n, rng_), dy = RandomVector(n, rng_);
    if (n > 2) y[1] = 0.0f;
    DeviceBuffer<float> d_y = Upload(y), d_dy = Upload(dy);
    ASSERT_TRUE(gpu_->Relu(n, d_y.get()).ok());
    ASSERT_TRUE(cpu_->Relu(n, y.data()).ok());
    EXPECT_EQ(Download(d_y), y);
    ASSERT_TRUE(gpu_->ReluBackward(n, d_y.get(), d_dy.get()).ok());
    ASSERT_TRUE(cpu_->ReluBackward(n, y.data(), dy.data()).ok());
    EXPECT_EQ(Download(d_dy), dy);
    ASSERT_TRUE(gpu_->Scale(n, -0.75f, d_dy.get()).ok());
    ASSERT_TRUE(cpu_->Scale(n, -0.75f, dy.data()).ok());
    EXPECT_EQ(Download(d_dy), dy);
  }
  DeviceBuffer<float> nan = Upload(std::vector<float>{std::numeric_limits<float>::quiet_NaN()});
  ASSERT_TRUE(gpu_->Relu(1, nan.get()).ok());
  EXPECT_TRUE(std::isnan(Download(nan)[0]));
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyMatchesCpu) {
  for (const auto& [rows, classes] : std::vector<std::pair<int, int>>{
           {1, 1}, {1, 2}, {7, 10}, {64, 10}, {5, 33}, {3, 1000}, {1001, 10}, {9, 31}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << classes);
    std::vector<float> logits = RandomVector(static_cast<size_t>(rows) * classes, rng_, -5, 5);
    std::vector<int32_t> labels(rows);
    std::uniform_int_distribution<int> pick(0, classes - 1);
    for (int32_t& l : labels) l = pick(rng_);
    const float scale = 1.0f / rows;
    DeviceBuffer<float> dl = Upload(logits);
    DeviceBuffer<int32_t> dlab = Upload(labels);
    DeviceBuffer<float> dgrad = Upload(std::vector<float>(logits.size(), 0.0f));
    std::vector<float> grad(logits.size());
    double gpu_loss = -1, cpu_loss = -2;
    int64_t gpu_correct = -1, cpu_correct = -2;
    ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(rows, classes, dl.get(), dlab.get(), scale, dgrad.get(),
                                          &gpu_loss, &gpu_correct)
                    .ok());
    ASSERT_TRUE(cpu_->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), scale,
                                          grad.data(), &cpu_loss, &cpu_correct)
                    .ok());
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * (std::abs(cpu_loss) + rows));
    EXPECT_EQ(gpu_correct, cpu_correct);
    const std::vector<float> got = Download(dgrad);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], grad[i], 1e-6) << i;
    // No gradient buffer: the same loss and count.
    double loss2 = -1;
    int64_t correct2 = -1;
    ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(rows, classes, dl.get(), dlab.get(), scale, nullptr,
                                          &loss2, &correct2)
                    .ok());
    EXPECT_NEAR(loss2, gpu_loss, 1e-9 * (std::abs(gpu_loss) + 1));
    EXPECT_EQ(correct2, gpu_correct);
  }
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyLargeLogitsAndTies) {
  std::vector<float> logits = RandomVector(8 * 10, rng_, -100, 100);
  for (float& v : logits) v += 1e4f;
  std::fill(logits.begin(), logits.begin() + 10, 3.0f);  // row 0: a ten-way tie
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  DeviceBuffer<float> dl = Upload(logits);
  DeviceBuffer<int32_t> dlab = Upload(labels);
  DeviceBuffer<float> dgrad = Upload(std::vector<float>(logits.size(), 0.0f));
  std::vector<float> grad(logits.size());
  double gpu_loss = 0, cpu_loss = 0;
  int64_t gpu_correct = 0, cpu_correct = 0;
  ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(8, 10, dl.get(), dlab.get(), 0.125f, dgrad.get(), &gpu_loss,
                                        &gpu_correct)
                  .ok());
  ASSERT_TRUE(cpu_->SoftmaxCrossEntropy(8, 10, logits.data(), labels.data(), 0.125f, grad.data(),
                                        &cpu_loss, &cpu_correct)
                  .ok());
  EXPECT_TRUE(std::isfinite(gpu_loss));
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * (std::abs(cpu_loss) + 1));
  EXPECT_EQ(gpu_correct, cpu_correct);
  const std::vector<float> got = Download(dgrad);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], grad[i], 1e-6) << i;
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyEmptyAndBadLabels) {
  double loss = 7;
  int64_t correct = 7;
  ASSERT_TRUE(
      gpu_->SoftmaxCrossEntropy(0, 10, nullptr, nullptr, 1.0f, nullptr, &loss, &correct).ok());
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(correct, 0);
  DeviceBuffer<float> dl = Upload(std::vector<float>(40 * 4, 0.0f));
  DeviceBuffer<int32_t> dlab = Upload(std::vector<int32_t>(40, 1));
  std::vector<int32_t> labels(40, 1);
  labels[17] = 4;
  labels[30] = -2;
  dlab = Upload(labels);
  Status s = gpu_->SoftmaxCrossEntropy(40, 4, dl.get(), dlab.get(), 1.0f, nullptr, &loss, &correct);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("label 4 of row 17"), std::string::npos) << s.message();
  // The backend is still usable after a rejected batch.
  labels[17] = 0;
  labels[30] = 0;
  dlab = Upload(labels);
  EXPECT_TRUE(
      gpu_->SoftmaxCrossEntropy(40, 4, dl.get(), dlab.get(), 1.0f, nullptr, &loss, &correct).ok());
  EXPECT_NEAR(loss, 40 * std::log(4.0), 1e-4);
}

// ---- sparse embedding rows ----

struct SparseCase {
  int rows;
  int width;
  int table_rows;
};
// Widths: 1, odd, multiples of 4 (the 16-byte path), wider than a block; empty shapes.
const std::vector<SparseCase> kSparseCases = {
    {0, 5, 3},   {5, 0, 3},    {1, 1, 1},       {7, 3, 10},       {64, 33, 17},  {100, 128, 50},
    {3, 257, 2}, {1000, 4, 7}, {4097, 64, 300}, {513, 300, 1000}, {20000, 1, 5}, {10, 1024, 3}};

std::vector<int32_t> RandomIndices(int rows, int table_rows, std::mt19937& rng) {
  std::vector<int32_t> idx(rows);
  if (table_rows == 0) return idx;
  std::uniform_int_distribution<int32_t> pick(0, table_rows - 1);
  for (int32_t& i : idx) i = pick(rng);
  return idx;
}

TEST_F(CudaKernelsTest, GatherRowsMatchesCpu) {
  for (const SparseCase& c : kSparseCases) {
    SCOPED_TRACE(testing::Message()
                 << c.rows << " rows of " << c.width << " from " << c.table_rows);
    std::vector<float> table = RandomVector(static_cast<size_t>(c.table_rows) * c.width, rng_);
    std::vector<int32_t> idx = RandomIndices(c.rows, c.table_rows, rng_);
    std::vector<float> out(static_cast<size_t>(c.rows) * c.width, 99.0f);
    DeviceBuffer<float> dt = Upload(table), dout = Upload(out);
    DeviceBuffer<int32_t> didx = Upload(idx);
    ASSERT_TRUE(
        gpu_->GatherRows(c.rows, c.width, dt.get(), c.table_rows, didx.get(), dout.get()).ok());
    ASSERT_TRUE(
        cpu_->GatherRows(c.rows, c.width, table.data(), c.table_rows, idx.data(), out.data()).ok());
    EXPECT_EQ(Download(dout), out);
    ASSERT_TRUE(gpu_->Synchronize().ok());
  }
}

TEST_F(CudaKernelsTest, GatherRowsFromMisalignedRows) {
  // A width of 4k floats but a table starting 4 bytes into its buffer: the 16-byte path
  // must not be taken.
  const int rows = 33, width = 8, table_rows = 9;
  std::vector<float> padded = RandomVector(1 + table_rows * width, rng_);
  std::vector<int32_t> idx = RandomIndices(rows, table_rows, rng_);
  DeviceBuffer<float> dt = Upload(padded), dout = Upload(std::vector<float>(rows * width + 1));
  DeviceBuffer<int32_t> didx = Upload(idx);
  ASSERT_TRUE(
      gpu_->GatherRows(rows, width, dt.get() + 1, table_rows, didx.get(), dout.get() + 1).ok());
  std::vector<float> out(rows * width);
  ASSERT_TRUE(
      cpu_->GatherRows(rows, width, padded.data() + 1, table_rows, idx.data(), out.data()).ok());
  const std::vector<float> got = Download(dout);
  EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()), out);
}

TEST_F(CudaKernelsTest, ScatterAddRowsMatchesCpu) {
  for (const SparseCase& c : kSparseCases) {
    SCOPED_TRACE(testing::Message()
                 << c.rows << " rows of " << c.width << " into " << c.table_rows);
    std::vector<float> table = RandomVector(static_cast<size_t>(c.table_rows) * c.width, rng_);
    std::vector<float> src = RandomVector(static_cast<size_t>(c.rows) * c.width, rng_);
    std::vector<int32_t> idx = RandomIndices(c.rows, c.table_rows, rng_);
    DeviceBuffer<float> dt = Upload(table), dsrc = Upload(src);
    DeviceBuffer<int32_t> didx = Upload(idx);
    ASSERT_TRUE(
        gpu_->ScatterAddRows(c.rows, c.width, dsrc.get(), didx.get(), c.table_rows, dt.get()).ok());
    ASSERT_TRUE(
        cpu_->ScatterAddRows(c.rows, c.width, src.data(), idx.data(), c.table_rows, table.data())
            .ok());
    std::vector<int> hits(c.table_rows, 0);
    for (int32_t i : idx) ++hits[i];
    const std::vector<float> got = Download(dt);
    // Atomic additions in any order: float rounding per addition, scaled by the count.
    for (size_t e = 0; e < got.size(); ++e) {
      ASSERT_NEAR(got[e], table[e], 2e-6 * (hits[e / c.width] + 1)) << "element " << e;
    }
  }
}

TEST_F(CudaKernelsTest, ScatterAddRowsAllIntoOneRow) {
  // The worst case for atomics: every row of src lands on table row 2.
  const int rows = 5000, width = 37, table_rows = 4;
  std::vector<float> table(table_rows * width, 1.0f);
  std::vector<float> src = RandomVector(static_cast<size_t>(rows) * width, rng_);
  std::vector<int32_t> idx(rows, 2);
  DeviceBuffer<float> dt = Upload(table), dsrc = Upload(src);
  DeviceBuffer<int32_t> didx = Upload(idx);
  ASSERT_TRUE(gpu_->ScatterAddRows(rows, width, dsrc.get(), didx.get(), table_rows, dt.get()).ok());
  const std::vector<float> got = Download(dt);
  for (int j = 0; j < width; ++j) {
    double sum = 1.0;
    for (int i = 0; i < rows; ++i) sum += src[static_cast<size_t>(i) * width + j];
    EXPECT_NEAR(got[2 * width + j], sum, 1e-6 * rows) << j;
    EXPECT_EQ(got[j], 1.0f) << "an untouched row changed";
  }
}

TEST_F(CudaKernelsTest, BadIndexIsReportedAtTheNextWait) {
  const int rows = 40, width = 5, table_rows = 6;
  std::vector<float> table = RandomVector(table_rows * width, rng_);
  std::vector<int32_t> idx = RandomIndices(rows, table_rows, rng_);
  idx[30] = -3;
  idx[12] = table_rows;  // the lowest bad row: the one named
  DeviceBuffer<float> dt = Upload(table), dout = Upload(std::vector<float>(rows * width, 7.0f));
  DeviceBuffer<int32_t> didx = Upload(idx);
  ASSERT_TRUE(gpu_->GatherRows(rows, width, dt.get(), table_rows, didx.get(), dout.get()).ok())
      << "the check runs on the device; the call itself only launches";
  Status s = gpu_->Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("GatherRows: index 6 of row 12"), std::string::npos) << s.message();
  // The good rows were gathered, the bad ones skipped.
  const std::vector<float> got = Download(dout);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < width; ++j) {
      const float want = (i == 12 || i == 30) ? 7.0f : table[idx[i] * width + j];
      ASSERT_EQ(got[i * width + j], want) << i << "," << j;
    }
  }
  // Reported once; the backend carries on.
  EXPECT_TRUE(gpu_->Synchronize().ok());
  // The scatter reports through CopyToHost as well, and leaves the table's other rows right.
  std::vector<float> src = RandomVector(rows * width, rng_);
  DeviceBuffer<float> dsrc = Upload(src);
  ASSERT_TRUE(gpu_->ScatterAddRows(rows, width, dsrc.get(), didx.get(), table_rows, dt.get()).ok());
  std::vector<float> host(table.size());
  s = gpu_->CopyToHost(host.data(), dt.get(), host.size() * sizeof(float));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("ScatterAddRows: index 6 of row 12"), std::string::npos)
      << s.message();
  idx[12] = 0;
  idx[30] = 0;
  ASSERT_TRUE(
      cpu_->ScatterAddRows(rows, width, src.data(), idx.data(), table_rows, table.data()).ok());
  // The CPU added rows 12 and 30 to table row 0; take them off again to compare.
  for (int j = 0; j < width; ++j) table[j] -= src[12 * width + j] + src[30 * width + j];
  const std::vector<float> got_table = Download(dt);
  for (size_t e = 0; e < table.size(); ++e) ASSERT_NEAR(got_table[e], table[e], 1e-4) << e;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// ---- precision conversion: bit for bit against the CPU ----

std::vector<float> ConversionInputs(std::mt19937& rng, size_t random_count) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,
                          65520.0f,
                          0.1f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(),
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min()};
  for (int e = -27; e <= -13; ++e) {
    for (double f : {1.0, 1.5, 2.5, 0.75}) v.push_back(static_cast<float>(std::ldexp(f, e)));
  }
  std::uniform_int_distribution<uint32_t> bits;
  while (v.size() < random_count) {
    const uint32_t x = bits(rng);
    float f;
    static_assert(sizeof(f) == sizeof(x));
    std::memcpy(&f, &x, sizeof(f));
    v.push_back(f);
  }
  return v;
}

std::vector<uint32_t> FloatBits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

TEST_F(CudaKernelsTest, ToHalfAndBfloat16MatchCpuBitForBit) {
  // An odd count over several grid strides.
  const std::vector<float> in = ConversionInputs(rng_, (size_t{1} << 22) + 3);
  DeviceBuffer<float> din = Upload(in);
  std::vector<uint16_t> h(in.size()), b(in.size());
  DeviceBuffer<uint16_t> dh = Upload(h), db = Upload(b);
  ASSERT_TRUE(gpu_->ToHalf(in.size(), din.get(), dh.get()).ok());
  ASSERT_TRUE(gpu_->ToBfloat16(in.size(), din.get(), db.get()).ok());
  ASSERT_TRUE(cpu_->ToHalf(in.size(), in.data(), h.data()).ok());
  ASSERT_TRUE(cpu_->ToBfloat16(in.size(), in.data(), b.data()).ok());
  const std::vector<uint16_t> got_h = Download(dh), got_b = Download(db);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(got_h[i], h[i]) << "ToHalf of " << std::hexfloat << in[i];
    ASSERT_EQ(got_b[i], b[i]) << "ToBfloat16 of " << std::hexfloat << in[i];
  }
  EXPECT_TRUE(gpu_->ToHalf(0, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu_->ToBfloat16(0, nullptr, nullptr).ok());
}

TEST_F(CudaKernelsTest, FromHalfAndBfloat16MatchCpuBitForBit) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  DeviceBuffer<uint16_t> din = Upload(all);
  DeviceBuffer<float> dh = Upload(std::vector<float>(all.size()));
  DeviceBuffer<float> db = Upload(std::vector<float>(all.size()));
  ASSERT_TRUE(gpu_->FromHalf(all.size(), din.get(), dh.get()).ok());
  ASSERT_TRUE(gpu_->FromBfloat16(all.size(), din.get(), db.get()).ok());
  std::vector<float> h(all.size()), b(all.size());
  ASSERT_TRUE(cpu_->FromHalf(all.size(), all.data(), h.data()).ok());
  ASSERT_TRUE(cpu_->FromBfloat16(all.size(), all.data(), b.data()).ok());
  const std::vector<uint32_t> got_h = FloatBits(Download(dh)), got_b = FloatBits(Download(db));
  const std::vector<uint32_t> want_h = FloatBits(h), want_b = FloatBits(b);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(got_h[i], want_h[i]) << "FromHalf of 0x" << std::hex << i;
    ASSERT_EQ(got_b[i], want_b[i]) << "FromBfloat16 of 0x" << std::hex << i;
  }
  EXPECT_TRUE(gpu_->FromHalf(0, nullptr, nullptr).ok());
  EXPECT_TRUE(gpu_->FromBfloat16(0, nullptr, nullptr).ok());
}

// ---- GEMM precision ----

// ||got - want|| / ||want|| over all elements.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

void CheckGemmPrecision(Kernels* cpu, GemmPrecision precision, double max_error) {
  KernelsOptions options;
  options.gemm_precision = precision;
  Result<std::unique_ptr<Kernels>> made = MakeKernels("cuda", options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Kernels* gpu = made->get();
  std::mt19937 rng(4242);
  const std::vector<std::tuple<int, int, int>> shapes = {{1, 1, 1}, {3, 5, 7},   {64, 256, 784},
                                                         {1, 7, 1}, {31, 1, 65}, {257, 129, 300},
                                                         {0, 5, 3}, {5, 3, 0}};
  for (const auto& [m, n, k] : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const auto& [alpha, beta] : std::vector<std::pair<float, float>>{{1, 0}, {-1.5f, 1}}) {
        SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta
                                        << " tb=" << tb << " beta=" << beta);
        std::vector<float> a = RandomVector(static_cast<size_t>(m) * k, rng);
        std::vector<float> b = RandomVector(static_cast<size_t>(k) * n, rng);
        std::vector<float> c = RandomVector(static_cast<size_t>(m) * n, rng);
        auto upload = [&](const std::vector<float>& host) {
          DeviceBuffer<float> buf = std::move(DeviceBuffer<float>::Make(gpu, host.size())).value();
          EXPECT_TRUE(gpu->CopyToDevice(buf.get(), host.data(), host.size() * sizeof(float)).ok());
          return buf;
        };
        DeviceBuffer<float> da = upload(a), db = upload(b), dc = upload(c);
        ASSERT_TRUE(gpu->Gemm(ta, tb, m, n, k, alpha, da.get(), db.get(), beta, dc.get()).ok());
        ASSERT_TRUE(cpu->Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data()).ok());
        std::vector<float> got(c.size());
        ASSERT_TRUE(gpu->CopyToHost(got.data(), dc.get(), got.size() * sizeof(float)).ok());
        EXPECT_LT(RelativeError(got, c), max_error);
      }
    }
  }
}

// Bounds: each product carries the rounding of both inputs, at most 2 * 2^-10 for TF32
// (even if truncated) and 2 * 2^-8 for bfloat16; random signs make the norm-wise error
// smaller still.
TEST_F(CudaKernelsTest, GemmTf32IsCloseToFp32) {
  CheckGemmPrecision(cpu_.get(), GemmPrecision::kTf32, 2.5e-3);
}

TEST_F(CudaKernelsTest, GemmBf16IsCloseToFp32) {
  CheckGemmPrecision(cpu_.get(), GemmPrecision::kBf16, 1e-2);
}

// ---- pinned staging buffers ----

TEST_F(CudaKernelsTest, PinnedStagingRoundTrip) {
  const size_t n = (size_t{1} << 20) + 5;
  const std::vector<float> data = RandomVector(n, rng_);
  Result<PinnedHostBuffer<float>> up = PinnedHostBuffer<float>::Make(gpu_.get(), n);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  std::copy(data.begin(), data.end(), up->get());
  DeviceBuffer<float> dev = std::move(DeviceBuffer<float>::Make(gpu_.get(), n)).value();
  // Asynchronous from pinned memory; freeing the staging buffer waits for the copy.
  ASSERT_TRUE(gpu_->CopyToDevice(dev.get(), up->get(), n * sizeof(float)).ok());
  up->Reset();
  Result<PinnedHostBuffer<float>> down = PinnedHostBuffer<float>::Make(gpu_.get(), n);
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(gpu_->CopyToHost(down->get(), dev.get(), n * sizeof(float)).ok());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), down->get()));
  Result<void*> none = gpu_->AllocHostPinned(0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value(), nullptr);
  gpu_->FreeHostPinned(nullptr);
}

TEST_F(CudaKernelsTest, PinnedCopiesOverlapAndStayInOrder) {
  // Several async uploads from one staging buffer's disjoint parts, then ops on them: the
  // stream keeps the order, Synchronize makes the staging buffer reusable.
  const int parts = 8;
  const size_t n = 4099;
  Result<PinnedHostBuffer<float>> staging = PinnedHostBuffer<float>::Make(gpu_.get(), parts * n);
  ASSERT_TRUE(staging.ok());
  std::vector<float> all = RandomVector(parts * n, rng_);
  std::copy(all.begin(), all.end(), staging->get());
  DeviceBuffer<float> dev = std::move(DeviceBuffer<float>::Make(gpu_.get(), parts * n)).value();
  for (int p = 0; p < parts; ++p) {
    ASSERT_TRUE(
        gpu_->CopyToDevice(dev.get() + p * n, staging->get() + p * n, n * sizeof(float)).ok());
    ASSERT_TRUE(gpu_->Scale(n, 2.0f, dev.get() + p * n).ok());
  }
  ASSERT_TRUE(gpu_->Synchronize().ok());
  std::fill(staging->get(), staging->get() + parts * n, 0.0f);
  const std::vector<float> got = Download(dev);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(got[i], 2.0f * all[i]) << i;
}

// ---- layer ops: convolution, pooling, channel bias, sigmoid CE, dropout ----
// Tolerances: where both backends add the same values in the same order (Im2Col, Col2Im,
// AddChannelBias, max pooling, dropout) the results must be equal; where the sums run in
// different orders (cuBLAS against OpenBLAS in the convolutions, the reductions) each
// element may differ by about 1e-6 per term summed, terms being products of values in
// [-1, 1].

Conv2dShape Conv(int n, int c, int h, int w, int f, int k, int stride, int pad) {
  Conv2dShape s;
  s.batch = n;
  s.in_channels = c;
  s.height = h;
  s.width = w;
  s.out_channels = f;
  s.kernel = k;
  s.stride = stride;
  s.padding = pad;
  return s;
}

// Small odd shapes (padding 0 and 1, strides 1 and 2, non-square, 1 and 3 channels,
// pointwise, an empty batch) and two of a CNN's real sizes.
const std::vector<Conv2dShape> kConvShapes = {
    Conv(2, 1, 5, 7, 3, 3, 1, 0),     Conv(2, 3, 6, 5, 4, 3, 1, 1),
    Conv(1, 3, 7, 9, 2, 3, 2, 1),     Conv(3, 1, 8, 6, 2, 2, 2, 0),
    Conv(2, 3, 5, 4, 4, 1, 1, 0),     Conv(1, 2, 3, 4, 3, 5, 1, 2),
    Conv(0, 3, 5, 5, 2, 3, 1, 1),     Conv(8, 3, 32, 32, 16, 3, 1, 1),
    Conv(4, 16, 14, 14, 32, 5, 1, 2), Conv(2, 1, 28, 28, 8, 5, 2, 0)};

TEST_F(CudaKernelsTest, Conv2dMatchesCpu) {
  for (const Conv2dShape& s : kConvShapes) {
    SCOPED_TRACE(testing::Message()
                 << "N=" << s.batch << " C=" << s.in_channels << " H=" << s.height
                 << " W=" << s.width << " F=" << s.out_channels << " K=" << s.kernel
                 << " stride=" << s.stride << " pad=" << s.padding);
    const size_t pixels = static_cast<size_t>(s.OutHeight()) * s.OutWidth();
    const size_t x_size = static_cast<size_t>(s.batch) * s.in_channels * s.height * s.width;
    const size_t y_size = static_cast<size_t>(s.batch) * s.out_channels * pixels;
    const size_t w_size = static_cast<size_t>(s.out_channels) * s.ColRows();
    const std::vector<float> x = RandomVector(x_size, rng_), w = RandomVector(w_size, rng_);
    const std::vector<float> bias = RandomVector(s.out_channels, rng_);
    const std::vector<float> dy = RandomVector(y_size, rng_);
    std::vector<float> y(y_size), dx(x_size), dw(w_size), db(s.out_channels);
    std::vector<float> ws(s.WorkspaceFloats());
    ASSERT_TRUE(cpu_->Conv2dForward(s, x.data(), w.data(), bias.data(), y.data(), ws.data()).ok());
    ASSERT_TRUE(cpu_->Conv2dBackwardData(s, dy.data(), w.data(), dx.data(), ws.data()).ok());
    ASSERT_TRUE(
        cpu_->Conv2dBackwardFilter(s, x.data(), dy.data(), dw.data(), db.data(), ws.data()).ok());

    DeviceBuffer<float> d_x = Upload(x), d_w = Upload(w), d_bias = Upload(bias), d_dy = Upload(dy);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    DeviceBuffer<float> d_y = Upload(std::vector<float>(y_size, nan));
    DeviceBuffer<float> d_dx = Upload(std::vector<float>(x_size, nan));
    DeviceBuffer<float> d_dw = Upload(std::vector<float>(w_size, nan));
    DeviceBuffer<float> d_db = Upload(std::vector<float>(s.out_channels, nan));
    DeviceBuffer<float> d_ws = Upload(std::vector<float>(s.WorkspaceFloats()));
    ASSERT_TRUE(
        gpu_->Conv2dForward(s, d_x.get(), d_w.get(), d_bias.get(), d_y.get(), d_ws.get()).ok());
    ASSERT_TRUE(gpu_->Conv2dBackwardData(s, d_dy.get(), d_w.get(), d_dx.get(), d_ws.get()).ok());
    ASSERT_TRUE(
        gpu_->Conv2dBackwardFilter(s, d_x.get(), d_dy.get(), d_dw.get(), d_db.get(), d_ws.get())
            .ok());
    const double tol_y = 1e-6 * (s.ColRows() + 2);
    const double tol_x = 1e-6 * (s.out_channels * s.kernel * s.kernel + 1);
    const double tol_w = 1e-6 * (s.batch * pixels + 1);
    const std::vector<float> got_y = Download(d_y), got_dx = Download(d_dx);
    const std::vector<float> got_dw = Download(d_dw), got_db = Download(d_db);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(got_y[i], y[i], tol_y) << "y " << i;
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(got_dx[i], dx[i], tol_x) << "dx " << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(got_dw[i], dw[i], tol_w) << "dw " << i;
    for (size_t i = 0; i < db.size(); ++i) ASSERT_NEAR(got_db[i], db[i], tol_w) << "db " << i;
  }
  Status s = gpu_->Conv2dForward(Conv(1, 1, 2, 2, 1, 3, 1, 0), nullptr, nullptr, nullptr, nullptr,
                                 nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST_F(CudaKernelsTest, Im2ColAndCol2ImEqualCpu) {
  for (Conv2dShape s : kConvShapes) {
    s.batch = 1;
    SCOPED_TRACE(testing::Message()
                 << "C=" << s.in_channels << " H=" << s.height << " W=" << s.width
                 << " K=" << s.kernel << " stride=" << s.stride << " pad=" << s.padding);
    const size_t col_size = static_cast<size_t>(s.ColRows()) * s.OutHeight() * s.OutWidth();
    const std::vector<float> x =
        RandomVector(static_cast<size_t>(s.in_channels) * s.height * s.width, rng_);
    const std::vector<float> c = RandomVector(col_size, rng_);
    std::vector<float> col(col_size), image(x.size());
    ASSERT_TRUE(cpu_->Im2Col(s, x.data(), col.data()).ok());
    ASSERT_TRUE(cpu_->Col2Im(s, c.data(), image.data()).ok());
    DeviceBuffer<float> d_x = Upload(x), d_c = Upload(c);
    DeviceBuffer<float> d_col = Upload(std::vector<float>(col_size, 5.0f));
    DeviceBuffer<float> d_image = Upload(std::vector<float>(x.size(), 5.0f));
    ASSERT_TRUE(gpu_->Im2Col(s, d_x.get(), d_col.get()).ok());
    ASSERT_TRUE(gpu_->Col2Im(s, d_c.get(), d_image.get()).ok());
    EXPECT_EQ(Download(d_col), col);
    EXPECT_EQ(Download(d_image), image);  // the same additions in the same order
  }
}

TEST_F(CudaKernelsTest, ChannelBiasMatchesCpu) {
  for (const auto& [n, c, sp] : std::vector<std::tuple<int, int, int>>{{2, 3, 5},
                                                                       {1, 1, 1},
                                                                       {64, 32, 196},
                                                                       {0, 3, 4},
                                                                       {3, 2, 0},
                                                                       {2, 1000, 3},
                                                                       {1, 2, 100000}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << c << "x" << sp);
    const size_t size = static_cast<size_t>(n) * c * sp;
    std::vector<float> y = RandomVector(size, rng_);
    const std::vector<float> bias = RandomVector(c, rng_);
    DeviceBuffer<float> d_y = Upload(y), d_bias = Upload(bias);
    DeviceBuffer<float> d_db = Upload(std::vector<float>(c, 99.0f));
    std::vector<float> db(c);
    ASSERT_TRUE(gpu_->ChannelBiasGrad(n, c, sp, d_y.get(), d_db.get()).ok());
    ASSERT_TRUE(cpu_->ChannelBiasGrad(n, c, sp, y.data(), db.data()).ok());
    const std::vector<float> got = Download(d_db);
    // Both sum in double; only the final rounding to float may differ.
    for (int j = 0; j < c; ++j) ASSERT_NEAR(got[j], db[j], 1e-6 * (std::abs(db[j]) + 1)) << j;
    ASSERT_TRUE(gpu_->AddChannelBias(n, c, sp, d_bias.get(), d_y.get()).ok());
    ASSERT_TRUE(cpu_->AddChannelBias(n, c, sp, bias.data(), y.data()).ok());
    EXPECT_EQ(Download(d_y), y);
  }
}

TEST_F(CudaKernelsTest, MaxPoolEqualsCpu) {
  struct PoolCase {
    int n, c, h, w, window, stride, pad;
  };
  const std::vector<PoolCase> cases = {{2, 3, 6, 8, 2, 2, 0},    {1, 2, 7, 5, 2, 2, 0},
                                       {2, 1, 5, 6, 3, 2, 1},    {1, 2, 4, 7, 3, 1, 1},
                                       {0, 2, 4, 4, 2, 2, 0},    {64, 32, 28, 28, 2, 2, 0},
                                       {8, 16, 15, 13, 3, 2, 1}, {1, 1, 1, 9, 1, 1, 0}};
  std::uniform_int_distribution<int> small(0, 2);
  for (const PoolCase& pc : cases) {
    for (bool ties : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << pc.n << "x" << pc.c << "x" << pc.h << "x" << pc.w << " window=" << pc.window
                   << " stride=" << pc.stride << " pad=" << pc.pad << " ties=" << ties);
      Pool2dShape s;
      s.batch = pc.n;
      s.channels = pc.c;
      s.height = pc.h;
      s.width = pc.w;
      s.window = pc.window;
      s.stride = pc.stride;
      s.padding = pc.pad;
      const size_t in_size = static_cast<size_t>(pc.n) * pc.c * pc.h * pc.w;
      const size_t out_size = static_cast<size_t>(pc.n) * pc.c * s.OutHeight() * s.OutWidth();
      std::vector<float> x = RandomVector(in_size, rng_);
      if (ties) {
        for (float& v : x) v = static_cast<float>(small(rng_));
      }
      if (in_size > 5) x[5] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> dy = RandomVector(out_size, rng_);
      std::vector<float> y(out_size), dx(in_size);
      std::vector<int32_t> arg(out_size);
      ASSERT_TRUE(cpu_->MaxPool2dForward(s, x.data(), y.data(), arg.data()).ok());
      ASSERT_TRUE(cpu_->MaxPool2dBackward(s, dy.data(), arg.data(), dx.data()).ok());
      DeviceBuffer<float> d_x = Upload(x), d_dy = Upload(dy);
      DeviceBuffer<float> d_y = Upload(std::vector<float>(out_size, -9.0f));
      DeviceBuffer<float> d_dx = Upload(std::vector<float>(in_size, -9.0f));
      DeviceBuffer<int32_t> d_arg = Upload(std::vector<int32_t>(out_size, -9));
      ASSERT_TRUE(gpu_->MaxPool2dForward(s, d_x.get(), d_y.get(), d_arg.get()).ok());
      ASSERT_TRUE(gpu_->MaxPool2dBackward(s, d_dy.get(), d_arg.get(), d_dx.get()).ok());
      const std::vector<float> got_y = Download(d_y);
      ASSERT_EQ(got_y.size(), y.size());
      for (size_t i = 0; i < y.size(); ++i) {
        if (std::isnan(y[i])) {
          ASSERT_TRUE(std::isnan(got_y[i])) << i;
        } else {
          ASSERT_EQ(got_y[i], y[i]) << i;
        }
      }
      EXPECT_EQ(Download(d_arg), arg);
      EXPECT_EQ(Download(d_dx), dx);  // the same additions in the same order
    }
  }
}

TEST_F(CudaKernelsTest, SigmoidCrossEntropyMatchesCpu) {
  for (int n : {1, 7, 1000, 100003}) {
    SCOPED_TRACE(n);
    std::vector<float> x = RandomVector(n, rng_, -20.0f, 20.0f);
    x[0] = 0.0f;
    if (n > 2) x[1] = 1e30f;
    std::vector<int32_t> labels(n);
    std::bernoulli_distribution coin(0.3);
    for (int32_t& l : labels) l = coin(rng_) ? 1 : 0;
    std::vector<float> grad(n);
    double cpu_loss = 0, gpu_loss = 0;
    int64_t cpu_correct = 0, gpu_correct = 0;
    ASSERT_TRUE(cpu_->SigmoidCrossEntropy(n, x.data(), labels.data(), 0.25f, grad.data(), &cpu_loss,
                                          &cpu_correct)
                    .ok());
    DeviceBuffer<float> d_x = Upload(x), d_grad = Upload(std::vector<float>(n, 9.0f));
    DeviceBuffer<int32_t> d_labels = Upload(labels);
    ASSERT_TRUE(gpu_->SigmoidCrossEntropy(n, d_x.get(), d_labels.get(), 0.25f, d_grad.get(),
                                          &gpu_loss, &gpu_correct)
                    .ok());
    // float per element on the GPU, double on the CPU: ~1e-6 relative each.
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-6 * (std::abs(cpu_loss) + n));
    EXPECT_EQ(gpu_correct, cpu_correct);
    const std::vector<float> got = Download(d_grad);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], grad[i], 2e-7) << i;
  }
}

TEST_F(CudaKernelsTest, SigmoidCrossEntropyEmptyAndBadLabels) {
  double loss = 7;
  int64_t correct = 7;
  ASSERT_TRUE(gpu_->SigmoidCrossEntropy(0, nullptr, nullptr, 1.0f, nullptr, &loss, &correct).ok());
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(correct, 0);
  std::vector<int32_t> labels(5000, 1);
  labels[4000] = -1;
  labels[1234] = 2;
  DeviceBuffer<float> d_x = Upload(std::vector<float>(5000, 0.0f));
  DeviceBuffer<int32_t> d_labels = Upload(labels);
  Status s =
      gpu_->SigmoidCrossEntropy(5000, d_x.get(), d_labels.get(), 1.0f, nullptr, &loss, &correct);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("label 2 of element 1234"), std::string::npos) << s.message();
  labels[4000] = labels[1234] = 0;
  d_labels = Upload(labels);
  ASSERT_TRUE(
      gpu_->SigmoidCrossEntropy(5000, d_x.get(), d_labels.get(), 1.0f, nullptr, &loss, &correct)
          .ok());
  EXPECT_NEAR(loss, 5000 * std::log(2.0), 1e-3);
}

TEST_F(CudaKernelsTest, Copy2dEqualsCpu) {
  for (const auto& [rows, cols, src_stride, dst_stride] :
       std::vector<std::tuple<int, int, int, int>>{
           {3, 2, 2, 5}, {1, 1, 1, 1}, {1000, 13, 40, 13}, {0, 4, 4, 4}, {7, 0, 0, 3}}) {
    SCOPED_TRACE(testing::Message()
                 << rows << "x" << cols << " strides " << src_stride << ", " << dst_stride);
    const std::vector<float> src = RandomVector(static_cast<size_t>(rows) * src_stride, rng_);
    std::vector<float> dst(static_cast<size_t>(rows) * dst_stride, -1.0f);
    DeviceBuffer<float> d_src = Upload(src), d_dst = Upload(dst);
    ASSERT_TRUE(cpu_->Copy2d(rows, cols, src.data(), src_stride, dst.data(), dst_stride).ok());
    ASSERT_TRUE(gpu_->Copy2d(rows, cols, d_src.get(), src_stride, d_dst.get(), dst_stride).ok());
    EXPECT_EQ(Download(d_dst), dst);  // the columns past cols keep their -1
  }
  EXPECT_EQ(gpu_->Copy2d(2, 3, nullptr, 2, nullptr, 3).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, DropoutEqualsCpu) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    for (float p : {0.2f, 0.5f, 1.0f}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " p=" << p);
      const uint64_t seed = 0x1234567890abcdefull + n;
      std::vector<uint8_t> mask(n);
      ASSERT_TRUE(cpu_->DropoutMask(n, p, seed, mask.data()).ok());
      DeviceBuffer<uint8_t> d_mask = Upload(std::vector<uint8_t>(n, 7));
      ASSERT_TRUE(gpu_->DropoutMask(n, p, seed, d_mask.get()).ok());
      EXPECT_EQ(Download(d_mask), mask);  // the same mask from the same seed

      const std::vector<float> x = RandomVector(n, rng_);
      std::vector<float> y(n), dx(n);
      ASSERT_TRUE(cpu_->DropoutForward(n, p, mask.data(), x.data(), y.data()).ok());
      ASSERT_TRUE(cpu_->DropoutBackward(n, p, mask.data(), y.data(), dx.data()).ok());
      DeviceBuffer<float> d_x = Upload(x), d_y = Upload(std::vector<float>(n));
      ASSERT_TRUE(gpu_->DropoutForward(n, p, d_mask.get(), d_x.get(), d_y.get()).ok());
      EXPECT_EQ(Download(d_y), y);
      // Backward in place.
      ASSERT_TRUE(gpu_->DropoutBackward(n, p, d_mask.get(), d_y.get(), d_y.get()).ok());
      EXPECT_EQ(Download(d_y), dx);
    }
  }
  EXPECT_EQ(gpu_->DropoutMask(4, 0.0f, 1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->DropoutForward(4, 2.0f, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// The servers' update on device rows against the CPU backend's (which is the servers' own
// optimizer, update_kernels_test.cc): every rule, clip and weight decay on, rows of one
// warp, of several and of more than a block, five steps. Within 1e-5 relative: the device
// fuses multiply-adds. Adam's step count is exact.
TEST_F(CudaKernelsTest, ApplyUpdateMatchesCpu) {
  for (UpdateRule::Kind kind :
       {UpdateRule::Kind::kSgd, UpdateRule::Kind::kMomentum, UpdateRule::Kind::kNesterov,
        UpdateRule::Kind::kAdagrad, UpdateRule::Kind::kAdam, UpdateRule::Kind::kAdamW}) {
    for (int width : {1, 37, 300, 1000}) {
      SCOPED_TRACE(testing::Message() << "rule " << static_cast<int>(kind) << " width " << width);
      UpdateRule rule;
      rule.kind = kind;
      rule.weight_decay = 0.01f;
      rule.clip_grad_norm = 0.5 * std::sqrt(static_cast<double>(width));  // about half the rows
      rule.epsilon = 1e-6f;
      const int rows = 7;
      const int stride = width + static_cast<int>(rule.StateFloats(width)) + 1;
      std::vector<float> table = RandomVector(static_cast<size_t>(rows) * stride, rng_);
      for (int r = 0; r < rows; ++r) {  // zero state, as a new row's
        std::fill(table.begin() + r * stride + width, table.begin() + (r + 1) * stride - 1, 0.0f);
      }
      DeviceBuffer<float> d_table = Upload(table);
      for (int step = 0; step < 5; ++step) {
        const std::vector<float> grad = RandomVector(static_cast<size_t>(rows) * width, rng_);
        const float lr = 0.05f * (step + 1);
        ASSERT_TRUE(
            cpu_->ApplyUpdate(rule, lr, rows, width, stride, table.data(), grad.data()).ok());
        DeviceBuffer<float> d_grad = Upload(grad);
        ASSERT_TRUE(
            gpu_->ApplyUpdate(rule, lr, rows, width, stride, d_table.get(), d_grad.get()).ok());
      }
      const std::vector<float> got = Download(d_table);
      for (size_t i = 0; i < table.size(); ++i) {
        ASSERT_NEAR(got[i], table[i], 1e-5f * (1.0f + std::fabs(table[i]))) << "float " << i;
      }
    }
  }
  UpdateRule adam;
  adam.kind = UpdateRule::Kind::kAdam;
  EXPECT_EQ(gpu_->ApplyUpdate(adam, 0.1f, 2, 4, 12, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, FlagOutOfRangeEqualsCpu) {
  const size_t n = (size_t{1} << 20) + 3;
  for (float bad : {0.0f, std::nanf(""), -std::numeric_limits<float>::infinity(), 3e18f}) {
    std::vector<float> x = RandomVector(n, rng_);
    if (bad != 0.0f) x[n - 2] = bad;
    int32_t expected = 0;
    ASSERT_TRUE(cpu_->FlagOutOfRange(n, x.data(), 1e18f, &expected).ok());
    DeviceBuffer<float> d_x = Upload(x);
    DeviceBuffer<int32_t> d_flag = Upload(std::vector<int32_t>{0});
    ASSERT_TRUE(gpu_->FlagOutOfRange(n, d_x.get(), 1e18f, d_flag.get()).ok());
    EXPECT_EQ(Download(d_flag)[0], expected) << bad;
    EXPECT_EQ(expected, bad == 0.0f ? 0 : 1) << bad;
  }
}

// ---- device selection ----

TEST(CudaMakeKernelsTest, AutoPicksTheGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Result<std::unique_ptr<Kernels>> k = MakeKernels("auto");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_TRUE((*k)->IsCuda());
  EXPECT_NE((*k)->DeviceName().find("(cuda:0"), std::string::npos) << (*k)->DeviceName();
}

TEST(CudaMakeKernelsTest, PeakMemoryBandwidth) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Result<double> bw = CudaPeakMemoryBandwidth(0);
  if (!bw.ok()) {
    EXPECT_EQ(bw.status().code(), StatusCode::kUnavailable) << bw.status().ToString();
    GTEST_SKIP() << bw.status().ToString();
  }
  EXPECT_GT(*bw, 1e10) << "below 10 GB/s: the units are off";
  EXPECT_LT(*bw, 1e14);
  EXPECT_FALSE(CudaPeakMemoryBandwidth(CudaDeviceCount()).ok());
}

TEST(CudaMakeKernelsTest, OutOfRangeIndexIsFailedPrecondition) {
  const int count = CudaDeviceCount();
  if (count == 0) GTEST_SKIP() << "no CUDA device visible";
  Result<std::unique_ptr<Kernels>> k = MakeKernels("cuda:" + std::to_string(count));
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(k.status().message().find(std::to_string(count)), std::string::npos);
}

}  // namespace
}  // namespace ps
