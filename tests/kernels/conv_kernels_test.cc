// The CPU backend's layer ops (convolution, max pooling, channel bias, sigmoid
// cross-entropy, dropout) against naive double-precision references and numerical
// gradients, on small shapes with padding, strides, non-square images and odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernels.h"

namespace ps {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class ConvKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Kernels>> k = MakeKernels("cpu");
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    k_ = std::move(k).value();
  }
  std::unique_ptr<Kernels> k_;
  std::mt19937 rng_{2024};
};

Conv2dShape Conv(int n, int c, int h, int w, int f, int k, int stride, int pad) {
  Conv2dShape s;
  s.batch = n;
  s.in_channels = c;
  s.height = h;
  s.width = w;
  s.out_channels = f;
  s.kernel = k;
  s.stride = stride;
  s.padding = pad;
  return s;
}

std::string Describe(const Conv2dShape& s) {
  return "N=" + std::to_string(s.batch) + " C=" + std::to_string(s.in_channels) +
         " H=" + std::to_string(s.height) + " W=" + std::to_string(s.width) +
         " F=" + std::to_string(s.out_channels) + " K=" + std::to_string(s.kernel) +
         " stride=" + std::to_string(s.stride) + " pad=" + std::to_string(s.padding);
}

// Padding 0 and 1, stride 1 and 2, non-square images, 1 and 3 input channels, a pointwise
// convolution (no workspace), a kernel as large as the padded image, an empty batch.
const std::vector<Conv2dShape> kConvShapes = {
    Conv(2, 1, 5, 7, 3, 3, 1, 0), Conv(2, 3, 6, 5, 4, 3, 1, 1), Conv(1, 3, 7, 9, 2, 3, 2, 1),
    Conv(3, 1, 8, 6, 2, 2, 2, 0), Conv(2, 3, 9, 7, 5, 3, 2, 0), Conv(2, 3, 5, 4, 4, 1, 1, 0),
    Conv(1, 2, 3, 4, 3, 5, 1, 2), Conv(1, 1, 1, 1, 1, 1, 1, 0), Conv(2, 1, 4, 5, 2, 1, 2, 1),
    Conv(0, 3, 5, 5, 2, 3, 1, 1)};

size_t InSize(const Conv2dShape& s) {
  return static_cast<size_t>(s.batch) * s.in_channels * s.height * s.width;
}
size_t OutSize(const Conv2dShape& s) {
  return static_cast<size_t>(s.batch) * s.out_channels * s.OutHeight() * s.OutWidth();
}
size_t FilterSize(const Conv2dShape& s) {
  return static_cast<size_t>(s.out_channels) * s.in_channels * s.kernel * s.kernel;
}

// The direct convolution in double: y[n, f, oy, ox] = bias[f] + sum over c, ky, kx of
// w[f, c, ky, kx] * x[n, c, oy * stride - pad + ky, ox * stride - pad + kx] (0 outside).
template <typename T>
std::vector<double> DirectConv(const Conv2dShape& s, const std::vector<T>& x,
                               const std::vector<T>& w, const std::vector<T>& bias) {
  const int oh = s.OutHeight(), ow = s.OutWidth(), k = s.kernel;
  std::vector<double> y(OutSize(s));
  size_t o = 0;
  for (int n = 0; n < s.batch; ++n) {
    for (int f = 0; f < s.out_channels; ++f) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox, ++o) {
          double sum = bias.empty() ? 0.0 : static_cast<double>(bias[f]);
          for (int c = 0; c < s.in_channels; ++c) {
            for (int ky = 0; ky < k; ++ky) {
              for (int kx = 0; kx < k; ++kx) {
                const int iy = oy * s.stride - s.padding + ky;
                const int ix = ox * s.stride - s.padding + kx;
                if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
                sum += static_cast<double>(w[((f * s.in_channels + c) * k + ky) * k + kx]) *
                       static_cast<double>(
                           x[((n * s.in_channels + c) * s.height + iy) * s.width + ix]);
              }
            }
          }
          y[o] = sum;
        }
      }
    }
  }
  return y;
}

// A workspace of shape.WorkspaceFloats() floats (null when 0) from the backend.
DeviceBuffer<float> Workspace(Kernels* k, const Conv2dShape& s) {
  Result<DeviceBuffer<float>> ws = DeviceBuffer<float>::Make(k, s.WorkspaceFloats());
  EXPECT_TRUE(ws.ok()) << ws.status().ToString();
  return ws.ok() ? std::move(ws).value() : DeviceBuffer<float>();
}

