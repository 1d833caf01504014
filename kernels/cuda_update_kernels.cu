#include <cmath>
#include <cstddef>

#include "kernels/cuda_update_kernels.h"

namespace ps {
namespace {

constexpr int kThreads = 256;  // threads per block; a multiple of the warp size
constexpr int kWarps = kThreads / 32;

// What the kernel needs of a rule and a step, by value. The per-row scalars that the CPU
// computes in double (the clip norm, Adam's bias corrections) stay double here too.
struct StepParams {
  UpdateRule::Kind kind;
  float lr;
  float weight_decay;
  double clip;
  float momentum;
  float epsilon;
  double beta1;
  double beta2;
};

// The sum of every thread's `v` over the block, returned to every thread.
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kWarps];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  for (int i = 0; i < kWarps; ++i) total += warp_sums[i];
  return total;
}

// One block per row; each thread takes every kThreads-th element. The formulas, and their
// order of operations, are common/optimizer.cc's.
__global__ void ApplyUpdateKernel(StepParams p, int width, size_t stride, float* table,
                                  const float* __restrict__ grad) {
  const size_t row = blockIdx.x;
  float* __restrict__ w = table + row * stride;
  float* __restrict__ state = w + width;
  const float* __restrict__ g = grad + row * static_cast<size_t>(width);
  float scale = 1.0f;  // ClipScale
  if (p.clip > 0) {
    double sum_sq = 0;
    for (int i = threadIdx.x; i < width; i += kThreads) sum_sq += static_cast<double>(g[i]) * g[i];
    const double norm = sqrt(BlockSum(sum_sq));
    if (norm > p.clip) scale = static_cast<float>(p.clip / norm);
  }
  const float lr = p.lr;
  switch (p.kind) {
    case UpdateRule::Kind::kSgd: {
      const float wd = p.weight_decay;
      for (int i = threadIdx.x; i < width; i += kThreads) w[i] -= lr * (scale * g[i] + wd * w[i]);
      break;
    }
    case UpdateRule::Kind::kMomentum:
    case UpdateRule::Kind::kNesterov: {
      const bool nesterov = p.kind == UpdateRule::Kind::kNesterov;
      const float wd = p.weight_decay;
      const float mu = p.momentum;
      float* __restrict__ v = state;
      for (int i = threadIdx.x; i < width; i += kThreads) {
        const float gi = scale * g[i] + wd * w[i];
        v[i] = mu * v[i] + gi;
        w[i] -= nesterov ? lr * (gi + mu * v[i]) : lr * v[i];
      }
      break;
    }
    case UpdateRule::Kind::kAdagrad: {
      const float wd = p.weight_decay;
      float* __restrict__ s = state;
      for (int i = threadIdx.x; i < width; i += kThreads) {
        const float gi = scale * g[i] + wd * w[i];
        s[i] += gi * gi;
        w[i] -= lr * gi / (sqrtf(s[i]) + p.epsilon);
      }
      break;
    }
    case UpdateRule::Kind::kAdam:
    case UpdateRule::Kind::kAdamW: {
      const bool decoupled = p.kind == UpdateRule::Kind::kAdamW;
      float* __restrict__ m = state;
      float* __restrict__ v = state + width;
      float* t_slot = state + 2 * static_cast<size_t>(width);
      const float t_float = *t_slot + 1.0f;
      __syncthreads();  // every thread has read the row's step count before it moves on
      if (threadIdx.x == 0) *t_slot = t_float;
      const double t = t_float;
      const double bc1 = 1 - pow(p.beta1, t);
      const double bc2 = 1 - pow(p.beta2, t);
      const float step = static_cast<float>(lr / bc1);
      const float inv_sqrt_bc2 = static_cast<float>(1 / sqrt(bc2));
      const float b1 = static_cast<float>(p.beta1);
      const float b2 = static_cast<float>(p.beta2);
      const float one_minus_b1 = static_cast<float>(1 - p.beta1);
      const float one_minus_b2 = static_cast<float>(1 - p.beta2);
      const float wd = decoupled ? 0.0f : p.weight_decay;
      const float decay = decoupled ? 1.0f - lr * p.weight_decay : 1.0f;
      for (int i = threadIdx.x; i < width; i += kThreads) {
        const float gi = scale * g[i] + wd * w[i];
        m[i] = b1 * m[i] + one_minus_b1 * gi;
        v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
        w[i] = decay * w[i] - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + p.epsilon);
      }
      break;
    }
  }
}

// Each thread scans a grid-stride share; one that saw a bad value stores 1 (every writer
// stores the same value, so no atomic is needed). !(|v| <= limit) is true for NaN too.
__global__ void FlagOutOfRangeKernel(size_t n, const float* __restrict__ x, float limit,
                                     int32_t* flag) {
  bool bad = false;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    bad |= !(fabsf(x[i]) <= limit);
  }
  if (bad) *flag = 1;
}

}  // namespace

cudaError_t LaunchFlagOutOfRange(size_t n, const float* x, float limit, int32_t* flag,
                                 int max_blocks, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t wanted = (n + kThreads - 1) / kThreads;
  const unsigned blocks =
      static_cast<unsigned>(wanted < static_cast<size_t>(max_blocks) ? wanted : max_blocks);
  FlagOutOfRangeKernel<<<blocks, kThreads, 0, stream>>>(n, x, limit, flag);
  return cudaGetLastError();
}

cudaError_t LaunchApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                              float* table, const float* grad, cudaStream_t stream) {
  if (rows == 0 || width == 0) return cudaSuccess;
  const StepParams p{rule.kind,     lr,           rule.weight_decay, rule.clip_grad_norm,
                     rule.momentum, rule.epsilon, rule.beta1,        rule.beta2};
  ApplyUpdateKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      p, width, static_cast<size_t>(stride), table, grad);
  return cudaGetLastError();
}

}  // namespace ps
