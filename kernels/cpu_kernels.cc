#include "kernels/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <span>
#include <string>

#include "common/optimizer.h"
#include "kernels/blas_core.h"
#include "kernels/kernel_math.h"
#include "kernels/layer_checks.h"

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

// ---- precision conversion ----
// Bit manipulation in standard C++ (no compiler half types), written as selects rather
// than branches so that the compiler vectorizes the loops (about 2x here). Two steps use
// float arithmetic, arranged so that no operand or result is ever a float subnormal: the
// results are the same with or without EnableFlushToZero's FTZ/DAZ modes. They rely on
// the default rounding mode, round to nearest even.

constexpr uint32_t kFloatAbsMask = 0x7fffffffu;
constexpr uint32_t kFloatInf = 0x7f800000u;
constexpr uint32_t kFloatHalfBits = 0x3f000000u;  // 0.5f

uint16_t FloatToHalfBits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & kFloatAbsMask;
  // Normal half (|f| >= 2^-14): rebias the exponent (127 - 15 = 112) and round the 23-bit
  // mantissa to 10 bits, ties to even; a carry out of the mantissa bumps the exponent, and
  // from 65520 (halfway past the largest half, 65504) on it reaches infinity, 0x7c00.
  const uint32_t normal = (abs - (112u << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal half or zero (|f| < 2^-14): in |f| + 0.5 the unit of the last place is
  // 2^-24, the half subnormals' step, so the addition rounds |f| to a multiple of it (ties
  // to even) and leaves the multiple in the low mantissa bits. Float subnormal inputs
  // (zero under DAZ) round to 0 either way.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + 0.5f) - kFloatHalfBits;
  uint32_t h = abs < 0x38800000u ? subnormal : normal;
  h = abs >= 0x47800000u ? 0x7c00u : h;  // >= 2^16: infinity (and keeps `normal` in range)
  h = abs > kFloatInf ? 0x7e00u : h;     // NaN: the quiet NaN, payload dropped
  return static_cast<uint16_t>(sign | h);
}

float HalfBitsToFloat(uint16_t half) {
  const uint32_t h = half;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;            // exponent and mantissa
  uint32_t bits = (em << 13) + (112u << 23);  // normal: rebias the exponent
  // Zero and subnormals: m * 2^-24 is exact in float and, unless 0, a normal float.
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-24f);
  bits = em < 0x0400u ? subnormal : bits;
  bits = em >= 0x7c00u ? kFloatInf : bits;
  bits = em > 0x7c00u ? 0x7fc00000u : bits;  // NaN: the quiet NaN, payload dropped
  return std::bit_cast<float>(sign | bits);
}

uint16_t FloatToBfloat16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // bfloat16 is the top half of a float: round the low 16 bits away, ties to even. A carry
  // runs into the exponent, and from the largest finite values on into infinity.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = ((x >> 16) & 0x8000u) | 0x7fc0u;
  return static_cast<uint16_t>((x & kFloatAbsMask) > kFloatInf ? nan : rounded);
}

float Bfloat16BitsToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  const uint32_t nan = (x & 0x80000000u) | 0x7fc00000u;
  return std::bit_cast<float>((x & kFloatAbsMask) > kFloatInf ? nan : x);
}

// The first index outside [0, table_rows), checked before any write so that a rejected
// call leaves its output as it was.
Status CheckIndices(const char* op, int rows, const int32_t* indices, int table_rows) {
  for (int i = 0; i < rows; ++i) {
    if (indices[i] < 0 || indices[i] >= table_rows) {
      return InvalidArgument(std::string(op) + ": index " + std::to_string(indices[i]) +
                             " of row " + std::to_string(i) + " is outside [0, " +
                             std::to_string(table_rows) + ")");
    }
  }
  return Status::Ok();
}