TEST_F(ConvKernelsTest, ShapeArithmetic) {
  const Conv2dShape s = Conv(2, 3, 7, 9, 4, 3, 2, 1);
  EXPECT_EQ(s.OutHeight(), 4);  // floor((7 + 2 - 3) / 2) + 1
  EXPECT_EQ(s.OutWidth(), 5);   // floor((9 + 2 - 3) / 2) + 1
  EXPECT_EQ(s.ColRows(), 27);
  EXPECT_EQ(s.WorkspaceFloats(), 27u * 4 * 5);
  EXPECT_EQ(Conv(2, 3, 7, 9, 4, 1, 1, 0).WorkspaceFloats(), 0u);  // pointwise
  EXPECT_EQ(Conv(2, 3, 7, 9, 4, 1, 2, 0).WorkspaceFloats(), 3u * 4 * 5);
  Pool2dShape p;
  p.height = 7;
  p.width = 6;
  EXPECT_EQ(p.OutHeight(), 3);  // the last odd row falls out
  EXPECT_EQ(p.OutWidth(), 3);
}

TEST_F(ConvKernelsTest, BadShapesAreRejectedNamingTheField) {
  struct Case {
    Conv2dShape shape;
    const char* field;
  };
  const std::vector<Case> cases = {{Conv(-1, 1, 4, 4, 1, 3, 1, 0), "batch"},
                                   {Conv(1, 0, 4, 4, 1, 3, 1, 0), "in_channels"},
                                   {Conv(1, 1, 4, 4, 0, 3, 1, 0), "out_channels"},
                                   {Conv(1, 1, 4, 4, 1, 3, 0, 0), "stride"},
                                   {Conv(1, 1, 4, 4, 1, 3, 1, -1), "padding"},
                                   {Conv(1, 1, 2, 4, 1, 3, 1, 0), "kernel = 3"},
                                   {Conv(1, 1, 4, 4, 1, 3, 1, INT32_MAX / 2 + 1), "height + 2"},
                                   {Conv(1, 1, 70000, 70000, 1, 3, 1, 0), "height * width"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c.shape));
    Status s = k_->Conv2dForward(c.shape, nullptr, nullptr, nullptr, nullptr, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("Conv2dForward"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_EQ(k_->Im2Col(c.shape, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  }
  Pool2dShape p;
  p.window = 2;
  p.padding = 2;  // more than window / 2: a window could hold only padding
  p.height = p.width = 8;
  Status s = k_->MaxPool2dForward(p, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("padding"), std::string::npos) << s.message();
}

TEST_F(ConvKernelsTest, ForwardMatchesDirectConvolution) {
  for (const Conv2dShape& s : kConvShapes) {
    SCOPED_TRACE(Describe(s));
    const std::vector<float> x = RandomVector(InSize(s), rng_);
    const std::vector<float> w = RandomVector(FilterSize(s), rng_);
    const std::vector<float> bias = RandomVector(s.out_channels, rng_);
    DeviceBuffer<float> ws = Workspace(k_.get(), s);
    for (bool with_bias : {false, true}) {
      std::vector<float> y(OutSize(s), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(k_->Conv2dForward(s, x.data(), w.data(), with_bias ? bias.data() : nullptr,
                                    y.data(), ws.get())
                      .ok());
      const std::vector<double> ref = DirectConv(s, x, w, with_bias ? bias : std::vector<float>());
      // Each output sums ColRows() products of values in [-1, 1].
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], ref[i], 1e-6 * (s.ColRows() + 1)) << "output " << i;
      }
    }
  }
}

// L = sum_i y_i * r_i for a fixed random r, so dL/dy = r. L is linear in x, w and the bias,
// so central differences in double are exact up to rounding: the kernels' float gradients
// must match them to float accuracy.
double Loss(const Conv2dShape& s, const std::vector<double>& x, const std::vector<double>& w,
            const std::vector<double>& bias, const std::vector<float>& r) {
  const std::vector<double> y = DirectConv(s, x, w, bias);
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) loss += y[i] * r[i];
  return loss;
}

