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
//
// Errors: every op returns a Status. The CUDA backend checks its arguments on the host
// before launching; what only the device can see (an out-of-range row index, a fault in a
// kernel) is returned by the next call that waits for the stream: Synchronize, CopyToHost,
// SoftmaxCrossEntropy, SigmoidCrossEntropy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/update_rule.h"

namespace ps {

// How Gemm multiplies on backends that have a choice. Inputs and outputs stay fp32 in
// every case; only the products inside the GEMM lose precision.
enum class GemmPrecision {
  kFp32,  // plain fp32 arithmetic
  // TF32 tensor cores (inputs cut to 11 significant bits, fp32 accumulation): relative
  // error about 1e-3 of the fp32 result. CUDA devices of compute capability >= 8.0; fp32 elsewhere.
  kTf32,
  // A and B rounded to bfloat16 (8 significant bits), fp32 accumulation: relative error
  // about 1e-2. CUDA devices of compute capability >= 8.0; fp32 elsewhere.
  kBf16,
};

// Per-backend options for MakeKernels. The CPU backend ignores them (it always computes in
// fp32); the CUDA backend logs a warning where the device cannot honour a setting, and
// falls back to fp32. DeviceName() names the precision in effect when it is not fp32.
struct KernelsOptions {
  // Gemm's precision; kFp32 keeps CUDA results within float rounding of the CPU's.
  GemmPrecision gemm_precision = GemmPrecision::kFp32;
};

// The geometry of a 2-D convolution over a batch of NCHW float images with square K x K
// filters: input x is batch x in_channels x height x width, filters w are out_channels x
// in_channels x K x K (row-major, so w is an out_channels x (in_channels*K*K) matrix),
// output y is batch x out_channels x OutHeight() x OutWidth(). Padding adds `padding` zeros
// on each side of both image axes.
struct Conv2dShape {
  int batch = 1;         // N; 0 is allowed (then dw and db are zeros, the empty sums)
  int in_channels = 1;   // C
  int height = 1;        // H
  int width = 1;         // W
  int out_channels = 1;  // F
  int kernel = 1;        // K
  int stride = 1;
  int padding = 0;

  // floor((H + 2 * padding - K) / stride) + 1, and the same over W. These three and
  // WorkspaceFloats() are meaningful for a shape that Validate() accepts.
  int OutHeight() const;
  int OutWidth() const;
  // Rows of one image's im2col matrix: C * K * K.
  int ColRows() const;
  // Floats of the workspace the Conv2d ops need: one image's im2col matrix, ColRows() x
  // OutHeight() * OutWidth(). 0 for a pointwise convolution (K = 1, stride 1, padding 0),
  // whose input already is its im2col matrix.
  size_t WorkspaceFloats() const;
  // InvalidArgument naming the field unless: batch >= 0, C, H, W, F, K, stride >= 1,
  // padding >= 0, K <= H + 2 * padding and K <= W + 2 * padding, and the GEMM dimensions
  // (C * K * K, OutHeight() * OutWidth(), H * W) and H + 2 * padding, W + 2 * padding fit
  // an int. Every op that takes a Conv2dShape checks it first.
  Status Validate() const;
};

// The geometry of 2-D max pooling over NCHW float images with square window x window
// windows: x is batch x channels x height x width, y is batch x channels x OutHeight() x
// OutWidth(). Padded positions never win (as if they held -infinity).
struct Pool2dShape {
  int batch = 1;  // 0 is allowed (nothing is read or written)
  int channels = 1;
  int height = 1;
  int width = 1;
  int window = 2;
  int stride = 2;
  int padding = 0;

  // floor((H + 2 * padding - window) / stride) + 1, and the same over W; meaningful for a
  // shape that Validate() accepts.
  int OutHeight() const;
  int OutWidth() const;
  // InvalidArgument naming the field unless: batch >= 0, channels, H, W, window, stride >= 1,
  // 0 <= padding <= window / 2 (so that every window holds at least one real pixel),
  // window <= H + 2 * padding and window <= W + 2 * padding, and H * W, H + 2 * padding and
  // W + 2 * padding fit an int. Every op that takes a Pool2dShape checks it first.
  Status Validate() const;
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // Human-readable device, e.g. "cpu: 2 threads", "NVIDIA H200 (cuda:0)" or, with a
  // reduced Gemm precision in effect, "NVIDIA H200 (cuda:0, gemm tf32)".
  virtual std::string DeviceName() const = 0;
  virtual bool IsCuda() const = 0;

