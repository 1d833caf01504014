#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda_kernels.h"
#include "kernels/cuda_layer_kernels.h"
#include "kernels/cuda_update_kernels.h"
#include "kernels/kernel_math.h"
#include "kernels/layer_checks.h"

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

// ---- sparse rows ----

// Where GatherRows and ScatterAddRows record an out-of-range index, read back at the next
// stream synchronization. `bad` packs (row << 32) | index bits and takes the atomicMin, so
// the lowest offending row wins whatever the order of the threads; kNoBadIndex (all ones,
// what a 0xff memset writes) means none. `ops` has a bit per op that saw one.
struct IndexScratch {
  unsigned long long bad;
  unsigned int ops;
  unsigned int padding;
};
constexpr unsigned long long kNoBadIndex = ~0ull;
constexpr unsigned int kGatherOp = 1;
constexpr unsigned int kScatterOp = 2;

__device__ void ReportBadIndex(IndexScratch* scratch, unsigned int op, size_t row, int32_t index) {
  atomicMin(&scratch->bad,
            (static_cast<unsigned long long>(row) << 32) | static_cast<uint32_t>(index));
  atomicOr(&scratch->ops, op);
}

// Rows spread over threadIdx.y and the grid, a row's elements over threadIdx.x (adjacent
// threads read adjacent elements, so each row's segment is one coalesced access). V is
// float4 where the row width and the pointers allow 16-byte accesses, else float.
// A row with a bad index is skipped, so the kernel never touches memory outside the table.
template <typename V>
__global__ void GatherRowsKernel(int rows, int width_v, const V* __restrict__ table, int table_rows,
                                 const int32_t* __restrict__ indices, V* __restrict__ out,
                                 IndexScratch* scratch) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.y;
  for (size_t r = static_cast<size_t>(blockIdx.x) * blockDim.y + threadIdx.y;
       r < static_cast<size_t>(rows); r += stride) {
    const int32_t index = indices[r];
    if (index < 0 || index >= table_rows) {
      if (threadIdx.x == 0) ReportBadIndex(scratch, kGatherOp, r, index);
      continue;
    }
    const V* src = table + static_cast<size_t>(index) * width_v;
    V* dst = out + r * width_v;
    for (int c = threadIdx.x; c < width_v; c += blockDim.x) dst[c] = src[c];
  }
}

// The same layout; atomicAdd makes duplicate indices accumulate (it compiles to a
// fire-and-forget reduction, as its result is unused).
__global__ void ScatterAddRowsKernel(int rows, int width, const float* __restrict__ src,
                                     const int32_t* __restrict__ indices, int table_rows,
                                     float* table, IndexScratch* scratch) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.y;
  for (size_t r = static_cast<size_t>(blockIdx.x) * blockDim.y + threadIdx.y;
       r < static_cast<size_t>(rows); r += stride) {
    const int32_t index = indices[r];
    if (index < 0 || index >= table_rows) {
      if (threadIdx.x == 0) ReportBadIndex(scratch, kScatterOp, r, index);
      continue;
    }
    const float* s = src + r * width;
    float* dst = table + static_cast<size_t>(index) * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) atomicAdd(dst + c, s[c]);
  }
}

// ---- precision conversion ----
// The intrinsics round to nearest even; NaN is mapped to the quiet NaN with the input's
// sign here, because the intrinsics leave the NaN's bits unspecified and the CPU backend
// must give the same bits.