// dL/dv[i] by central differences, for every i; `v` is one of the three inputs of `loss`.
template <typename LossFn>
std::vector<double> NumericalGradient(std::vector<double>* v, LossFn loss) {
  constexpr double kStep = 1e-3;
  std::vector<double> grad(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const double saved = (*v)[i];
    (*v)[i] = saved + kStep;
    const double plus = loss();
    (*v)[i] = saved - kStep;
    const double minus = loss();
    (*v)[i] = saved;
    grad[i] = (plus - minus) / (2 * kStep);
  }
  return grad;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST_F(ConvKernelsTest, BackwardMatchesNumericalGradient) {
  for (const Conv2dShape& s : kConvShapes) {
    SCOPED_TRACE(Describe(s));
    const std::vector<float> x = RandomVector(InSize(s), rng_);
    const std::vector<float> w = RandomVector(FilterSize(s), rng_);
    const std::vector<float> r = RandomVector(OutSize(s), rng_);  // dy
    DeviceBuffer<float> ws = Workspace(k_.get(), s);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Outputs start as NaN: every element must be overwritten.
    std::vector<float> dx(x.size(), nan), dw(w.size(), nan), db(s.out_channels, nan);
    ASSERT_TRUE(k_->Conv2dBackwardData(s, r.data(), w.data(), dx.data(), ws.get()).ok());
    ASSERT_TRUE(
        k_->Conv2dBackwardFilter(s, x.data(), r.data(), dw.data(), db.data(), ws.get()).ok());

    std::vector<double> xd = ToDouble(x), wd = ToDouble(w), bd(s.out_channels, 0.25);
    auto loss = [&] { return Loss(s, xd, wd, bd, r); };
    const std::vector<double> num_dx = NumericalGradient(&xd, loss);
    const std::vector<double> num_dw = NumericalGradient(&wd, loss);
    const std::vector<double> num_db = NumericalGradient(&bd, loss);
    // A dx entry sums at most F * K * K terms; a dw or db entry N * OH * OW.
    const double tol_x = 1e-5 * (s.out_channels * s.kernel * s.kernel + 1);
    const double tol_w = 1e-5 * (s.batch * s.OutHeight() * s.OutWidth() + 1);
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx[i], num_dx[i], tol_x) << "dx " << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(dw[i], num_dw[i], tol_w) << "dw " << i;
    for (size_t i = 0; i < db.size(); ++i) ASSERT_NEAR(db[i], num_db[i], tol_w) << "db " << i;
  }
}

// Col2Im is Im2Col's adjoint: <Im2Col(x), c> == <x, Col2Im(c)> for any x and c.
TEST_F(ConvKernelsTest, Col2ImIsTheAdjointOfIm2Col) {
  for (Conv2dShape s : kConvShapes) {
    s.batch = 1;
    SCOPED_TRACE(Describe(s));
    const size_t col_size = static_cast<size_t>(s.ColRows()) * s.OutHeight() * s.OutWidth();
    const std::vector<float> x = RandomVector(InSize(s), rng_);
    const std::vector<float> c = RandomVector(col_size, rng_);
    std::vector<float> col(col_size), image(x.size(), 7.0f);
    ASSERT_TRUE(k_->Im2Col(s, x.data(), col.data()).ok());
    ASSERT_TRUE(k_->Col2Im(s, c.data(), image.data()).ok());
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < col_size; ++i) lhs += static_cast<double>(col[i]) * c[i];
    for (size_t i = 0; i < x.size(); ++i) rhs += static_cast<double>(x[i]) * image[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * static_cast<double>(col_size));
  }
}

TEST_F(ConvKernelsTest, Im2ColKnownValues) {
  // One 2 x 3 channel, K = 2, stride 1, padding 0: 2 x 2 outputs, 4 rows.
  const Conv2dShape s = Conv(1, 1, 2, 3, 1, 2, 1, 0);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  std::vector<float> col(4 * 2);
  ASSERT_TRUE(k_->Im2Col(s, x.data(), col.data()).ok());
  EXPECT_EQ(col, (std::vector<float>{1, 2, 2, 3, 4, 5, 5, 6}));
  // With padding 1 and stride 2 the corners read zeros.
  const Conv2dShape p = Conv(1, 1, 2, 3, 1, 2, 2, 1);
  ASSERT_EQ(p.OutHeight() * p.OutWidth(), 4);
  col.assign(4 * 4, -1.0f);
  ASSERT_TRUE(k_->Im2Col(p, x.data(), col.data()).ok());
  // Rows (ky, kx) = (0,0), (0,1), (1,0), (1,1); windows start at (-1,-1), (-1,1), (1,-1),
  // (1,1).
  EXPECT_EQ(col, (std::vector<float>{0, 0, 0, 5, 0, 0, 4, 6, 0, 2, 0, 0, 1, 3, 0, 0}));
}

