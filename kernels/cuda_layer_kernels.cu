#include <algorithm>

#include "kernels/cuda_layer_kernels.h"
#include "kernels/kernel_math.h"

namespace ps {
namespace {

constexpr int kThreads = 256;  // threads per block; a power of two (ChannelBiasGradKernel)

// What the convolution kernels need of a Conv2dShape, by value.
struct ConvGeometry {
  int channels;
  int height;
  int width;
  int kernel;
  int stride;
  int padding;
  int out_h;
  int out_w;
};

ConvGeometry Geometry(const Conv2dShape& s) {
  return ConvGeometry{s.in_channels, s.height,  s.width,       s.kernel,
                      s.stride,      s.padding, s.OutHeight(), s.OutWidth()};
}

PoolGeometry Geometry(const Pool2dShape& s) {
  return PoolGeometry{s.height, s.width, s.window, s.stride, s.padding};
}

unsigned Blocks(size_t n, int max_blocks) {
  const size_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<size_t>(wanted, static_cast<size_t>(max_blocks)));
}

// One thread per col entry: adjacent threads write adjacent entries of a row.
__global__ void Im2ColKernel(size_t n, ConvGeometry g, const float* __restrict__ image,
                             float* __restrict__ col) {
  const size_t pixels = static_cast<size_t>(g.out_h) * g.out_w;
  const size_t k2 = static_cast<size_t>(g.kernel) * g.kernel;
  PS_GRID_STRIDE_LOOP(i, n) {
    const size_t row = i / pixels;
    const int p = static_cast<int>(i % pixels);
    const size_t c = row / k2;
    const int ky = static_cast<int>(row % k2) / g.kernel;
    const int kx = static_cast<int>(row % k2) % g.kernel;
    const int iy = (p / g.out_w) * g.stride - g.padding + ky;
    const int ix = (p % g.out_w) * g.stride - g.padding + kx;
    const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
    col[i] = inside ? image[(c * g.height + iy) * g.width + ix] : 0.0f;
  }
}

// One thread per image pixel, gathering the col entries that Im2Col copies it to, in the
// order of col's rows (ky, then kx): the CPU backend's sum, in the same order.
__global__ void Col2ImKernel(size_t n, ConvGeometry g, const float* __restrict__ col,
                             float* __restrict__ image) {
  const size_t plane = static_cast<size_t>(g.height) * g.width;
  const size_t pixels = static_cast<size_t>(g.out_h) * g.out_w;
  PS_GRID_STRIDE_LOOP(i, n) {
    const size_t c = i / plane;
    const int q = static_cast<int>(i % plane);
    const int iy = q / g.width;
    const int ix = q % g.width;
    float sum = 0.0f;
    // Output oy covers iy through kernel row ky when oy * stride - padding + ky == iy.
    for (int ky = 0; ky < g.kernel; ++ky) {
      const int ty = iy + g.padding - ky;
      if (ty < 0) break;  // ty only falls as ky grows
      if (ty % g.stride != 0 || ty / g.stride >= g.out_h) continue;
      const size_t row_y = (c * g.kernel + ky) * g.kernel;
      const size_t pos_y = static_cast<size_t>(ty / g.stride) * g.out_w;
      for (int kx = 0; kx < g.kernel; ++kx) {
        const int tx = ix + g.padding - kx;
        if (tx < 0) break;
        if (tx % g.stride != 0 || tx / g.stride >= g.out_w) continue;
        sum += col[(row_y + kx) * pixels + pos_y + tx / g.stride];
      }
    }
    image[i] = sum;
  }
}

__global__ void AddChannelBiasKernel(size_t n, int channels, int spatial,
                                     const float* __restrict__ bias, float* __restrict__ y) {
  PS_GRID_STRIDE_LOOP(i, n) { y[i] += bias[(i / static_cast<size_t>(spatial)) % channels]; }
}

// A block per channel (grid-stride over channels): its threads sum strided elements of
// the channel's planes in double, then combine them in a fixed tree, so that results
// repeat from run to run.
__global__ void ChannelBiasGradKernel(int batch, int channels, int spatial,
                                      const float* __restrict__ dy, float* __restrict__ db) {
  __shared__ double partial[kThreads];
  const size_t per_channel = static_cast<size_t>(batch) * spatial;
  for (int c = blockIdx.x; c < channels; c += gridDim.x) {
    double sum = 0.0;
    for (size_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
      const size_t n = j / spatial;
      sum += dy[(n * channels + c) * spatial + j % spatial];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) db[c] = static_cast<float>(partial[0]);
    __syncthreads();  // partial[0] is read before the next channel overwrites it
  }
}

// One thread per output, scanning its window like the CPU backend (PoolArgmax).
__global__ void MaxPoolForwardKernel(size_t n, PoolGeometry g, int out_h, int out_w,
                                     const float* __restrict__ x, float* __restrict__ y,
                                     int32_t* __restrict__ argmax) {
  const size_t out_plane = static_cast<size_t>(out_h) * out_w;
  const size_t in_plane = static_cast<size_t>(g.height) * g.width;
  PS_GRID_STRIDE_LOOP(o, n) {
    const float* image = x + (o / out_plane) * in_plane;
    const int p = static_cast<int>(o % out_plane);
    const int best = PoolArgmax(g, image, p / out_w, p % out_w);
    y[o] = image[best];
    if (argmax != nullptr) argmax[o] = best;
  }
}

// One thread per input pixel, gathering the dy of the outputs whose window holds it and
// whose argmax it is, in the outputs' row-major order: no atomics, and the CPU backend's
// sum in the same order.
__global__ void MaxPoolBackwardKernel(size_t n, PoolGeometry g, int out_h, int out_w,
                                      const float* __restrict__ dy,
                                      const int32_t* __restrict__ argmax, float* __restrict__ dx) {
  const size_t out_plane = static_cast<size_t>(out_h) * out_w;
  const size_t in_plane = static_cast<size_t>(g.height) * g.width;
  PS_GRID_STRIDE_LOOP(i, n) {
    const size_t base = (i / in_plane) * out_plane;
    const int q = static_cast<int>(i % in_plane);
    const int iy = q / g.width;
    const int ix = q % g.width;
    // Output oy's window spans [oy * stride - padding, oy * stride - padding + window).
    const int ly = iy + g.padding - g.window + 1;
    const int lx = ix + g.padding - g.window + 1;
    const int oy0 = ly <= 0 ? 0 : (ly + g.stride - 1) / g.stride;
    const int ox0 = lx <= 0 ? 0 : (lx + g.stride - 1) / g.stride;
    const int oy1 = min((iy + g.padding) / g.stride, out_h - 1);
    const int ox1 = min((ix + g.padding) / g.stride, out_w - 1);
    float sum = 0.0f;
    for (int oy = oy0; oy <= oy1; ++oy) {
      for (int ox = ox0; ox <= ox1; ++ox) {
        const size_t o = base + static_cast<size_t>(oy) * out_w + ox;
        if (argmax[o] == q) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

__global__ void DropoutMaskKernel(size_t n, uint64_t threshold, uint64_t seed,
                                  uint8_t* __restrict__ mask) {
  PS_GRID_STRIDE_LOOP(i, n) { mask[i] = DropoutBits(seed, i) < threshold ? 1 : 0; }
}

// in == out is allowed, so no __restrict__ on them.
__global__ void ApplyMaskKernel(size_t n, float scale, const uint8_t* __restrict__ mask,
                                const float* in, float* out) {
  PS_GRID_STRIDE_LOOP(i, n) { out[i] = mask[i] != 0 ? in[i] * scale : 0.0f; }
}

}  // namespace

cudaError_t LaunchIm2Col(const Conv2dShape& shape, const float* image, float* col, int max_blocks,
                         cudaStream_t stream) {
  const ConvGeometry g = Geometry(shape);
  const size_t n = static_cast<size_t>(shape.ColRows()) * g.out_h * g.out_w;
  if (n == 0) return cudaSuccess;
  Im2ColKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, g, image, col);
  return cudaGetLastError();
}

cudaError_t LaunchCol2Im(const Conv2dShape& shape, const float* col, float* image, int max_blocks,
                         cudaStream_t stream) {
  const size_t n = static_cast<size_t>(shape.in_channels) * shape.height * shape.width;
  if (n == 0) return cudaSuccess;
  Col2ImKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, Geometry(shape), col, image);
  return cudaGetLastError();
}

cudaError_t LaunchAddChannelBias(int batch, int channels, int spatial, const float* bias, float* y,
                                 int max_blocks, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(batch) * channels * spatial;
  if (n == 0) return cudaSuccess;
  AddChannelBiasKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, channels, spatial, bias,
                                                                       y);
  return cudaGetLastError();
}

cudaError_t LaunchChannelBiasGrad(int batch, int channels, int spatial, const float* dy, float* db,
                                  int max_blocks, cudaStream_t stream) {
  if (channels == 0) return cudaSuccess;
  // batch or spatial 0 still runs: it writes the zeros that an empty sum is.
  const unsigned grid = static_cast<unsigned>(std::min(channels, max_blocks));
  ChannelBiasGradKernel<<<grid, kThreads, 0, stream>>>(batch, channels, spatial, dy, db);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolForward(const Pool2dShape& shape, const float* x, float* y,
                                 int32_t* argmax, int max_blocks, cudaStream_t stream) {
  const int out_h = shape.OutHeight();
  const int out_w = shape.OutWidth();
  const size_t n = static_cast<size_t>(shape.batch) * shape.channels * out_h * out_w;
  if (n == 0) return cudaSuccess;
  MaxPoolForwardKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, Geometry(shape), out_h,
                                                                       out_w, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolBackward(const Pool2dShape& shape, const float* dy, const int32_t* argmax,
                                  float* dx, int max_blocks, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(shape.batch) * shape.channels * shape.height * shape.width;
  if (n == 0) return cudaSuccess;
  MaxPoolBackwardKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(
      n, Geometry(shape), shape.OutHeight(), shape.OutWidth(), dy, argmax, dx);
  return cudaGetLastError();
}

cudaError_t LaunchDropoutMask(size_t n, uint64_t threshold, uint64_t seed, uint8_t* mask,
                              int max_blocks, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DropoutMaskKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, threshold, seed, mask);
  return cudaGetLastError();
}

cudaError_t LaunchApplyMask(size_t n, float scale, const uint8_t* mask, const float* in, float* out,
                            int max_blocks, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ApplyMaskKernel<<<Blocks(n, max_blocks), kThreads, 0, stream>>>(n, scale, mask, in, out);
  return cudaGetLastError();
}

}  // namespace ps
