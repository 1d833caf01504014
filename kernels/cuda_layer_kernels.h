// The CUDA kernels behind the CUDA backend's convolution, pooling, channel-bias and
// dropout ops, with host-side launchers. Private to kernels/ and included by .cu files only
// (it names CUDA types). Each launcher queues its kernel on `stream` with at most
// `max_blocks` blocks (grid-stride loops cover the rest), launches nothing when there is
// nothing to do, and returns the launch's error (cudaGetLastError); a fault inside a
// kernel shows at the next stream synchronization. Arguments are checked by the caller.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

// Grid-stride loops: any n works with a bounded grid.
#define PS_GRID_STRIDE_LOOP(i, n)                                                      \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

namespace ps {

// Im2Col and Col2Im of kernels.h for one image.
cudaError_t LaunchIm2Col(const Conv2dShape& shape, const float* image, float* col, int max_blocks,
                         cudaStream_t stream);
cudaError_t LaunchCol2Im(const Conv2dShape& shape, const float* col, float* image, int max_blocks,
                         cudaStream_t stream);

// AddChannelBias and ChannelBiasGrad of kernels.h.
cudaError_t LaunchAddChannelBias(int batch, int channels, int spatial, const float* bias, float* y,
                                 int max_blocks, cudaStream_t stream);
cudaError_t LaunchChannelBiasGrad(int batch, int channels, int spatial, const float* dy, float* db,
                                  int max_blocks, cudaStream_t stream);

// MaxPool2dForward and MaxPool2dBackward of kernels.h.
cudaError_t LaunchMaxPoolForward(const Pool2dShape& shape, const float* x, float* y,
                                 int32_t* argmax, int max_blocks, cudaStream_t stream);
cudaError_t LaunchMaxPoolBackward(const Pool2dShape& shape, const float* dy, const int32_t* argmax,
                                  float* dx, int max_blocks, cudaStream_t stream);

// mask[i] = DropoutBits(seed, i) < threshold (kernel_math.h).
cudaError_t LaunchDropoutMask(size_t n, uint64_t threshold, uint64_t seed, uint8_t* mask,
                              int max_blocks, cudaStream_t stream);
// out[i] = mask[i] ? in[i] * scale : 0.
cudaError_t LaunchApplyMask(size_t n, float scale, const uint8_t* mask, const float* in, float* out,
                            int max_blocks, cudaStream_t stream);

}  // namespace ps