  // ---- memory ----
  virtual Result<void*> AllocBytes(size_t bytes) = 0;
  virtual void FreeBytes(void* p) = 0;
  // Host memory for staging transfers: page-locked (cudaHostAlloc) on CUDA, so that copies
  // from and to it are direct DMA and CopyToDevice from it is asynchronous; an ordinary
  // 64-byte aligned allocation on the CPU. 0 bytes gives nullptr. Free with FreeHostPinned
  // of the same object, which first waits for the copies queued so far. Pinning is costly
  // (milliseconds per call, and it takes memory from the OS for good): allocate staging
  // buffers once and reuse them.
  virtual Result<void*> AllocHostPinned(size_t bytes) = 0;
  virtual void FreeHostPinned(void* p) = 0;
  // Queues a host-to-device copy. From ordinary (pageable) host memory the data is taken
  // before the call returns, so host_src may be reused at once. From AllocHostPinned
  // memory (or other page-locked memory) the copy runs asynchronously on the backend's
  // stream: host_src must stay unchanged until the next call that waits for the stream
  // (Synchronize, CopyToHost, SoftmaxCrossEntropy, SigmoidCrossEntropy) returns.
  virtual Status CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  // Returns when the data is on the host (after every op issued before it).
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
  // dst[i * dst_stride + j] = src[i * src_stride + j] for a rows x cols block, strides in
  // floats (>= cols; InvalidArgument otherwise). Concatenation along columns and its
  // backward pass: a part of width w goes to (or comes from) column offset o of a
  // rows x total matrix with Copy2d(rows, w, part, w, out + o, total). The two blocks must
  // not overlap.
  virtual Status Copy2d(int rows, int cols, const float* src, int src_stride, float* dst,
                        int dst_stride) = 0;
  // Sigmoid cross-entropy over n independent logits with binary int32 labels (0 or 1):
  // loss_i = log(1 + exp(x_i)) - label_i * x_i, computed in the form that neither overflows
  // nor loses the small values, max(x, 0) - x * label + log1p(exp(-|x|)). Writes
  // grad_logits = (sigmoid(x) - label) * grad_scale (may be null to skip), into
  // *host_loss_sum the summed loss and into *host_correct the number of i where
  // (x_i > 0) == (label_i == 1) (both host pointers, valid when the call returns; so the
  // call waits for the stream, like SoftmaxCrossEntropy). A label other than 0 or 1 is an
  // InvalidArgument error naming it; the CPU backend then leaves grad_logits untouched.
  virtual Status SigmoidCrossEntropy(int n, const float* logits, const int32_t* labels,
                                     float grad_scale, float* grad_logits, double* host_loss_sum,
                                     int64_t* host_correct) = 0;

  // ---- dropout (inverted: kept values are scaled by 1 / keep_prob) ----
  // The mask is made on the backend from a counter-based hash of (seed, i), integer
  // arithmetic only: every backend makes the same mask for the same seed, n and keep_prob,
  // and no random state lives between calls. Use a new seed per step (a base seed plus the
  // step number will do). keep_prob must lie in (0, 1]; 1 keeps everything.
  //
  // mask[i] = 1 with probability keep_prob, else 0, for i in [0, n).
  virtual Status DropoutMask(size_t n, float keep_prob, uint64_t seed, uint8_t* mask) = 0;
  // y[i] = x[i] * mask[i] / keep_prob; x == y (in place) is allowed.
  virtual Status DropoutForward(size_t n, float keep_prob, const uint8_t* mask, const float* x,
                                float* y) = 0;
  // dx[i] = dy[i] * mask[i] / keep_prob, with the mask of the forward pass; dy == dx is allowed.
  virtual Status DropoutBackward(size_t n, float keep_prob, const uint8_t* mask, const float* dy,
                                 float* dx) = 0;

