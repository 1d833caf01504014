// Compute kernels behind one host-side interface. A model calls these; which device runs
// them (CPU with OpenBLAS, or a CUDA GPU with cuBLAS) is chosen once, by MakeKernels().
// No CUDA type appears in this header.
//
// Memory: pointers passed to the ops are in the backend's memory space (host memory for
// the CPU backend, device memory for CUDA). Allocate with Alloc / DeviceBuffer and move
// data with CopyToDevice / CopyToHost. All matrices are row-major and dense.
//
// Thread model: a Kernels object is used by one thread at a time (the training thread);
// the CUDA backend runs every op on one stream it owns, so ops execute in call order.
// CopyToHost returns when the data is on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ps {

class Kernels {
 public:
  virtual ~Kernels() = default;

  // Human-readable device, e.g. "cpu: 2 threads" or "NVIDIA H200".
  virtual std::string DeviceName() const = 0;
  virtual bool IsCuda() const = 0;

  // ---- memory ----
  virtual Result<void*> AllocBytes(size_t bytes) = 0;
  virtual void FreeBytes(void* p) = 0;
  virtual Status CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // Blocks until every op issued so far has finished.
  virtual Status Synchronize() = 0;

  // ---- dense linear algebra ----
  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T; A is m x k after op,
  // B is k x n after op. Any of m, n, k may be 0 (then C is only scaled by beta).
  virtual Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                      const float* b, float beta, float* c) = 0;

  // ---- layers ----
  // y[i, j] += bias[j] for a rows x cols matrix y.
  virtual Status AddBias(int rows, int cols, const float* bias, float* y) = 0;
  // y = max(y, 0) in place, n elements.
  virtual Status Relu(size_t n, float* y) = 0;
  // dy[i] = 0 where y[i] <= 0 (y is the ReLU output), n elements.
  virtual Status ReluBackward(size_t n, const float* y, float* dy) = 0;
  // db[j] = sum_i dy[i, j] for a rows x cols matrix dy (overwrites db).
  virtual Status BiasGrad(int rows, int cols, const float* dy, float* db) = 0;
  // Softmax cross-entropy over `classes` logits per row, for `rows` rows with int32 labels
  // in [0, classes). Writes grad_logits = (softmax - onehot) * grad_scale (may be null to
  // skip), and into *host_loss_sum the summed loss and *host_correct the number of rows
  // whose argmax equals the label (both host pointers, valid when the call returns).
  // A label out of range is an InvalidArgument error.
  virtual Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                     const int32_t* labels, float grad_scale, float* grad_logits,
                                     double* host_loss_sum, int64_t* host_correct) = 0;
  // y = alpha * x, in place, n elements.
  virtual Status Scale(size_t n, float alpha, float* x) = 0;
};

// device: "cpu", "cuda" (first GPU), "cuda:N". A CUDA device where the build has no CUDA
// support or the machine has no such GPU is an error naming what was asked and found;
// there is no silent fallback to the CPU.
Result<std::unique_ptr<Kernels>> MakeKernels(std::string_view device);

// Number of CUDA devices visible (0 when built without CUDA or no driver).
int CudaDeviceCount();

// Sets flush-to-zero and denormals-are-zero for the calling thread: denormal floats can
// halve a CPU training loop's speed.
void EnableFlushToZero();

// An owning, typed buffer in a backend's memory space.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    Reset();
    k_ = o.k_;
    p_ = o.p_;
    n_ = o.n_;
    o.k_ = nullptr;
    o.p_ = nullptr;
    o.n_ = 0;
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  static Result<DeviceBuffer> Make(Kernels* k, size_t n) {
    DeviceBuffer b;
    b.k_ = k;
    b.n_ = n;
    if (n == 0) return b;
    Result<void*> p = k->AllocBytes(n * sizeof(T));
    if (!p.ok()) return p.status();
    b.p_ = static_cast<T*>(p.value());
    return b;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Reset() {
    if (k_ != nullptr && p_ != nullptr) k_->FreeBytes(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  Kernels* k_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ps