class CpuKernels final : public Kernels {
 public:
  std::string DeviceName() const override {
    // The kernels OpenBLAS chose belong here: they set the GEMM speed (kernels/blas_core.h).
    return "cpu: " + std::to_string(openblas_get_num_threads()) + " threads, OpenBLAS " +
           ChosenBlasCore();
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

  // Nothing to pin without a device: plain aligned memory, the same as AllocBytes.
  Result<void*> AllocHostPinned(size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    return AllocBytes(bytes);
  }
  void FreeHostPinned(void* p) override {
    if (p != nullptr) FreeBytes(p);
  }

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

  Status Copy2d(int rows, int cols, const float* src, int src_stride, float* dst,
                int dst_stride) override {
    PS_RETURN_IF_ERROR(CheckCopy2d(rows, cols, src_stride, dst_stride));
    if (cols == 0) return Status::Ok();
    for (int i = 0; i < rows; ++i) {
      std::memcpy(dst + static_cast<size_t>(i) * dst_stride,
                  src + static_cast<size_t>(i) * src_stride,
                  static_cast<size_t>(cols) * sizeof(float));
    }
    return Status::Ok();
  }

  Status SigmoidCrossEntropy(int n, const float* logits, const int32_t* labels, float grad_scale,
                             float* grad_logits, double* host_loss_sum,
                             int64_t* host_correct) override {
    PS_RETURN_IF_ERROR(CheckNonNegative("SigmoidCrossEntropy", "n", n));
    // Labels first, so that a bad batch leaves grad_logits untouched.
    for (int i = 0; i < n; ++i) {
      if (labels[i] != 0 && labels[i] != 1) {
        return InvalidArgument("SigmoidCrossEntropy: label " + std::to_string(labels[i]) +
                               " of element " + std::to_string(i) + " is neither 0 nor 1");
      }
    }
    double loss_sum = 0;
    int64_t correct = 0;
    for (int i = 0; i < n; ++i) {
      const double x = logits[i];
      const double y = labels[i];
      // exp() of a non-positive number only: no overflow for any logit.
      const double e = std::exp(-std::abs(x));
      loss_sum += std::max(x, 0.0) - x * y + std::log1p(e);
      if ((x > 0) == (labels[i] == 1)) ++correct;
      if (grad_logits != nullptr) {
        const double sigmoid = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
        grad_logits[i] = static_cast<float>((sigmoid - y) * grad_scale);
      }
    }
    if (host_loss_sum != nullptr) *host_loss_sum = loss_sum;
    if (host_correct != nullptr) *host_correct = correct;
    return Status::Ok();
  }

  Status DropoutMask(size_t n, float keep_prob, uint64_t seed, uint8_t* mask) override {
    PS_RETURN_IF_ERROR(CheckKeepProb("DropoutMask", keep_prob));
    const uint64_t threshold = DropoutThreshold(keep_prob);
    for (size_t i = 0; i < n; ++i) mask[i] = DropoutBits(seed, i) < threshold ? 1 : 0;
    return Status::Ok();
  }
  Status DropoutForward(size_t n, float keep_prob, const uint8_t* mask, const float* x,
                        float* y) override {
    PS_RETURN_IF_ERROR(CheckKeepProb("DropoutForward", keep_prob));
    ApplyMask(n, 1.0f / keep_prob, mask, x, y);
    return Status::Ok();
  }
  Status DropoutBackward(size_t n, float keep_prob, const uint8_t* mask, const float* dy,
                         float* dx) override {
    PS_RETURN_IF_ERROR(CheckKeepProb("DropoutBackward", keep_prob));
    ApplyMask(n, 1.0f / keep_prob, mask, dy, dx);
    return Status::Ok();
  }

  Status Im2Col(const Conv2dShape& shape, const float* image, float* col) override {
    PS_RETURN_IF_ERROR(CheckShape("Im2Col", shape));
    ForEachColEntry(
        shape,
        [&](size_t c, int iy, int ix, float* entry) {
          const bool inside = iy >= 0 && iy < shape.height && ix >= 0 && ix < shape.width;
          *entry = inside ? image[(c * shape.height + iy) * shape.width + ix] : 0.0f;
        },
        col);
    return Status::Ok();
  }

  Status Col2Im(const Conv2dShape& shape, const float* col, float* image) override {
    PS_RETURN_IF_ERROR(CheckShape("Col2Im", shape));
    std::fill(image, image + static_cast<size_t>(shape.in_channels) * shape.height * shape.width,
              0.0f);
    // Rows in order: each pixel's sum adds its entries in the order of col's rows.
    ForEachColEntry(
        shape,
        [&](size_t c, int iy, int ix, const float* entry) {
          if (iy >= 0 && iy < shape.height && ix >= 0 && ix < shape.width) {
            image[(c * shape.height + iy) * shape.width + ix] += *entry;
          }
        },
        col);
    return Status::Ok();
  }

  Status AddChannelBias(int batch, int channels, int spatial, const float* bias,
                        float* y) override {
    PS_RETURN_IF_ERROR(CheckChannelSizes("AddChannelBias", batch, channels, spatial));
    for (size_t plane = 0; plane < static_cast<size_t>(batch) * channels; ++plane) {
      const float b = bias[plane % channels];
      float* p = y + plane * spatial;
      for (int s = 0; s < spatial; ++s) p[s] += b;
    }
    return Status::Ok();
  }

  Status ChannelBiasGrad(int batch, int channels, int spatial, const float* dy,
                         float* db) override {
    PS_RETURN_IF_ERROR(CheckChannelSizes("ChannelBiasGrad", batch, channels, spatial));
    // In double: the sums run over batch * spatial values, and this is the reference.
    for (int c = 0; c < channels; ++c) {
      double sum = 0;
      for (int n = 0; n < batch; ++n) {
        const float* p = dy + (static_cast<size_t>(n) * channels + c) * spatial;
        for (int s = 0; s < spatial; ++s) sum += p[s];
      }
      db[c] = static_cast<float>(sum);
    }
    return Status::Ok();
  }

  Status MaxPool2dForward(const Pool2dShape& shape, const float* x, float* y,
                          int32_t* argmax) override {
    PS_RETURN_IF_ERROR(CheckShape("MaxPool2dForward", shape));
    const PoolGeometry geometry{shape.height, shape.width, shape.window, shape.stride,
                                shape.padding};
    const int out_h = shape.OutHeight();
    const int out_w = shape.OutWidth();
    const size_t planes = static_cast<size_t>(shape.batch) * shape.channels;
    const size_t in_plane = static_cast<size_t>(shape.height) * shape.width;
    size_t o = 0;
    for (size_t p = 0; p < planes; ++p) {
      const float* image = x + p * in_plane;
      for (int oy = 0; oy < out_h; ++oy) {
        for (int ox = 0; ox < out_w; ++ox, ++o) {
          const int best = PoolArgmax(geometry, image, oy, ox);
          y[o] = image[best];
          if (argmax != nullptr) argmax[o] = best;
        }
      }
    }
    return Status::Ok();
  }

  Status MaxPool2dBackward(const Pool2dShape& shape, const float* dy, const int32_t* argmax,
                           float* dx) override {
    PS_RETURN_IF_ERROR(CheckShape("MaxPool2dBackward", shape));
    const size_t planes = static_cast<size_t>(shape.batch) * shape.channels;
    const size_t in_plane = static_cast<size_t>(shape.height) * shape.width;
    const size_t out_plane = static_cast<size_t>(shape.OutHeight()) * shape.OutWidth();
    std::fill(dx, dx + planes * in_plane, 0.0f);
    for (size_t p = 0; p < planes; ++p) {
      float* image = dx + p * in_plane;
      for (size_t o = p * out_plane; o < (p + 1) * out_plane; ++o) {
        // Out-of-plane indices (a broken REQUIRES) are skipped rather than written.
        if (argmax[o] >= 0 && static_cast<size_t>(argmax[o]) < in_plane) image[argmax[o]] += dy[o];
      }
    }
    return Status::Ok();
  }

  Status GatherRows(int rows, int width, const float* table, int table_rows, const int32_t* indices,
                    float* out) override {
    PS_RETURN_IF_ERROR(CheckSparseSizes("GatherRows", rows, width, table_rows));
    if (rows == 0 || width == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(CheckIndices("GatherRows", rows, indices, table_rows));
    const size_t w = static_cast<size_t>(width);
    for (int i = 0; i < rows; ++i) {
      std::memcpy(out + static_cast<size_t>(i) * w, table + static_cast<size_t>(indices[i]) * w,
                  w * sizeof(float));
    }
    return Status::Ok();
  }

  Status ScatterAddRows(int rows, int width, const float* src, const int32_t* indices,
                        int table_rows, float* table) override {
    PS_RETURN_IF_ERROR(CheckSparseSizes("ScatterAddRows", rows, width, table_rows));
    if (rows == 0 || width == 0) return Status::Ok();
    PS_RETURN_IF_ERROR(CheckIndices("ScatterAddRows", rows, indices, table_rows));
    const size_t w = static_cast<size_t>(width);
    // In row order, so that duplicates accumulate in a fixed order and results repeat.
    for (int i = 0; i < rows; ++i) {
      float* dst = table + static_cast<size_t>(indices[i]) * w;
      const float* s = src + static_cast<size_t>(i) * w;
      for (size_t j = 0; j < w; ++j) dst[j] += s[j];
    }
    return Status::Ok();
  }

  Status ApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                     float* table, const float* grad) override {
    PS_RETURN_IF_ERROR(CheckUpdateArgs(rule, rows, width, stride));
    if (rows == 0 || width == 0) return Status::Ok();
    const std::unique_ptr<Optimizer> optimizer = MakeOptimizer(rule);
    const size_t w = static_cast<size_t>(width);
    const size_t state = rule.StateFloats(w);
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
      float* row = table + r * static_cast<size_t>(stride);
      optimizer->Apply(std::span<float>(row, w), std::span<float>(row + w, state),
                       std::span<const float>(grad + r * w, w), lr);
    }
    return Status::Ok();
  }