  // ---- convolution (im2col + GEMM, as Caffe does it) ----
  // The three Conv2d ops are built from the primitives after them (Im2Col, Col2Im, Gemm,
  // AddChannelBias, ChannelBiasGrad), image by image, the same calls on every backend.
  // `workspace` holds shape.WorkspaceFloats() floats, allocated once by the caller
  // (AllocBytes) and reusable across calls and layers; no op allocates. It may be null when
  // WorkspaceFloats() is 0. Outputs are overwritten, never accumulated into. The shape is
  // checked first (Conv2dShape::Validate); a bad one is an InvalidArgument error.
  //
  // y = conv(x, w) + bias, with bias[out_channels] added to every pixel of its channel
  // (bias may be null: no bias).
  Status Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                       float* y, float* workspace);
  // dx = the gradient of the loss with respect to x, given dy (shaped like y) and w.
  Status Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx,
                            float* workspace);
  // dw (shaped like w) and db[out_channels] (may be null to skip) = the gradients of the
  // loss with respect to w and the bias, summed over the batch, given x and dy.
  Status Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                              float* db, float* workspace);

  // One image (C x H x W, shape.batch and shape.out_channels ignored) to its im2col matrix,
  // ColRows() x OutHeight() * OutWidth(): col[(c * K + ky) * K + kx, oy * OW + ox] =
  // image[c, oy * stride - padding + ky, ox * stride - padding + kx], 0 in the padding.
  virtual Status Im2Col(const Conv2dShape& shape, const float* image, float* col) = 0;
  // The adjoint of Im2Col: image (overwritten) = the sum, for each pixel, of the col
  // entries Im2Col would have copied it to, added in the order of col's rows.
  virtual Status Col2Im(const Conv2dShape& shape, const float* col, float* image) = 0;
  // y[n, c, s] += bias[c] for a batch x channels x spatial array (NCHW with spatial = H * W).
  virtual Status AddChannelBias(int batch, int channels, int spatial, const float* bias,
                                float* y) = 0;
  // db[c] = sum over n and s of dy[n, c, s] (overwrites db; zeros when batch or spatial is 0).
  virtual Status ChannelBiasGrad(int batch, int channels, int spatial, const float* dy,
                                 float* db) = 0;

  // ---- max pooling ----
  // y[n, c, oy, ox] = the maximum of x over the window at (oy * stride - padding,
  // ox * stride - padding), and argmax (may be null to skip; batch x channels x OH x OW) its
  // position in the image plane, iy * W + ix. Ties go to the first in row-major order; a
  // NaN in the window wins (the first one), so that a diverging run shows in y.
  virtual Status MaxPool2dForward(const Pool2dShape& shape, const float* x, float* y,
                                  int32_t* argmax) = 0;
  // dx (overwritten) = dy routed back through argmax: each pixel gets the sum of the dy of
  // the outputs whose argmax it is, added in the outputs' row-major order. REQUIRES: argmax
  // as MaxPool2dForward wrote it for this shape.
  virtual Status MaxPool2dBackward(const Pool2dShape& shape, const float* dy, const int32_t* argmax,
                                   float* dx) = 0;

  // ---- sparse embedding rows ----
  // `table` is a table_rows x width matrix, `indices` holds `rows` row numbers (device
  // memory, like the matrices). With rows == 0 or width == 0 nothing is read or written.
  // An index outside [0, table_rows) is an InvalidArgument error naming it: the CPU
  // backend checks every index before writing anything; the CUDA backend skips that row's
  // copy or update (the others are done) and returns the error from the next call that
  // waits for the stream (see Errors above), naming the bad index of the lowest row.
  //
  // out[i, :] = table[indices[i], :] for i in [0, rows); out is rows x width.
  virtual Status GatherRows(int rows, int width, const float* table, int table_rows,
                            const int32_t* indices, float* out) = 0;
  // table[indices[i], :] += src[i, :] for i in [0, rows); src is rows x width. Duplicate
  // indices accumulate. On CUDA the additions to a row are atomic and their order is not
  // fixed, so sums over duplicates may differ in the last bits from run to run.
  virtual Status ScatterAddRows(int rows, int width, const float* src, const int32_t* indices,
                                int table_rows, float* table) = 0;

  // ---- the servers' update, on a model kept in the backend's memory ----
  // One step of `rule` (common/update_rule.h) on `rows` rows stored as a server stores
  // them: row r at table + r * stride holds `width` values, then rule.StateFloats(width)
  // floats of state; row r's gradient is grad[r * width, (r + 1) * width). `lr` is the
  // step's learning rate. The CPU backend runs the rule's Optimizer (common/optimizer.h,
  // the servers' own code), so its rows equal a server's bit for bit. The CUDA backend runs
  // the same formulas, a block per row, with the row's clip norm and Adam's bias
  // corrections in double as there: within float rounding of the CPU's (the device fuses
  // multiply-adds, and its sqrt and pow round differently). InvalidArgument unless
  // rows, width >= 0 and stride >= width + rule.StateFloats(width).
  virtual Status ApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                             float* table, const float* grad) = 0;

  // Sets *flag (one int32 in the backend's memory) to 1 when any of x[0, n) is NaN, +-Inf
  // or beyond `limit` in magnitude; never clears it. The gradient check of a model kept in
  // device memory (common/gradient_check.h): flag each table of a step, then read one int.
  virtual Status FlagOutOfRange(size_t n, const float* x, float limit, int32_t* flag) = 0;

  // ---- precision conversion (gradients and parameters on the wire) ----
  // n elements each, in the backend's memory space. Float to half (IEEE binary16) and to
  // bfloat16 round to nearest, ties to even; values beyond the half range become +-inf,
  // values too small for a half subnormal become +-0. NaN stays NaN, as the quiet NaN with
  // the input's sign and no payload (half 0x7e00, bfloat16 0x7fc0, float 0x7fc00000, sign
  // bit aside), so that every backend gives the same bits. Widening is exact otherwise.
  virtual Status ToHalf(size_t n, const float* in, uint16_t* out) = 0;
  virtual Status FromHalf(size_t n, const uint16_t* in, float* out) = 0;
  virtual Status ToBfloat16(size_t n, const float* in, uint16_t* out) = 0;
  virtual Status FromBfloat16(size_t n, const uint16_t* in, float* out) = 0;
};