struct ToHalfOp {
  __device__ uint16_t operator()(float f) const {
    if (isnan(f)) return static_cast<uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
  }
};
struct FromHalfOp {
  __device__ float operator()(uint16_t h) const {
    if ((h & 0x7fffu) > 0x7c00u) return __uint_as_float(((h & 0x8000u) << 16) | 0x7fc00000u);
    return __half2float(__ushort_as_half(h));
  }
};
struct ToBfloat16Op {
  __device__ uint16_t operator()(float f) const {
    if (isnan(f)) return static_cast<uint16_t>(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7fc0u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};
struct FromBfloat16Op {
  __device__ float operator()(uint16_t b) const {
    if ((b & 0x7fffu) > 0x7f80u) return __uint_as_float(((b & 0x8000u) << 16) | 0x7fc00000u);
    return __bfloat162float(__ushort_as_bfloat16(b));
  }
};

template <typename In, typename Out, typename Op>
__global__ void MapKernel(size_t n, const In* __restrict__ in, Out* __restrict__ out, Op op) {
  PS_GRID_STRIDE_LOOP(i, n) { out[i] = op(in[i]); }
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

// One thread per element (grid-stride), in the form the CPU backend uses, in float; each
// block adds its loss (in double) and correct count to `out` with one atomic each. A bad
// label is skipped and reported through bad_row_code, as in SoftmaxCeKernel.
__global__ void SigmoidCeKernel(int n, const float* __restrict__ logits,
                                const int32_t* __restrict__ labels, float grad_scale,
                                float* __restrict__ grad, CeScratch* out) {
  __shared__ double block_loss[kCeWarpsPerBlock];
  __shared__ unsigned long long block_correct[kCeWarpsPerBlock];
  double loss = 0.0;
  unsigned long long correct = 0;
  PS_GRID_STRIDE_LOOP(i, static_cast<size_t>(n)) {
    const int32_t label = labels[i];
    if (label != 0 && label != 1) {
      atomicMax(&out->bad_row_code, n - static_cast<int>(i));
      continue;
    }
    const float x = logits[i];
    const float e = expf(-fabsf(x));  // no overflow for any logit
    loss += static_cast<double>(fmaxf(x, 0.0f) - x * static_cast<float>(label) + log1pf(e));
    if ((x > 0.0f) == (label == 1)) ++correct;
    if (grad != nullptr) {
      const float sigmoid = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
      grad[i] = (sigmoid - static_cast<float>(label)) * grad_scale;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    loss += __shfl_xor_sync(0xffffffffu, loss, offset);
    correct += __shfl_xor_sync(0xffffffffu, correct, offset);
  }
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) {
    block_loss[warp] = loss;
    block_correct[warp] = correct;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double l = 0.0;
    unsigned long long c = 0;
    for (int w = 0; w < kCeWarpsPerBlock; ++w) {
      l += block_loss[w];
      c += block_correct[w];
    }
    if (l != 0.0) atomicAdd(&out->loss_sum, l);
    if (c != 0) atomicAdd(&out->correct, c);
  }
}

// ---- the backend ----

class CudaKernels final : public Kernels {
 public:
  static Result<std::unique_ptr<Kernels>> Create(int device, const KernelsOptions& options) {
    std::unique_ptr<CudaKernels> k(new CudaKernels(device, options));
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
    std::string name = name_ + " (cuda:" + std::to_string(device_);
    if (precision_ != GemmPrecision::kFp32) name += std::string(", gemm ") + Name(precision_);
    return name + ")";
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

  Result<void*> AllocHostPinned(size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    PS_RETURN_IF_ERROR(Activate());
    void* p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, bytes, cudaHostAllocDefault),
                            "cudaHostAlloc(" + Bytes(bytes) + ")");
    return p;
  }

  void FreeHostPinned(void* p) override {
    if (p == nullptr) return;
    // A copy queued from or to p may still be running (CopyToDevice from pinned memory
    // returns at once): let the stream drain first. Its errors are left for Sync to report.
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_.get());
    if (e != cudaSuccess) {
      cudaGetLastError();
      LOG(ERROR) << "FreeHostPinned: waiting for the stream: " << cudaGetErrorString(e);
    }
    e = cudaFreeHost(p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      LOG(ERROR) << "cudaFreeHost: " << cudaGetErrorString(e);
    }
  }

  Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    // From pageable memory the runtime copies the data to a staging buffer before
    // returning, so host_src may be reused at once; from pinned (page-locked) memory the
    // DMA reads host_src while it runs, which kernels.h tells callers to allow for.
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_.get()),
        "cudaMemcpyAsync(host to device, " + Bytes(bytes) + ")");
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
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    auto what = [&](const char* call) {
      return std::string(call) + "(" + Name(precision_) + ", m=" + std::to_string(m) +
             ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")";
    };
    switch (precision_) {
      case GemmPrecision::kFp32:
        PS_CUBLAS_RETURN_IF_ERROR(
            cublasSgemm(cublas_.get(), op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, n),
            what("cublasSgemm"));
        return Status::Ok();
      case GemmPrecision::kTf32:
        PS_CUBLAS_RETURN_IF_ERROR(
            cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a,
                         CUDA_R_32F, lda, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                         CUBLAS_GEMM_DEFAULT),
            what("cublasGemmEx"));
        return Status::Ok();
      case GemmPrecision::kBf16: {
        // Round A and B to bfloat16 into scratch (same layout), then multiply with fp32
        // accumulation into the fp32 C.
        const size_t a_size = static_cast<size_t>(m) * k;
        const size_t b_size = static_cast<size_t>(k) * n;
        // B's copy starts 128-byte aligned: cuBLAS's tensor-core kernels want aligned bases.
        const size_t b_offset = (a_size + 63) / 64 * 64;
        PS_ASSIGN_OR_RETURN(uint16_t * a16, Bf16Scratch(b_offset + b_size));
        uint16_t* b16 = a16 + b_offset;
        MapKernel<<<Blocks(a_size), kThreads, 0, stream_.get()>>>(a_size, a, a16, ToBfloat16Op());
        PS_CUDA_RETURN_IF_LAUNCH_FAILED("Gemm: A to bfloat16");
        MapKernel<<<Blocks(b_size), kThreads, 0, stream_.get()>>>(b_size, b, b16, ToBfloat16Op());
        PS_CUDA_RETURN_IF_LAUNCH_FAILED("Gemm: B to bfloat16");
        PS_CUBLAS_RETURN_IF_ERROR(
            cublasGemmEx(cublas_.get(), op_b, op_a, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16,
                         CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            what("cublasGemmEx"));
        return Status::Ok();
      }
    }
    return Internal(what("Gemm: unknown precision"));
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

  Status Copy2d(int rows, int cols, const float* src, int src_stride, float* dst,
                int dst_stride) override {
    PS_RETURN_IF_ERROR(CheckCopy2d(rows, cols, src_stride, dst_stride));
    if (rows == 0 || cols == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    constexpr size_t kF = sizeof(float);
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy2DAsync(dst, dst_stride * kF, src, src_stride * kF, cols * kF, rows,
                          cudaMemcpyDeviceToDevice, stream_.get()),
        "cudaMemcpy2DAsync(" + std::to_string(rows) + " x " + std::to_string(cols) + " floats)");
    return Status::Ok();
  }

  Status SigmoidCrossEntropy(int n, const float* logits, const int32_t* labels, float grad_scale,
                             float* grad_logits, double* host_loss_sum,
                             int64_t* host_correct) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("SigmoidCrossEntropy", "n", n));
    if (n == 0) {
      if (host_loss_sum != nullptr) *host_loss_sum = 0;
      if (host_correct != nullptr) *host_correct = 0;
      return Status::Ok();
    }
    PS_RETURN_IF_ERROR(Activate());
    auto* scratch = static_cast<CeScratch*>(scratch_.get());
    PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, sizeof(CeScratch), stream_.get()),
                            "cudaMemsetAsync(sigmoid scratch)");
    // kThreads per block: the kernel's reduction has a slot per warp of that block size.
    SigmoidCeKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, logits, labels, grad_scale,
                                                               grad_logits, scratch);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("SigmoidCrossEntropy");
    auto* host = static_cast<CeScratch*>(host_scratch_.get());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, scratch, sizeof(CeScratch), cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpyAsync(sigmoid result to host)");
    PS_RETURN_IF_ERROR(Sync("cudaStreamSynchronize after SigmoidCrossEntropy"));
    if (host->bad_row_code != 0) {
      const int i = n - host->bad_row_code;
      int32_t label = 0;
      PS_RETURN_IF_ERROR(CopyToHost(&label, labels + i, sizeof(label)));
      return InvalidArgument("SigmoidCrossEntropy: label " + std::to_string(label) +
                             " of element " + std::to_string(i) + " is neither 0 nor 1");
    }
    if (host_loss_sum != nullptr) *host_loss_sum = host->loss_sum;
    if (host_correct != nullptr) *host_correct = static_cast<int64_t>(host->correct);
    return Status::Ok();
  }

  Status DropoutMask(size_t n, float keep_prob, uint64_t seed, uint8_t* mask) override {
    PS_RETURN_IF_ERROR(CheckKeepProb("DropoutMask", keep_prob));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        LaunchDropoutMask(n, DropoutThreshold(keep_prob), seed, mask, max_blocks_, stream_.get()),
        "DropoutMask kernel launch");
    return Status::Ok();
  }
  Status DropoutForward(size_t n, float keep_prob, const uint8_t* mask, const float* x,
                        float* y) override {
    return ApplyMask("DropoutForward", n, keep_prob, mask, x, y);
  }
  Status DropoutBackward(size_t n, float keep_prob, const uint8_t* mask, const float* dy,
                         float* dx) override {
    return ApplyMask("DropoutBackward", n, keep_prob, mask, dy, dx);
  }

  Status ApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                     float* table, const float* grad) override {
    PS_RETURN_IF_ERROR(CheckUpdateArgs(rule, rows, width, stride));
    if (rows == 0 || width == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        LaunchApplyUpdate(rule, lr, rows, width, stride, table, grad, stream_.get()),
        "ApplyUpdate kernel launch");
    return Status::Ok();
  }

  Status FlagOutOfRange(size_t n, const float* x, float limit, int32_t* flag) override {
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(LaunchFlagOutOfRange(n, x, limit, flag, max_blocks_, stream_.get()),
                            "FlagOutOfRange kernel launch");
    return Status::Ok();
  }

  Status Im2Col(const Conv2dShape& shape, const float* image, float* col) override {
    PS_RETURN_IF_ERROR(CheckShape("Im2Col", shape));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(LaunchIm2Col(shape, image, col, max_blocks_, stream_.get()),
                            "Im2Col kernel launch");
    return Status::Ok();
  }
  Status Col2Im(const Conv2dShape& shape, const float* col, float* image) override {
    PS_RETURN_IF_ERROR(CheckShape("Col2Im", shape));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(LaunchCol2Im(shape, col, image, max_blocks_, stream_.get()),
                            "Col2Im kernel launch");
    return Status::Ok();
  }

  Status AddChannelBias(int batch, int channels, int spatial, const float* bias,
                        float* y) override {
    PS_RETURN_IF_ERROR(CheckChannelSizes("AddChannelBias", batch, channels, spatial));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        LaunchAddChannelBias(batch, channels, spatial, bias, y, max_blocks_, stream_.get()),
        "AddChannelBias kernel launch");
    return Status::Ok();
  }
  Status ChannelBiasGrad(int batch, int channels, int spatial, const float* dy,
                         float* db) override {
    PS_RETURN_IF_ERROR(CheckChannelSizes("ChannelBiasGrad", batch, channels, spatial));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        LaunchChannelBiasGrad(batch, channels, spatial, dy, db, max_blocks_, stream_.get()),
        "ChannelBiasGrad kernel launch");
    return Status::Ok();
  }

  Status MaxPool2dForward(const Pool2dShape& shape, const float* x, float* y,
                          int32_t* argmax) override {
    PS_RETURN_IF_ERROR(CheckShape("MaxPool2dForward", shape));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(LaunchMaxPoolForward(shape, x, y, argmax, max_blocks_, stream_.get()),
                            "MaxPool2dForward kernel launch");
    return Status::Ok();
  }
  Status MaxPool2dBackward(const Pool2dShape& shape, const float* dy, const int32_t* argmax,
                           float* dx) override {
    PS_RETURN_IF_ERROR(CheckShape("MaxPool2dBackward", shape));
    PS_RETURN_IF_ERROR(Activate());
    PS_CUDA_RETURN_IF_ERROR(
        LaunchMaxPoolBackward(shape, dy, argmax, dx, max_blocks_, stream_.get()),
        "MaxPool2dBackward kernel launch");
    return Status::Ok();
  }

  Status GatherRows(int rows, int width, const float* table, int table_rows, const int32_t* indices,
                    float* out) override {
    PS_RETURN_IF_ERROR(CheckSparseSizes("GatherRows", rows, width, table_rows));
    if (rows == 0 || width == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    auto* scratch = static_cast<IndexScratch*>(index_scratch_.get());
    // 16-byte accesses need 16-byte aligned rows: a width of 4k floats and aligned bases.
    const bool vec4 = width % 4 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const int width_v = vec4 ? width / 4 : width;
    const dim3 block = RowBlock(width_v);
    const unsigned grid = RowGrid(rows, block);
    if (vec4) {
      GatherRowsKernel<<<grid, block, 0, stream_.get()>>>(
          rows, width_v, reinterpret_cast<const float4*>(table), table_rows, indices,
          reinterpret_cast<float4*>(out), scratch);
    } else {
      GatherRowsKernel<<<grid, block, 0, stream_.get()>>>(rows, width_v, table, table_rows, indices,
                                                          out, scratch);
    }
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("GatherRows");
    index_check_pending_ = true;
    return Status::Ok();
  }

  Status ScatterAddRows(int rows, int width, const float* src, const int32_t* indices,
                        int table_rows, float* table) override {
    PS_RETURN_IF_ERROR(CheckSparseSizes("ScatterAddRows", rows, width, table_rows));
    if (rows == 0 || width == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    const dim3 block = RowBlock(width);
    ScatterAddRowsKernel<<<RowGrid(rows, block), block, 0, stream_.get()>>>(
        rows, width, src, indices, table_rows, table,
        static_cast<IndexScratch*>(index_scratch_.get()));
    PS_CUDA_RETURN_IF_LAUNCH_FAILED("ScatterAddRows");
    index_check_pending_ = true;
    return Status::Ok();
  }

  Status ToHalf(size_t n, const float* in, uint16_t* out) override {
    return Map("ToHalf", n, in, out, ToHalfOp());
  }
  Status FromHalf(size_t n, const uint16_t* in, float* out) override {
    return Map("FromHalf", n, in, out, FromHalfOp());
  }
  Status ToBfloat16(size_t n, const float* in, uint16_t* out) override {
    return Map("ToBfloat16", n, in, out, ToBfloat16Op());
  }
  Status FromBfloat16(size_t n, const uint16_t* in, float* out) override {
    return Map("FromBfloat16", n, in, out, FromBfloat16Op());
  }

 private:
  CudaKernels(int device, const KernelsOptions& options)
      : device_(device), requested_precision_(options.gemm_precision) {}

  static const char* Name(GemmPrecision p) {
    switch (p) {
      case GemmPrecision::kFp32:
        return "fp32";
      case GemmPrecision::kTf32:
        return "tf32";
      case GemmPrecision::kBf16:
        return "bf16";
    }
    return "unknown";
  }

  static Status CheckSparseSizes(const char* op, int rows, int width, int table_rows) {
    PS_RETURN_IF_ERROR(CheckNonNegative(op, "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative(op, "width", width));
    return CheckNonNegative(op, "table_rows", table_rows);
  }

  // out = in * mask / keep_prob, the two Dropout passes.
  Status ApplyMask(const char* op_name, size_t n, float keep_prob, const uint8_t* mask,
                   const float* in, float* out) {
    PS_RETURN_IF_ERROR(CheckKeepProb(op_name, keep_prob));
    PS_RETURN_IF_ERROR(Activate());
    // The scale is computed here, on the host, as the CPU backend does: the same bits.
    PS_CUDA_RETURN_IF_ERROR(
        LaunchApplyMask(n, 1.0f / keep_prob, mask, in, out, max_blocks_, stream_.get()),
        std::string(op_name) + " kernel launch");
    return Status::Ok();
  }

  template <typename In, typename Out, typename Op>
  Status Map(const char* op_name, size_t n, const In* in, Out* out, Op op) {
    if (n == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(Activate());
    MapKernel<<<Blocks(n), kThreads, 0, stream_.get()>>>(n, in, out, op);
    PS_CUDA_RETURN_IF_LAUNCH_FAILED(op_name);
    return Status::Ok();
  }

  // kThreads threads per block: x spans a row's elements (the next power of two of its
  // width, at most kThreads), y the rows, so that narrow rows still fill the block.
  static dim3 RowBlock(int width) {
    int x = 1;
    while (x < width && x < kThreads) x *= 2;
    return dim3(static_cast<unsigned>(x), static_cast<unsigned>(kThreads / x));
  }
  unsigned RowGrid(int rows, dim3 block) const {
    const size_t wanted = (static_cast<size_t>(rows) + block.y - 1) / block.y;
    return static_cast<unsigned>(std::min<size_t>(wanted, static_cast<size_t>(max_blocks_)));
  }

  // Device scratch for Gemm's bfloat16 operands, grown to the largest GEMM seen.
  Result<uint16_t*> Bf16Scratch(size_t elements) {
    if (elements > bf16_capacity_) {
      // cudaFree waits for the device, so a GEMM still reading the old buffer finishes.
      bf16_scratch_.reset();
      bf16_capacity_ = 0;
      void* p = nullptr;
      PS_CUDA_RETURN_IF_ERROR(
          cudaMalloc(&p, elements * sizeof(uint16_t)),
          "cudaMalloc(" + Bytes(elements * sizeof(uint16_t)) + ") for bfloat16 GEMM operands");
      bf16_scratch_.reset(p);
      bf16_capacity_ = elements;
    }
    return static_cast<uint16_t*>(bf16_scratch_.get());
  }

  Status Init() {
    PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            "cudaSetDevice(" + std::to_string(device_) + ")");
    cudaDeviceProp prop{};
    PS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_),
                            "cudaGetDeviceProperties(" + std::to_string(device_) + ")");
    name_ = prop.name;
    // Enough blocks to fill every SM several times over; grid-stride loops do the rest.
    max_blocks_ = std::max(1, prop.multiProcessorCount) * 16;
    // TF32 and bfloat16 tensor cores start with Ampere (8.0).
    precision_ = requested_precision_;
    if (precision_ != GemmPrecision::kFp32 && prop.major < 8) {
      LOG(WARNING) << "cuda:" << device_ << " (" << name_ << ") has compute capability "
                   << prop.major << "." << prop.minor << "; Gemm precision "
                   << Name(requested_precision_) << " needs 8.0, using fp32";
      precision_ = GemmPrecision::kFp32;
    }

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

    p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, sizeof(IndexScratch)),
                            "cudaMalloc(" + Bytes(sizeof(IndexScratch)) + ")");
    index_scratch_.reset(p);
    p = nullptr;
    PS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, sizeof(IndexScratch)),
                            "cudaMallocHost(" + Bytes(sizeof(IndexScratch)) + ")");
    host_index_scratch_.reset(p);
    PS_RETURN_IF_ERROR(ResetIndexScratch());
    return Sync("cudaStreamSynchronize after setup");
  }

  // bad = kNoBadIndex (all ones), ops = 0.
  Status ResetIndexScratch() {
    auto* scratch = static_cast<IndexScratch*>(index_scratch_.get());
    PS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(&scratch->bad, 0xff, sizeof(scratch->bad), stream_.get()),
        "cudaMemsetAsync(index scratch)");
    PS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&scratch->ops, 0, sizeof(scratch->ops), stream_.get()),
                            "cudaMemsetAsync(index scratch)");
    return Status::Ok();
  }

  // The current device is per host thread, and the calling thread may not be the one
  // that created this object.
  Status Activate() {
    PS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            "cudaSetDevice(" + std::to_string(device_) + ")");
    return Status::Ok();
  }

  // Waits for the stream, then reports an out-of-range index that a GatherRows or
  // ScatterAddRows since the last wait ran into (the copy of the record rides along on
  // the stream only when one of them was issued).
  Status Sync(const char* what) {
    const bool check = index_check_pending_;
    index_check_pending_ = false;
    auto* host = static_cast<IndexScratch*>(host_index_scratch_.get());
    if (check) {
      PS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, index_scratch_.get(), sizeof(IndexScratch),
                                              cudaMemcpyDeviceToHost, stream_.get()),
                              "cudaMemcpyAsync(index check to host)");
    }
    PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()), what);
    if (!check || host->bad == kNoBadIndex) return Status::Ok();
    const unsigned long long bad = host->bad;
    const unsigned int ops = host->ops;
    PS_RETURN_IF_ERROR(ResetIndexScratch());
    PS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()),
                            "cudaStreamSynchronize after index scratch reset");
    const char* op = ops == kGatherOp    ? "GatherRows"
                     : ops == kScatterOp ? "ScatterAddRows"
                                         : "GatherRows or ScatterAddRows";
    return InvalidArgument(std::string(op) + ": index " +
                           std::to_string(static_cast<int32_t>(bad & 0xffffffffu)) + " of row " +
                           std::to_string(bad >> 32) +
                           " is outside the table (the CUDA backend skipped that row; found "
                           "when the stream was next waited for)");
  }

  unsigned Blocks(size_t n) const {
    const size_t wanted = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(std::min<size_t>(wanted, static_cast<size_t>(max_blocks_)));
  }

  const int device_;
  const GemmPrecision requested_precision_;
  GemmPrecision precision_ = GemmPrecision::kFp32;  // what the device can do of the request
  std::string name_;
  int max_blocks_ = 1;
  // Set by GatherRows and ScatterAddRows: the next Sync reads the index record back.
  bool index_check_pending_ = false;
  size_t bf16_capacity_ = 0;  // elements of bf16_scratch_
  // Declaration order matters: members are destroyed in reverse, so the cuBLAS handle
  // goes before the stream it is bound to.
  StreamPtr stream_;
  CublasPtr cublas_;
  DevicePtr scratch_;             // CeScratch on the device
  PinnedPtr host_scratch_;        // CeScratch on the host
  DevicePtr index_scratch_;       // IndexScratch on the device
  PinnedPtr host_index_scratch_;  // IndexScratch on the host
  DevicePtr bf16_scratch_;        // Gemm's bfloat16 copies of A and B
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

namespace {

// FailedPrecondition naming what was asked and what is visible, unless GPU `device` is.
Status CheckDeviceVisible(int device) {
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
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Kernels>> MakeCudaKernels(int device, const KernelsOptions& options) {
  PS_RETURN_IF_ERROR(CheckDeviceVisible(device));
  return CudaKernels::Create(device, options);
}

Result<double> CudaPeakMemoryBandwidthImpl(int device) {
  PS_RETURN_IF_ERROR(CheckDeviceVisible(device));
  // Attributes rather than cudaDeviceProp: CUDA 13 dropped cudaDeviceProp::memoryClockRate.
  int clock_khz = 0;
  int bus_bits = 0;
  const std::string where = "cuda:" + std::to_string(device);
  cudaError_t e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Unavailable(
        where + ": cudaDeviceGetAttribute(memory clock, bus width): " + cudaGetErrorString(e));
  }
  if (clock_khz <= 0 || bus_bits <= 0) {
    return Unavailable(where + " does not report its memory clock (" + std::to_string(clock_khz) +
                       " kHz) or bus width (" + std::to_string(bus_bits) + " bits)");
  }
  // Double data rate: two transfers of bus_bits per memory clock.
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
}

}  // namespace ps