  Status FlagOutOfRange(size_t n, const float* x, float limit, int32_t* flag) override {
    // An int32 accumulator and no branch, so that the loop vectorizes (gradient_check.cc).
    int32_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad |= std::fabs(x[i]) <= limit ? 0 : 1;
    if (bad != 0) *flag = 1;
    return Status::Ok();
  }

  Status ToHalf(size_t n, const float* in, uint16_t* out) override {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalfBits(in[i]);
    return Status::Ok();
  }
  Status FromHalf(size_t n, const uint16_t* in, float* out) override {
    for (size_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(in[i]);
    return Status::Ok();
  }
  Status ToBfloat16(size_t n, const float* in, uint16_t* out) override {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBfloat16Bits(in[i]);
    return Status::Ok();
  }
  Status FromBfloat16(size_t n, const uint16_t* in, float* out) override {
    for (size_t i = 0; i < n; ++i) out[i] = Bfloat16BitsToFloat(in[i]);
    return Status::Ok();
  }

 private:
  static Status CheckSparseSizes(const char* op, int rows, int width, int table_rows) {
    PS_RETURN_IF_ERROR(CheckNonNegative(op, "rows", rows));
    PS_RETURN_IF_ERROR(CheckNonNegative(op, "width", width));
    return CheckNonNegative(op, "table_rows", table_rows);
  }

  // out[i] = in[i] * scale where mask[i] is set, else 0.
  static void ApplyMask(size_t n, float scale, const uint8_t* mask, const float* in, float* out) {
    for (size_t i = 0; i < n; ++i) out[i] = mask[i] != 0 ? in[i] * scale : 0.0f;
  }

  // Calls f(c, iy, ix, entry) for every entry of one image's im2col matrix, row by row,
  // with (iy, ix) the image position it stands for (outside the image in the padding).
  template <typename Entry, typename F>
  static void ForEachColEntry(const Conv2dShape& shape, F f, Entry* col) {
    const int k = shape.kernel;
    const int out_h = shape.OutHeight();
    const int out_w = shape.OutWidth();
    for (int c = 0; c < shape.in_channels; ++c) {
      for (int ky = 0; ky < k; ++ky) {
        for (int kx = 0; kx < k; ++kx) {
          for (int oy = 0; oy < out_h; ++oy) {
            const int iy = oy * shape.stride - shape.padding + ky;
            for (int ox = 0; ox < out_w; ++ox, ++col) {
              f(static_cast<size_t>(c), iy, ox * shape.stride - shape.padding + kx, col);
            }
          }
        }
      }
    }
  }

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