TEST_F(ConvKernelsTest, ChannelBiasAndItsGradient) {
  for (const auto& [n, c, sp] : std::vector<std::tuple<int, int, int>>{
           {2, 3, 5}, {1, 1, 1}, {4, 7, 33}, {0, 3, 4}, {3, 2, 0}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << c << "x" << sp);
    const size_t size = static_cast<size_t>(n) * c * sp;
    const std::vector<float> y0 = RandomVector(size, rng_), bias = RandomVector(c, rng_);
    std::vector<float> y = y0;
    ASSERT_TRUE(k_->AddChannelBias(n, c, sp, bias.data(), y.data()).ok());
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(y[i], y0[i] + bias[(i / sp) % c]) << i;
    std::vector<float> db(c, 99.0f);
    ASSERT_TRUE(k_->ChannelBiasGrad(n, c, sp, y0.data(), db.data()).ok());
    for (int j = 0; j < c; ++j) {
      double sum = 0;
      for (size_t i = 0; i < size; ++i) sum += (static_cast<int>(i / sp) % c == j) ? y0[i] : 0.0;
      EXPECT_NEAR(db[j], sum, 1e-6) << "channel " << j;
    }
  }
  EXPECT_EQ(k_->AddChannelBias(1, -2, 3, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(k_->ChannelBiasGrad(-1, 2, 3, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
}

// ---- Copy2d: concatenation along columns ----

TEST_F(ConvKernelsTest, Copy2dConcatenatesAndSplitsColumns) {
  // Two parts, 3 x 2 and 3 x 3, side by side in a 3 x 5 matrix, and back.
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<float> out(15, -1.0f);
  ASSERT_TRUE(k_->Copy2d(3, 2, a.data(), 2, out.data(), 5).ok());
  ASSERT_TRUE(k_->Copy2d(3, 3, b.data(), 3, out.data() + 2, 5).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 7, 8, 9, 3, 4, 10, 11, 12, 5, 6, 13, 14, 15}));
  std::vector<float> a2(6), b2(9);
  ASSERT_TRUE(k_->Copy2d(3, 2, out.data(), 5, a2.data(), 2).ok());
  ASSERT_TRUE(k_->Copy2d(3, 3, out.data() + 2, 5, b2.data(), 3).ok());
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
  ASSERT_TRUE(k_->Copy2d(0, 3, nullptr, 3, nullptr, 3).ok());
  ASSERT_TRUE(k_->Copy2d(3, 0, nullptr, 0, nullptr, 0).ok());
  Status s = k_->Copy2d(3, 3, b.data(), 2, out.data(), 5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("src_stride = 2"), std::string::npos) << s.message();
  EXPECT_EQ(k_->Copy2d(-1, 3, nullptr, 3, nullptr, 3).code(), StatusCode::kInvalidArgument);
}

// ---- max pooling ----

Pool2dShape Pool(int n, int c, int h, int w, int window, int stride, int pad) {
  Pool2dShape s;
  s.batch = n;
  s.channels = c;
  s.height = h;
  s.width = w;
  s.window = window;
  s.stride = stride;
  s.padding = pad;
  return s;
}

// 2 x 2 stride 2 (even and odd sizes), overlapping 3 x 3 windows at strides 1 and 2 with
// padding 1, non-square images, a window as large as the image, an empty batch.
const std::vector<Pool2dShape> kPoolShapes = {Pool(2, 3, 6, 8, 2, 2, 0), Pool(1, 2, 7, 5, 2, 2, 0),
                                              Pool(2, 1, 5, 6, 3, 2, 1), Pool(1, 2, 4, 7, 3, 1, 1),
                                              Pool(1, 1, 3, 3, 3, 1, 0), Pool(3, 2, 1, 9, 1, 1, 0),
                                              Pool(0, 2, 4, 4, 2, 2, 0)};

// The naive reference: for each output, scan the window (skipping positions outside the
// image) for the first maximum in row-major order.
void ReferencePool(const Pool2dShape& s, const std::vector<float>& x, std::vector<float>* y,
                   std::vector<int32_t>* argmax) {
  const int oh = s.OutHeight(), ow = s.OutWidth();
  y->assign(static_cast<size_t>(s.batch) * s.channels * oh * ow, 0.0f);
  argmax->assign(y->size(), -1);
  size_t o = 0;
  for (int plane = 0; plane < s.batch * s.channels; ++plane) {
    const float* image = x.data() + static_cast<size_t>(plane) * s.height * s.width;
    for (int oy = 0; oy < oh; ++oy) {
      for (int ox = 0; ox < ow; ++ox, ++o) {
        for (int dy = 0; dy < s.window; ++dy) {
          for (int dx = 0; dx < s.window; ++dx) {
            const int iy = oy * s.stride - s.padding + dy;
            const int ix = ox * s.stride - s.padding + dx;
            if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
            const int i = iy * s.width + ix;
            if ((*argmax)[o] < 0 || image[i] > image[(*argmax)[o]]) (*argmax)[o] = i;
          }
        }
        (*y)[o] = image[(*argmax)[o]];
      }
    }
  }
}

size_t PoolInSize(const Pool2dShape& s) {
  return static_cast<size_t>(s.batch) * s.channels * s.height * s.width;
}

TEST_F(ConvKernelsTest, MaxPoolMatchesReferenceWithTies) {
  std::uniform_int_distribution<int> small(0, 2);  // many ties within each window
  for (const Pool2dShape& s : kPoolShapes) {
    for (bool ties : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.batch << " C=" << s.channels << " H=" << s.height
                                      << " W=" << s.width << " window=" << s.window << " stride="
                                      << s.stride << " pad=" << s.padding << " ties=" << ties);
      std::vector<float> x = RandomVector(PoolInSize(s), rng_);
      if (ties) {
        for (float& v : x) v = static_cast<float>(small(rng_));
      }
      std::vector<float> y_ref;
      std::vector<int32_t> arg_ref;
      ReferencePool(s, x, &y_ref, &arg_ref);
      std::vector<float> y(y_ref.size(), -5.0f);
      std::vector<int32_t> arg(y_ref.size(), -7);
      ASSERT_TRUE(k_->MaxPool2dForward(s, x.data(), y.data(), arg.data()).ok());
      EXPECT_EQ(y, y_ref);
      EXPECT_EQ(arg, arg_ref);
      // Without argmax the values are the same.
      std::vector<float> y2(y_ref.size());
      ASSERT_TRUE(k_->MaxPool2dForward(s, x.data(), y2.data(), nullptr).ok());
      EXPECT_EQ(y2, y_ref);

      // Backward: each input gets the sum of the dy of the outputs it won, in output order.
      const std::vector<float> dy = RandomVector(y.size(), rng_);
      std::vector<float> dx_ref(x.size(), 0.0f);
      const size_t out_plane = static_cast<size_t>(s.OutHeight()) * s.OutWidth();
      for (size_t o = 0; o < dy.size(); ++o) {
        dx_ref[(o / out_plane) * s.height * s.width + arg_ref[o]] += dy[o];
      }
      std::vector<float> dx(x.size(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(k_->MaxPool2dBackward(s, dy.data(), arg.data(), dx.data()).ok());
      EXPECT_EQ(dx, dx_ref);
    }
  }
}

TEST_F(ConvKernelsTest, MaxPoolKnownValuesAndNan) {
  // 4 x 4, 2 x 2 windows: ties go to the first in row-major order.
  const Pool2dShape s = Pool(1, 1, 4, 4, 2, 2, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {1,  3,  0, 0,    //
                          3,  2,  0, 0,    //
                          -1, -2, 5, nan,  //
                          -3, -1, 9, 2};
  std::vector<float> y(4);
  std::vector<int32_t> arg(4);
  ASSERT_TRUE(k_->MaxPool2dForward(s, x.data(), y.data(), arg.data()).ok());
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(arg[0], 1);  // 3 at (0, 1) before 3 at (1, 0)
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(arg[1], 2);
  EXPECT_EQ(y[2], -1.0f);
  EXPECT_EQ(arg[2], 8);
  EXPECT_TRUE(std::isnan(y[3]));  // a NaN wins over 9: a diverging run shows
  EXPECT_EQ(arg[3], 11);
  // Overlapping windows (stride 1) that pick the same input add their gradients.
  const Pool2dShape o = Pool(1, 1, 2, 3, 2, 1, 0);
  const std::vector<float> x2 = {0, 9, 0, 0, 0, 0};
  std::vector<float> y2(2), dx(6);
  std::vector<int32_t> arg2(2);
  ASSERT_TRUE(k_->MaxPool2dForward(o, x2.data(), y2.data(), arg2.data()).ok());
  EXPECT_EQ(arg2, (std::vector<int32_t>{1, 1}));
  const std::vector<float> dy = {0.5f, 0.25f};
  ASSERT_TRUE(k_->MaxPool2dBackward(o, dy.data(), arg2.data(), dx.data()).ok());
  EXPECT_EQ(dx, (std::vector<float>{0, 0.75f, 0, 0, 0, 0}));
}

// ---- sigmoid cross-entropy ----

// log(1 + exp(x)) - label * x, naively, in long double: fine for |x| <= 30.
double NaiveSigmoidLoss(double x, int label) {
  return static_cast<double>(std::log1p(std::exp(static_cast<long double>(x))) -
                             static_cast<long double>(label) * x);
}

TEST_F(ConvKernelsTest, SigmoidCrossEntropyMatchesReferenceAndNumericalGradient) {
  for (int n : {1, 7, 1000}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = RandomVector(n, rng_, -8.0f, 8.0f);
    std::vector<int32_t> labels(n);
    std::bernoulli_distribution coin(0.5);
    for (int32_t& l : labels) l = coin(rng_) ? 1 : 0;
    const float scale = 0.5f;
    std::vector<float> grad(n);
    double loss = -1;
    int64_t correct = -1;
    ASSERT_TRUE(
        k_->SigmoidCrossEntropy(n, x.data(), labels.data(), scale, grad.data(), &loss, &correct)
            .ok());
    double ref_loss = 0;
    int64_t ref_correct = 0;
    for (int i = 0; i < n; ++i) {
      ref_loss += NaiveSigmoidLoss(x[i], labels[i]);
      ref_correct += (x[i] > 0) == (labels[i] == 1);
      const double h = 1e-4;
      const double num =
          (NaiveSigmoidLoss(x[i] + h, labels[i]) - NaiveSigmoidLoss(x[i] - h, labels[i])) / (2 * h);
      ASSERT_NEAR(grad[i], num * scale, 1e-6) << "element " << i;
    }
    EXPECT_NEAR(loss, ref_loss, 1e-9 * n);
    EXPECT_EQ(correct, ref_correct);
  }
}

TEST_F(ConvKernelsTest, SigmoidCrossEntropyLargeLogitsStayFinite) {
  const std::vector<float> x = {100.0f, -100.0f, 100.0f, -100.0f, 0.0f, 1e30f, -1e30f};
  const std::vector<int32_t> labels = {1, 0, 0, 1, 1, 1, 1};
  std::vector<float> grad(x.size());
  double loss = 0;
  int64_t correct = 0;
  ASSERT_TRUE(k_->SigmoidCrossEntropy(static_cast<int>(x.size()), x.data(), labels.data(), 1.0f,
                                      grad.data(), &loss, &correct)
                  .ok());
  // Right and confident: ~0 each; wrong by 100: 100 each; x = 0: log 2; wrong by 1e30: 1e30.
  EXPECT_NEAR(loss, 200.0 + std::log(2.0) + 1e30, 1e30 * 1e-6);
  EXPECT_EQ(correct, 3);  // x = 0 predicts 0
  const std::vector<float> expected = {0.0f, 0.0f, 1.0f, -1.0f, -0.5f, 0.0f, -1.0f};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(grad[i], expected[i], 1e-7) << i;
  // Without the gradient or the outputs.
  ASSERT_TRUE(
      k_->SigmoidCrossEntropy(3, x.data(), labels.data(), 1.0f, nullptr, nullptr, nullptr).ok());
}

TEST_F(ConvKernelsTest, SigmoidCrossEntropyRejectsNonBinaryLabelsBeforeWriting) {
  const std::vector<float> x = {0.5f, -0.5f, 2.0f};
  const std::vector<int32_t> labels = {1, 2, 0};
  std::vector<float> grad(3, 42.0f);
  double loss = 0;
  Status s = k_->SigmoidCrossEntropy(3, x.data(), labels.data(), 1.0f, grad.data(), &loss, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("label 2 of element 1"), std::string::npos) << s.message();
  EXPECT_EQ(grad, std::vector<float>(3, 42.0f));
  int64_t correct = -1;
  ASSERT_TRUE(k_->SigmoidCrossEntropy(0, nullptr, nullptr, 1.0f, nullptr, &loss, &correct).ok());
  EXPECT_EQ(loss, 0.0);
  EXPECT_EQ(correct, 0);
  EXPECT_EQ(k_->SigmoidCrossEntropy(-1, nullptr, nullptr, 1.0f, nullptr, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// ---- dropout ----

TEST_F(ConvKernelsTest, DropoutKeepsTheRightFraction) {
  constexpr size_t kN = 200000;
  for (float p : {0.1f, 0.5f, 0.8f}) {
    SCOPED_TRACE(p);
    std::vector<uint8_t> mask(kN, 7);
    ASSERT_TRUE(k_->DropoutMask(kN, p, 1234, mask.data()).ok());
    size_t kept = 0;
    for (uint8_t m : mask) {
      ASSERT_TRUE(m == 0 || m == 1);
      kept += m;
    }
    // Binomial: 6 standard deviations.
    const double sd = std::sqrt(kN * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), kN * p, 6 * sd);
    // Adjacent elements are independent: P(both kept) ~ p^2.
    size_t pairs = 0;
    for (size_t i = 0; i + 1 < kN; i += 2) pairs += mask[i] & mask[i + 1];
    const double q = static_cast<double>(p) * p;
    EXPECT_NEAR(static_cast<double>(pairs), kN / 2 * q, 6 * std::sqrt(kN / 2 * q * (1 - q)));
  }
}

TEST_F(ConvKernelsTest, DropoutMaskDependsOnlyOnSeedAndIndex) {
  std::vector<uint8_t> a(1000), b(1000), c(1000), prefix(10);
  ASSERT_TRUE(k_->DropoutMask(a.size(), 0.5f, 99, a.data()).ok());
  ASSERT_TRUE(k_->DropoutMask(b.size(), 0.5f, 99, b.data()).ok());
  ASSERT_TRUE(k_->DropoutMask(c.size(), 0.5f, 100, c.data()).ok());
  ASSERT_TRUE(k_->DropoutMask(prefix.size(), 0.5f, 99, prefix.data()).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
  std::vector<uint8_t> all(1000);
  ASSERT_TRUE(k_->DropoutMask(all.size(), 1.0f, 5, all.data()).ok());
  EXPECT_EQ(all, std::vector<uint8_t>(1000, 1));
}

TEST_F(ConvKernelsTest, DropoutForwardAndBackward) {
  const size_t n = 1001;
  const float p = 0.75f;
  std::vector<uint8_t> mask(n);
  ASSERT_TRUE(k_->DropoutMask(n, p, 7, mask.data()).ok());
  const std::vector<float> x = RandomVector(n, rng_), dy = RandomVector(n, rng_);
  std::vector<float> y(n), dx(n);
  ASSERT_TRUE(k_->DropoutForward(n, p, mask.data(), x.data(), y.data()).ok());
  ASSERT_TRUE(k_->DropoutBackward(n, p, mask.data(), dy.data(), dx.data()).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], mask[i] ? x[i] * (1.0f / p) : 0.0f) << i;
    ASSERT_EQ(dx[i], mask[i] ? dy[i] * (1.0f / p) : 0.0f) << i;
  }
  // In place.
  std::vector<float> z = x;
  ASSERT_TRUE(k_->DropoutForward(n, p, mask.data(), z.data(), z.data()).ok());
  EXPECT_EQ(z, y);
  for (float bad : {0.0f, -0.5f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(bad);
    Status s = k_->DropoutMask(n, bad, 1, mask.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("keep_prob"), std::string::npos) << s.message();
    EXPECT_EQ(k_->DropoutForward(n, bad, mask.data(), x.data(), y.data()).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(k_->DropoutBackward(n, bad, mask.data(), x.data(), y.data()).code(),
              StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ps
