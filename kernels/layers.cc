// The backend-independent parts of kernels.h's layer ops: shape arithmetic and checks, and
// the Conv2d ops, which are sequences of the backends' primitives.
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/layer_checks.h"

namespace ps {
namespace {

// floor((size + 2 * padding - window) / stride) + 1, in 64 bits. Meaningful for a valid
// shape; 0 rather than a division by zero for a stride below 1.
int64_t OutSize(int size, int window, int stride, int padding) {
  if (stride < 1) return 0;
  return (static_cast<int64_t>(size) + 2 * static_cast<int64_t>(padding) - window) / stride + 1;
}

Status Positive(const char* what, int v) {
  if (v >= 1) return Status::Ok();
  return InvalidArgument(std::string(what) + " = " + std::to_string(v) + " must be >= 1");
}

Status NonNegative(const char* what, int v) {
  if (v >= 0) return Status::Ok();
  return InvalidArgument(std::string(what) + " = " + std::to_string(v) + " is negative");
}

Status FitsInt(const char* what, int64_t v) {
  if (v <= INT_MAX) return Status::Ok();
  return InvalidArgument(std::string(what) + " = " + std::to_string(v) + " does not fit an int");
}

// window <= size + 2 * padding, so that at least one output position exists.
Status WindowFits(const char* window_name, int window, const char* axis, int size, int padding) {
  if (window <= static_cast<int64_t>(size) + 2 * static_cast<int64_t>(padding)) {
    return Status::Ok();
  }
  return InvalidArgument(std::string(window_name) + " = " + std::to_string(window) +
                         " is larger than the padded " + axis + " " + std::to_string(size) +
                         " + 2 * " + std::to_string(padding));
}

}  // namespace

int Conv2dShape::OutHeight() const {
  return static_cast<int>(OutSize(height, kernel, stride, padding));
}
int Conv2dShape::OutWidth() const {
  return static_cast<int>(OutSize(width, kernel, stride, padding));
}
int Conv2dShape::ColRows() const { return in_channels * kernel * kernel; }

size_t Conv2dShape::WorkspaceFloats() const {
  if (kernel == 1 && stride == 1 && padding == 0) return 0;
  return static_cast<size_t>(ColRows()) * static_cast<size_t>(OutHeight()) *
         static_cast<size_t>(OutWidth());
}

Status Conv2dShape::Validate() const {
  PS_RETURN_IF_ERROR(NonNegative("batch", batch));
  PS_RETURN_IF_ERROR(Positive("in_channels", in_channels));
  PS_RETURN_IF_ERROR(Positive("height", height));
  PS_RETURN_IF_ERROR(Positive("width", width));
  PS_RETURN_IF_ERROR(Positive("out_channels", out_channels));
  PS_RETURN_IF_ERROR(Positive("kernel", kernel));
  PS_RETURN_IF_ERROR(Positive("stride", stride));
  PS_RETURN_IF_ERROR(NonNegative("padding", padding));
  PS_RETURN_IF_ERROR(FitsInt("height + 2 * padding", height + 2 * static_cast<int64_t>(padding)));
  PS_RETURN_IF_ERROR(FitsInt("width + 2 * padding", width + 2 * static_cast<int64_t>(padding)));
  PS_RETURN_IF_ERROR(WindowFits("kernel", kernel, "height", height, padding));
  PS_RETURN_IF_ERROR(WindowFits("kernel", kernel, "width", width, padding));
  const int64_t k2 = static_cast<int64_t>(kernel) * kernel;
  PS_RETURN_IF_ERROR(FitsInt("kernel * kernel", k2));
  PS_RETURN_IF_ERROR(FitsInt("in_channels * kernel * kernel", in_channels * k2));
  PS_RETURN_IF_ERROR(
      FitsInt("out_channels * in_channels * kernel * kernel", out_channels * in_channels * k2));
  PS_RETURN_IF_ERROR(FitsInt("height * width", static_cast<int64_t>(height) * width));
  // Padding can make the output larger than the input.
  const int64_t out_h = OutSize(height, kernel, stride, padding);
  const int64_t out_w = OutSize(width, kernel, stride, padding);
  PS_RETURN_IF_ERROR(FitsInt("out height", out_h));
  PS_RETURN_IF_ERROR(FitsInt("out width", out_w));
  return FitsInt("out height * out width", out_h * out_w);
}

int Pool2dShape::OutHeight() const {
  return static_cast<int>(OutSize(height, window, stride, padding));
}
int Pool2dShape::OutWidth() const {
  return static_cast<int>(OutSize(width, window, stride, padding));
}

Status Pool2dShape::Validate() const {
  PS_RETURN_IF_ERROR(NonNegative("batch", batch));
  PS_RETURN_IF_ERROR(Positive("channels", channels));
  PS_RETURN_IF_ERROR(Positive("height", height));
  PS_RETURN_IF_ERROR(Positive("width", width));
  PS_RETURN_IF_ERROR(Positive("window", window));
  PS_RETURN_IF_ERROR(Positive("stride", stride));
  PS_RETURN_IF_ERROR(NonNegative("padding", padding));
  if (padding > window / 2) {
    return InvalidArgument("padding = " + std::to_string(padding) + " is more than window / 2 = " +
                           std::to_string(window / 2) + " (a window could hold only padding)");
  }
  PS_RETURN_IF_ERROR(FitsInt("height + 2 * padding", height + 2 * static_cast<int64_t>(padding)));
  PS_RETURN_IF_ERROR(FitsInt("width + 2 * padding", width + 2 * static_cast<int64_t>(padding)));
  PS_RETURN_IF_ERROR(WindowFits("window", window, "height", height, padding));
  PS_RETURN_IF_ERROR(WindowFits("window", window, "width", width, padding));
  return FitsInt("height * width", static_cast<int64_t>(height) * width);
}

Status CheckKeepProb(const char* op, float keep_prob) {
  // Written so that NaN fails too.
  if (keep_prob > 0.0f && keep_prob <= 1.0f) return Status::Ok();
  return InvalidArgument(std::string(op) + ": keep_prob = " + std::to_string(keep_prob) +
                         " is outside (0, 1]");
}

Status CheckChannelSizes(const char* op, int batch, int channels, int spatial) {
  Status s = NonNegative("batch", batch);
  if (s.ok()) s = NonNegative("channels", channels);
  if (s.ok()) s = NonNegative("spatial", spatial);
  return s.WithContext(op);
}

Status CheckCopy2d(int rows, int cols, int src_stride, int dst_stride) {
  Status s = NonNegative("rows", rows);
  if (s.ok()) s = NonNegative("cols", cols);
  for (const auto& [name, stride] :
       {std::pair{"src_stride", src_stride}, std::pair{"dst_stride", dst_stride}}) {
    if (s.ok() && stride < cols) {
      s = InvalidArgument(std::string(name) + " = " + std::to_string(stride) +
                          " is less than cols = " + std::to_string(cols));
    }
  }
  return s.WithContext("Copy2d");
}

Status CheckUpdateArgs(const UpdateRule& rule, int rows, int width, int stride) {
  if (rows < 0 || width < 0) {
    return InvalidArgument("ApplyUpdate: rows " + std::to_string(rows) + " and width " +
                           std::to_string(width) + " must be >= 0");
  }
  const size_t need = static_cast<size_t>(width) + rule.StateFloats(static_cast<size_t>(width));
  if (stride < 0 || static_cast<size_t>(stride) < need) {
    return InvalidArgument("ApplyUpdate: stride " + std::to_string(stride) +
                           " is shorter than a row's values and state (" + std::to_string(need) +
                           " floats for width " + std::to_string(width) + ")");
  }
  return Status::Ok();
}

Status CheckShape(const char* op, const Conv2dShape& shape) {
  return shape.Validate().WithContext(op);
}
Status CheckShape(const char* op, const Pool2dShape& shape) {
  return shape.Validate().WithContext(op);
}

// ---- Conv2d: per image, one im2col matrix col (ColRows() x OH*OW) and one GEMM ----
// With w an F x ColRows() matrix and y_n, dy_n F x OH*OW matrices:
//   forward:        y_n   = w * col(x_n)
//   data gradient:  dx_n  = col2im(w^T * dy_n)
//   filter gradient: dw   = sum_n dy_n * col(x_n)^T
// A pointwise convolution's input is its own im2col matrix: no copy, no workspace.

Status Kernels::Conv2dForward(const Conv2dShape& shape, const float* x, const float* w,
                              const float* bias, float* y, float* workspace) {
  PS_RETURN_IF_ERROR(CheckShape("Conv2dForward", shape));
  const bool pointwise = shape.WorkspaceFloats() == 0;
  const int rows = shape.ColRows();
  const int pixels = shape.OutHeight() * shape.OutWidth();
  const size_t x_stride = static_cast<size_t>(shape.in_channels) * shape.height * shape.width;
  const size_t y_stride = static_cast<size_t>(shape.out_channels) * pixels;
  for (int n = 0; n < shape.batch; ++n) {
    const float* col = x + n * x_stride;
    if (!pointwise) {
      PS_RETURN_IF_ERROR(Im2Col(shape, col, workspace));
      col = workspace;
    }
    PS_RETURN_IF_ERROR(
        Gemm(false, false, shape.out_channels, pixels, rows, 1.0f, w, col, 0.0f, y + n * y_stride));
  }
  if (bias == nullptr) return Status::Ok();
  return AddChannelBias(shape.batch, shape.out_channels, pixels, bias, y);
}

Status Kernels::Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w,
                                   float* dx, float* workspace) {
  PS_RETURN_IF_ERROR(CheckShape("Conv2dBackwardData", shape));
  const bool pointwise = shape.WorkspaceFloats() == 0;
  const int rows = shape.ColRows();
  const int pixels = shape.OutHeight() * shape.OutWidth();
  const size_t x_stride = static_cast<size_t>(shape.in_channels) * shape.height * shape.width;
  const size_t y_stride = static_cast<size_t>(shape.out_channels) * pixels;
  for (int n = 0; n < shape.batch; ++n) {
    float* col = pointwise ? dx + n * x_stride : workspace;
    PS_RETURN_IF_ERROR(
        Gemm(true, false, rows, pixels, shape.out_channels, 1.0f, w, dy + n * y_stride, 0.0f, col));
    if (!pointwise) PS_RETURN_IF_ERROR(Col2Im(shape, col, dx + n * x_stride));
  }
  return Status::Ok();
}

