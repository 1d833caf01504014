// Arithmetic that every backend must do the same way, written once for the host and the
// device: the dropout mask's hash and max pooling's choice of winner. Private to kernels/; included
// by the CPU backend
// (.cc) and the CUDA backend (.cu), which compiles it for both sides.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

namespace ps {

// The dropout threshold: element i is kept when DropoutBits(seed, i) < threshold, which
// happens with probability keep_prob (to 2^-32). keep_prob 1 gives 2^32, above every draw.
// REQUIRES: 0 < keep_prob <= 1 (checked by the ops).
inline uint64_t DropoutThreshold(float keep_prob) {
  return static_cast<uint64_t>(static_cast<double>(keep_prob) * 4294967296.0);
}

// 32 random bits for element i: the i-th output of SplitMix64 seeded with `seed` (its
// state after i + 1 steps, through its finalizer), top half. Counter-based, so any
// element can be drawn alone and in any order.
PS_HOST_DEVICE inline uint32_t DropoutBits(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 32);
}

// What max pooling needs of a Pool2dShape, in a form device code can take by value.
struct PoolGeometry {
  int height;
  int width;
  int window;
  int stride;
  int padding;
};

// The position (iy * width + ix) of the maximum of the window of output (oy, ox): the first
// in row-major order among equals, the first NaN if there is one (`v != v` is the NaN
// test on both sides: no fast-math here). REQUIRES: the window holds a real pixel (what
// Pool2dShape::Validate ensures).
PS_HOST_DEVICE inline int PoolArgmax(const PoolGeometry& g, const float* image, int oy, int ox) {
  const int y0 = oy * g.stride - g.padding;
  const int x0 = ox * g.stride - g.padding;
  const int y1 = y0 + g.window < g.height ? y0 + g.window : g.height;
  const int x1 = x0 + g.window < g.width ? x0 + g.window : g.width;
  int best = -1;
  float best_v = 0.0f;
  for (int iy = y0 > 0 ? y0 : 0; iy < y1; ++iy) {
    for (int ix = x0 > 0 ? x0 : 0; ix < x1; ++ix) {
      const int i = iy * g.width + ix;
      const float v = image[i];
      if (best < 0 || v > best_v || (v != v && best_v == best_v)) {
        best = i;
        best_v = v;
      }
    }
  }
  return best;
}

}  // namespace ps
