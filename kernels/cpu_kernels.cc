#include "kernels/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

namespace ps {
namespace {

// Cache-line alignment: vector loads never split a line, and two buffers never share one.
constexpr std::align_val_t kAlignment{64};

Status CheckNonNegative(const char* op, const char* what, int64_t v) {
  if (v < 0) {
    return InvalidArgument(std::string(op) + ": " + what + " = " + std::to_string(v) +
                           " is negative");
  }
  return Status::Ok();
}

class CpuKernels final : public Kernels {
 public:
  std::string DeviceName() const override {
    return "cpu: " + std::to_string(openblas_get_num_threads()) + " threads";
  }
  bool IsCuda() const override { return false; }

  Result<void*> AllocBytes(size_t bytes) override {
    void* p = ::operator new(bytes, kAlignment, std::nothrow);
    if (p == nullptr) {
      return Unavailable("aligned new(" + std::to_string(bytes) + " bytes) failed: out of memory");
    }
    return p;
  }
  void FreeBytes(void* p) override { ::operator delete(p, kAlignment); }

  Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0 && dst != host_src) std::memcpy(dst, host_src, bytes);
    return Status::Ok();
  }
  Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0 && host_dst != src) std::memcpy(host_dst, src, bytes);
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }

  Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              const float* b, float beta, float* c) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "m", m));
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "n", n));
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "k", k));
    if (m == 0 || n == 0) return Status::Ok();
    if (k == 0) {
      // BLAS rejects a leading dimension of 0, and the product is empty anyway.
      ScaleC(static_cast<size_t>(m) * n, beta, c);
      return Status::Ok();
    }
    const int lda = trans_a ? m : k;
    const int ldb = trans_b ? k : n;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
    return Status::Ok();
  }

  Status AddBias(int rows, int cols, const float* bias, float* y) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("AddBias", "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative("AddBias", "cols", cols));
    for (int i = 0; i < rows; ++i) {
      float* row = y + static_cast<size_t>(i) * cols;
      for (int j = 0; j < cols; ++j) row[j] += bias[j];
    }
    return Status::Ok();
  }

  Status Relu(size_t n, float* y) override {
    // `y < 0` rather than max(y, 0): a NaN stays NaN, so a diverging run is seen.
    for (size_t i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
    return Status::Ok();
  }

  Status ReluBackward(size_t n, const float* y, float* dy) override {
    for (size_t i = 0; i < n; ++i) dy[i] = y[i] <= 0.0f ? 0.0f : dy[i];
    return Status::Ok();
  }

  Status BiasGrad(int rows, int cols, const float* dy, float* db) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("BiasGrad", "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative("BiasGrad", "cols", cols));
    std::fill(db, db + cols, 0.0f);
    // Row by row so that the inner loop runs over contiguous memory and vectorizes.
    for (int i = 0; i < rows; ++i) {
      const float* row = dy + static_cast<size_t>(i) * cols;
      for (int j = 0; j < cols; ++j) db[j] += row[j];
    }
    return Status::Ok();
  }

  Status SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                             float grad_scale, float* grad_logits, double* host_loss_sum,
                             int64_t* host_correct) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("SoftmaxCrossEntropy", "rows", rows));
    if (rows > 0 && classes <= 0) {
      return InvalidArgument("SoftmaxCrossEntropy: classes = " + std::to_string(classes) +
                             " must be positive");
    }
    // Labels first, so that a bad batch leaves grad_logits untouched.
    for (int i = 0; i < rows; ++i) {
      if (labels[i] < 0 || labels[i] >= classes) {
        return InvalidArgument("SoftmaxCrossEntropy: label " + std::to_string(labels[i]) +
                               " of row " + std::to_string(i) + " is outside [0, " +
                               std::to_string(classes) + ")");
      }
    }
    double loss_sum = 0;
    int64_t correct = 0;
    for (int i = 0; i < rows; ++i) {
      const float* x = logits + static_cast<size_t>(i) * classes;
      // Subtracting the max keeps exp() from overflowing for large logits; the first
      // maximum is the argmax, as in the CUDA backend.
      int argmax = 0;
      for (int j = 1; j < classes; ++j) {
        if (x[j] > x[argmax]) argmax = j;
      }
      const float max = x[argmax];
      double sum = 0;
      for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(x[j] - max));
      const int label = labels[i];
      loss_sum += std::log(sum) - static_cast<double>(x[label] - max);
      if (argmax == label) ++correct;
      if (grad_logits != nullptr) {
        float* g = grad_logits + static_cast<size_t>(i) * classes;
        const double inv_sum = 1.0 / sum;
        for (int j = 0; j < classes; ++j) {
          const double p = std::exp(static_cast<double>(x[j] - max)) * inv_sum;
          g[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * grad_scale);
        }
      }
    }
    if (host_loss_sum != nullptr) *host_loss_sum = loss_sum;
    if (host_correct != nullptr) *host_correct = correct;
    return Status::Ok();
  }

  Status Scale(size_t n, float alpha, float* x) override {
    for (size_t i = 0; i < n; ++i) x[i] *= alpha;
    return Status::Ok();
  }

 private:
  // C = beta * C with the BLAS rule that beta == 0 overwrites (so NaN in C is dropped).
  static void ScaleC(size_t n, float beta, float* c) {
    if (beta == 0.0f) {
      std::fill(c, c + n, 0.0f);
    } else if (beta != 1.0f) {
      for (size_t i = 0; i < n; ++i) c[i] *= beta;
    }
  }
};

}  // namespace

std::unique_ptr<Kernels> MakeCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace ps