Status Kernels::Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy,
                                     float* dw, float* db, float* workspace) {
  PS_RETURN_IF_ERROR(CheckShape("Conv2dBackwardFilter", shape));
  const bool pointwise = shape.WorkspaceFloats() == 0;
  const int rows = shape.ColRows();
  const int pixels = shape.OutHeight() * shape.OutWidth();
  const size_t x_stride = static_cast<size_t>(shape.in_channels) * shape.height * shape.width;
  const size_t y_stride = static_cast<size_t>(shape.out_channels) * pixels;
  if (shape.batch == 0) {
    // An empty sum: Gemm with k = 0 and beta = 0 writes the zeros.
    PS_RETURN_IF_ERROR(
        Gemm(false, true, shape.out_channels, rows, 0, 1.0f, nullptr, nullptr, 0.0f, dw));
  }
  for (int n = 0; n < shape.batch; ++n) {
    const float* col = x + n * x_stride;
    if (!pointwise) {
      PS_RETURN_IF_ERROR(Im2Col(shape, col, workspace));
      col = workspace;
    }
    PS_RETURN_IF_ERROR(Gemm(false, true, shape.out_channels, rows, pixels, 1.0f, dy + n * y_stride,
                            col, n == 0 ? 0.0f : 1.0f, dw));
  }
  if (db == nullptr) return Status::Ok();
  return ChannelBiasGrad(shape.batch, shape.out_channels, pixels, dy, db);
}

}  // namespace ps
