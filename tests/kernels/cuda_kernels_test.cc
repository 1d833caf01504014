// The CUDA backend against the CPU backend (itself tested against double references in
// cpu_kernels_test.cc), op by op on random shapes. Every case skips where no GPU is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
