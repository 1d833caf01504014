#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda_kernels.h"

namespace ps {
namespace {

constexpr int kThreads = 256;  // threads per block for the elementwise kernels
constexpr int kWarp = 32;
constexpr int kCeWarpsPerBlock = kThreads / kWarp;  // softmax CE: one warp per row

// ---- errors ----

Status CudaError(cudaError_t e, const std::string& what) {
  // Out of memory is a resource limit the caller may work around (smaller batch, another
  // device); everything else is a bug or a broken driver.
  const StatusCode code =
      e == cudaErrorMemoryAllocation ? StatusCode::kUnavailable : StatusCode::kInternal;
  return Status(code, what + ": " + cudaGetErrorString(e));
}

Status CublasError(cublasStatus_t s, const std::string& what) {
  const StatusCode code =
      s == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kUnavailable : StatusCode::kInternal;
  return Status(code, what + ": " + cublasGetStatusString(s));
}

// `what` is evaluated only on error, so building a message costs nothing on success.
// A failed call also leaves its error as the runtime's "last error"; it is cleared here so
// that the launch check of a later kernel does not report it again (sticky errors, from a
// kernel fault, stay whatever we do).
#define PS_CUDA_RETURN_IF_ERROR(call, what)   \
  do {                                        \
    const cudaError_t _ps_cuda_err = (call);  \
    if (_ps_cuda_err != cudaSuccess) {        \
      cudaGetLastError();                     \
      return CudaError(_ps_cuda_err, (what)); \
    }                                         \
  } while (0)

#define PS_CUBLAS_RETURN_IF_ERROR(call, what)     \
  do {                                            \
    const cublasStatus_t _ps_cublas_st = (call);  \
    if (_ps_cublas_st != CUBLAS_STATUS_SUCCESS) { \
      return CublasError(_ps_cublas_st, (what));  \
    }                                             \
  } while (0)

// Launches are asynchronous: a bad configuration shows up in cudaGetLastError, a fault
// inside the kernel at the next synchronizing call.
#define PS_CUDA_RETURN_IF_LAUNCH_FAILED(kernel_name) \
  PS_CUDA_RETURN_IF_ERROR(cudaGetLastError(), std::string(kernel_name) + " kernel launch")

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

Status CheckNonNegative(const char* op, const char* what, int64_t v) {
  if (v < 0) {
    return InvalidArgument(std::string(op) + ": " + what + " = " + std::to_string(v) +
                           " is negative");
  }
  return Status::Ok();
}

// ---- RAII for the runtime's handles ----

struct StreamDeleter {
  void operator()(CUstream_st* s) const { cudaStreamDestroy(s); }
};
struct CublasDeleter {
  void operator()(cublasContext* h) const { cublasDestroy(h); }
};
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;
using CublasPtr = std::unique_ptr<cublasContext, CublasDeleter>;
using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, PinnedFree>;

// ---- kernels ----

// Grid-stride loops: any n works with a bounded grid.
#define PS_GRID_STRIDE_LOOP(i, n)                                                      \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void AddBiasKernel(size_t n, int cols, const float* __restrict__ bias,
                              float* __restrict__ y) {
  PS_GRID_STRIDE_LOOP(i, n) { y[i] += bias[i % static_cast<size_t>(cols)]; }
}

__global__ void ReluKernel(size_t n, float* y) {
  // `v < 0` rather than fmaxf(v, 0): a NaN stays NaN, as in the CPU backend.
  PS_GRID_STRIDE_LOOP(i, n) {
    const float v = y[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void ReluBackwardKernel(size_t n, const float* __restrict__ y, float* __restrict__ dy) {
  PS_GRID_STRIDE_LOOP(i, n) {
    if (y[i] <= 0.0f) dy[i] = 0.0f;
  }
}

__global__ void ScaleKernel(size_t n, float alpha, float* x) {
  PS_GRID_STRIDE_LOOP(i, n) { x[i] *= alpha; }
}

// db[j] = sum_i dy[i, j]. A block covers 32 columns with kBiasRows row lanes: a warp reads
// 32 adjacent floats of one row (coalesced), the lanes then combine in shared memory.
constexpr int kBiasCols = 32;
constexpr int kBiasRows = 8;
__global__ void BiasGradKernel(int rows, int cols, const float* __restrict__ dy,
                               float* __restrict__ db) {
  __shared__ float partial[kBiasRows][kBiasCols + 1];  // +1: no bank conflicts
  const int col = blockIdx.x * kBiasCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += kBiasRows) {
      sum += dy[static_cast<size_t>(r) * cols + col];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int r = 1; r < kBiasRows; ++r) sum += partial[r][threadIdx.x];
    db[col] = sum;
  }
}

// What the softmax CE kernel reports back; zeroed before each launch.
struct CeScratch {
  double loss_sum;
  unsigned long long correct;
  // rows - (first row with a bad label), 0 when all labels are fine: atomicMax on it
  // finds the first bad row with a zero start value, so a memset is all the reset needs.
  int bad_row_code;
  int padding;
};

// One warp per row: max and argmax (first index on ties, as on the CPU), the sum of
// exponentials, the row's loss and gradient. Each block adds its rows' loss and
// correct count to `out` with one atomic each.
__global__ void SoftmaxCeKernel(int rows, int classes, const float* __restrict__ logits,
                                const int32_t* __restrict__ labels, float grad_scale,
                                float* __restrict__ grad, CeScratch* out) {
  __shared__ double block_loss[kCeWarpsPerBlock];
  __shared__ int block_correct[kCeWarpsPerBlock];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kCeWarpsPerBlock + warp;
  double loss = 0.0;
  int correct = 0;
  const int label = row < rows ? labels[row] : 0;
  if (row < rows && (label < 0 || label >= classes)) {
    if (lane == 0) atomicMax(&out->bad_row_code, rows - row);
  } else if (row < rows) {
    const float* x = logits + static_cast<size_t>(row) * classes;
    float best = -INFINITY;
    int best_j = INT_MAX;
    for (int j = lane; j < classes; j += kWarp) {
      const float v = x[j];
      if (best_j == INT_MAX || v > best) {
        best = v;
        best_j = j;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_j = __shfl_xor_sync(0xffffffffu, best_j, offset);
      if (other_j != INT_MAX &&
          (best_j == INT_MAX || other > best || (other == best && other_j < best_j))) {
        best = other;
        best_j = other_j;
      }
    }
    float sum = 0.0f;
    for (int j = lane; j < classes; j += kWarp) sum += expf(x[j] - best);
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      loss = static_cast<double>(logf(sum)) - static_cast<double>(x[label] - best);
      correct = best_j == label ? 1 : 0;
    }
    if (grad != nullptr) {
      const float inv_sum = 1.0f / sum;
      float* g = grad + static_cast<size_t>(row) * classes;
      for (int j = lane; j < classes; j += kWarp) {
        const float p = expf(x[j] - best) * inv_sum;
        g[j] = (p - (j == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
  }
  if (lane == 0) {
    block_loss[warp] = loss;
    block_correct[warp] = correct;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double l = 0.0;
    unsigned long long c = 0;
    for (int w = 0; w < kCeWarpsPerBlock; ++w) {
      l += block_loss[w];
      c += static_cast<unsigned long long>(block_correct[w]);
    }
    if (l != 0.0) atomicAdd(&out->loss_sum, l);
    if (c != 0) atomicAdd(&out->correct, c);
  }
}

// ---- the backend ----

class CudaKernels final : public Kernels {
 public:
  static Result<std::unique_ptr<Kernels>> Create(int device) {
    std::unique_ptr<CudaKernels> k(new CudaKernels(device));
    PS_RETURN_IF_ERROR(k->Init());
    return std::unique_ptr<Kernels>(std::move(k));
  }

  ~CudaKernels() override {
    // Make the device current so that the handles are released on the right one, and
    // let queued work finish before its buffers go away.
    if (cudaSetDevice(device_) == cudaSuccess && stream_ != nullptr) {
      cudaStreamSynchronize(stream_.get());
    }
  }

  std::string DeviceName() const override {
    return name_ + " (cuda:" + std::to_string(device_) + ")";
  }
  bool IsCuda() const override { return true; }

  Result<void*> AllocBytes(size_t bytes) override {
    PS_RETURN_IF_ERROR(Activate());
    void* p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes), "cudaMalloc(" + Bytes(bytes) + ")");
    return p;
  }

  void FreeBytes(void* p) override {
    if (p == nullptr) return;
    // cudaFree waits for the device, so a kernel still using p finishes first.
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) LOG(ERROR) << "cudaFree: " << cudaGetErrorString(e);
  }

  Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_.get()),
        "cudaMemcpyAsync(host to device, " + Bytes(bytes) + ")");
    // From pageable memory the runtime stages the data before returning, so host_src may
    // be reused at once; from pinned (page-locked) memory the copy is truly asynchronous
    // and we wait for it, so that the caller may always reuse host_src on return.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, host_src) != cudaSuccess) {
      cudaGetLastError();  // clear the error so that the next launch check does not see it
      return Sync("cudaStreamSynchronize after host to device copy");
    }
    if (attr.type != cudaMemoryTypeUnregistered) {
      return Sync("cudaStreamSynchronize after host to device copy");
    }
    return Status::Ok();
  }

  Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpyAsync(device to host, " + Bytes(bytes) + ")");
    return Sync("cudaStreamSynchronize after device to host copy");
  }

  Status Synchronize() override {
    PS_RETURN_IF_ERROR(Activate());
    return Sync("cudaStreamSynchronize");
  }

  Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
              const float* b, float beta, float* c) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "m", m));
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "n", n));
    PS_RETURN_IF_ERROR(CheckNonNegative("Gemm", "k", k));
    if (m == 0 || n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    const size_t mn = static_cast<size_t>(m) * n;
    if (k == 0) {
      // cuBLAS rejects a leading dimension of 0, and the product is empty anyway:
      // C = beta * C, where beta == 0 overwrites (the BLAS rule, NaN in C is dropped).
      if (beta == 0.0f) {
        PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c, 0, mn * sizeof(float), stream_.get()),
                                "cudaMemsetAsync(" + Bytes(mn * sizeof(float)) + ")");
        return Status::Ok();
      }
      if (beta == 1.0f) return Status::Ok();
      return Scale(mn, beta, c);
    }
    // cuBLAS is column-major, and a row-major matrix read as column-major is its
    // transpose. So compute C^T = op(B)^T op(A)^T: swap the operands and m with n.
    const int lda = trans_a ? m : k;  // row-major leading dimensions as stored
    const int ldb = trans_b ? k : n;
    PS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                          ldb, a, lda, &beta, c, n),
                              "cublasSgemm(m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                                  ", k=" + std::to_string(k) + ")");
    return Status::Ok();
  }

  Status AddBias(int rows, int cols, const float* bias, float* y) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("AddBias", "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative("AddBias", "cols", cols));
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    AddBiasKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, cols, bias, y);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("AddBias");
    return Status::Ok();
  }

  Status Relu(size_t n, float* y) override {
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    ReluKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, y);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("Relu");
    return Status::Ok();
  }

  Status ReluBackward(size_t n, const float* y, float* dy) override {
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, y, dy);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("ReluBackward");
    return Status::Ok();
  }

  Status BiasGrad(int rows, int cols, const float* dy, float* db) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("BiasGrad", "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative("BiasGrad", "cols", cols));
    if (cols == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    // rows == 0 still runs: it writes the zeros that an empty sum is.
    const dim3 block(kBiasCols, kBiasRows);
    const unsigned grid = static_cast<unsigned>((cols + kBiasCols - 1) / kBiasCols);
    BiasGradKernel<<<grid, block, 0, stream_.get()>>>(rows, cols, dy, db);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("BiasGrad");
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
    if (rows == 0) {
      if (host_loss_sum != nullptr) *host_loss_sum = 0;
      if (host_correct != nullptr) *host_correct = 0;
      return Status::Ok();
    }
    PS_RETURN_IF_ERROR(Activate());
    auto* scratch = static_cast<CeScratch*>(scratch_.get());
    PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(CeScratch), stream_.get()),
                            "cudaMemsetAsync(softmax scratch)");
    const unsigned grid = static_cast<unsigned>((rows + kCeWarpsPerBlock - 1) / kCeWarpsPerBlock);
    SoftmaxCeKernel<<<grid, kThreads, 0, stream_.get()>>>(rows, classes, logits, labels, grad_scale,
                                                          grad_logits, scratch);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropy");
    auto* host = static_cast<CeScratch*>(host_scratch_.get());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, scratch, sizeof(CeScratch), cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpyAsync(softmax result to host)");
    PS_RETURN_IF_ERROR(Sync("cudaStreamSynchronize after SoftmaxCrossEntropy"));
    if (host->bad_row_code != 0) {
      const int row = rows - host->bad_row_code;
      int32_t label = 0;
      PS_RETURN_IF_ERROR(CopyToHost(&label, labels + row, sizeof(label)));
      return InvalidArgument("SoftmaxCrossEntropy: label " + std::to_string(label) + " of row " +
                             std::to_string(row) + " is outside [0, " + std::to_string(classes) +
                             ")");
    }
    if (host_loss_sum != nullptr) *host_loss_sum = host->loss_sum;
    if (host_correct != nullptr) *host_correct = static_cast<int64_t>(host->correct);
    return Status::Ok();
  }

  Status Scale(size_t n, float alpha, float* x) override {
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    ScaleKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, alpha, x);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("Scale");
    return Status::Ok();
  }

 private:
  explicit CudaKernels(int device) : device_(device) {}

  Status Init() {
    PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            "cudaSetDevice(" + std::to_string(device_) + ")");
    cudaDeviceProp prop{};
    PS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_),
                            "cudaGetDeviceProperties(" + std::to_string(device_) + ")");
    name_ = prop.name;
    // Enough blocks to fill every SM several times over; grid-stride loops do the rest.
    max_blocks_ = std::max(1, prop.multiProcessorCount) * 16;

    cudaStream_t stream = nullptr;
    // Non-blocking: our stream does not wait on, or hold up, the legacy default stream
    // that other libraries in the process may use.
    PS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
    stream_.reset(stream);
    cublasHandle_t handle = nullptr;
    PS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle), "cublasCreate");
    cublas_.reset(handle);
    PS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream), "cublasSetStream");
    // Plain fp32 arithmetic (no TF32), so that results match the CPU backend closely.
    PS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

    void* p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, sizeof(CeScratch)),
                            "cudaMalloc(" + Bytes(sizeof(CeScratch)) + ")");
    scratch_.reset(p);
    // Pinned, so that the small result copy after each softmax is a direct DMA.
    p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, sizeof(CeScratch)),
                            "cudaMallocHost(" + Bytes(sizeof(CeScratch)) + ")");
    host_scratch_.reset(p);
    return Status::Ok();
  }

  // The current device is per host thread, and the calling thread may not be the one
  // that created this object.
  Status Activate() {
    PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            "cudaSetDevice(" + std::to_string(device_) + ")");
    return Status::Ok();
  }

  Status Sync(const char* what) {
    PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), what);
    return Status::Ok();
  }

  unsigned Blocks(size_t n) const {
    const size_t wanted = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(std::min<size_t>(wanted, static_cast<size_t>(max_blocks_)));
  }

  const int device_;
  std::string name_;
  int max_blocks_ = 1;
  // Declaration order matters: members are destroyed in reverse, so the cuBLAS handle
  // goes before the stream it is bound to.
  StreamPtr stream_;
  CublasPtr cublas_;
  DevicePtr scratch_;       // CeScratch on the device
  PinnedPtr host_scratch_;  // CeScratch on the host
};

}  // namespace

int CudaDeviceCountWithReason(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // the runtime keeps the error; clear it for later checks
    if (why != nullptr) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Kernels>> MakeCudaKernels(int device) {
  std::string why;
  const int count = CudaDeviceCountWithReason(&why);
  if (count == 0) {
    return FailedPrecondition("device cuda:" + std::to_string(device) +
                              " was asked for, but no CUDA device is visible" +
                              (why.empty() ? std::string() : " (" + why + ")"));
  }
  if (device < 0 || device >= count) {
    return FailedPrecondition("device cuda:" + std::to_string(device) + " was asked for, but " +
                              std::to_string(count) + " CUDA device(s) are visible (cuda:0.." +
                              "cuda:" + std::to_string(count - 1) + ")");
  }
  return CudaKernels::Create(device);
}

}  // namespace ps