// device: "cpu", "cuda" (first GPU), "cuda:N", or "auto" (the first GPU when one is
// visible, else the CPU). A CUDA device where the build has no CUDA support or the
// machine has no such GPU is an error naming what was asked and found; there is no silent
// fallback to the CPU. "auto" with a visible GPU that fails to set up is that error too.
Result<std::unique_ptr<Kernels>> MakeKernels(std::string_view device,
                                             const KernelsOptions& options = KernelsOptions());

// Number of CUDA devices visible (0 when built without CUDA or no driver).
int CudaDeviceCount();

// Peak DRAM bandwidth of CUDA device `device` in bytes per second, from its memory clock
// and bus width (2 transfers per clock), for reading benchmark figures as a fraction of
// it. FailedPrecondition without CUDA support or such a device; Unavailable where the
// runtime does not report the clock or the width.
Result<double> CudaPeakMemoryBandwidth(int device);

// Sets flush-to-zero and denormals-are-zero for the calling thread: denormal floats can
// halve a CPU training loop's speed.
void EnableFlushToZero();

// The two memory spaces a backend allocates in.
enum class MemorySpace { kDevice, kPinnedHost };

// An owning, typed buffer from a backend: in its device memory (AllocBytes) or pinned host
// memory for staging transfers (AllocHostPinned). Use the aliases below.
template <typename T, MemorySpace kSpace>
class KernelsBuffer {
 public:
  KernelsBuffer() = default;
  KernelsBuffer(const KernelsBuffer&) = delete;
  KernelsBuffer& operator=(const KernelsBuffer&) = delete;
  KernelsBuffer(KernelsBuffer&& o) noexcept { *this = std::move(o); }
  KernelsBuffer& operator=(KernelsBuffer&& o) noexcept {
    Reset();
    k_ = o.k_;
    p_ = o.p_;
    n_ = o.n_;
    o.k_ = nullptr;
    o.p_ = nullptr;
    o.n_ = 0;
    return *this;
  }
  ~KernelsBuffer() { Reset(); }

  static Result<KernelsBuffer> Make(Kernels* k, size_t n) {
    KernelsBuffer b;
    b.k_ = k;
    b.n_ = n;
    if (n == 0) return b;
    Result<void*> p = kSpace == MemorySpace::kDevice ? k->AllocBytes(n * sizeof(T))
                                                     : k->AllocHostPinned(n * sizeof(T));
    if (!p.ok()) return p.status();
    b.p_ = static_cast<T*>(p.value());
    return b;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // Host buffers only: the device's memory is not addressable from the host.
  T& operator[](size_t i) const {
    static_assert(kSpace == MemorySpace::kPinnedHost, "device memory is not host-addressable");
    return p_[i];
  }
  void Reset() {
    if (k_ != nullptr && p_ != nullptr) {
      if (kSpace == MemorySpace::kDevice) {
        k_->FreeBytes(p_);
      } else {
        k_->FreeHostPinned(p_);
      }
    }
    p_ = nullptr;
    n_ = 0;
  }

 private:
  Kernels* k_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

template <typename T>
using DeviceBuffer = KernelsBuffer<T, MemorySpace::kDevice>;
template <typename T>
using PinnedHostBuffer = KernelsBuffer<T, MemorySpace::kPinnedHost>;

}  // namespace ps
