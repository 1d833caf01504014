// The layer kinds of common/network_config.h on top of Kernels (worker/layer.h).
#include <memory>
#include <string>

#include "worker/layer.h"

namespace ps {
namespace {

size_t Count(int batch, const ActShape& s) {
  return static_cast<size_t>(batch) * static_cast<size_t>(s.size());
}

// dst = src for a batch of activations of shape s.
Status CopyActivations(Kernels* k, int batch, const ActShape& s, const float* src, float* dst) {
  const int width = static_cast<int>(s.size());
  return k->Copy2d(batch, width, src, width, dst, width);
}

// y = x W + b with W [in x units] (the fcN.weight table) and b [units].
class DenseLayer final : public Layer {
 public:
  using Layer::Layer;

  Status Forward(const LayerBatch& b, std::span<const float* const> p, const float* x,
                 float* y) override {
    const int in = static_cast<int>(spec().in.size());
    const int units = spec().units;
    PS_RETURN_IF_ERROR(kernels_->Gemm(false, false, b.batch, units, in, 1.0f, x, p[0], 0.0f, y));
    return kernels_->AddBias(b.batch, units, p[1], y);
  }

  Status Backward(const LayerBatch& b, std::span<const float* const> p, const float* x,
                  const float*, const float* dy, std::span<float* const> g, float* dx) override {
    const int in = static_cast<int>(spec().in.size());
    const int units = spec().units;
    // dW = x^T dy, db = column sums of dy, dx = dy W^T.
    PS_RETURN_IF_ERROR(kernels_->Gemm(true, false, in, units, b.batch, 1.0f, x, dy, 0.0f, g[0]));
    PS_RETURN_IF_ERROR(kernels_->BiasGrad(b.batch, units, dy, g[1]));
    if (dx == nullptr) return Status::Ok();
    return kernels_->Gemm(false, true, b.batch, in, units, 1.0f, dy, p[0], 0.0f, dx);
  }
};

class ReluLayer final : public Layer {
 public:
  using Layer::Layer;

  bool RunsInPlace() const override { return true; }
  bool BackwardReadsOutput() const override { return true; }  // the mask is y > 0

  Status Forward(const LayerBatch& b, std::span<const float* const>, const float* x,
                 float* y) override {
    if (x != y) PS_RETURN_IF_ERROR(CopyActivations(kernels_, b.batch, spec().in, x, y));
    return kernels_->Relu(Count(b.batch, spec().out), y);
  }

  Status Backward(const LayerBatch& b, std::span<const float* const>, const float*, const float* y,
                  const float* dy, std::span<float* const>, float* dx) override {
    if (dx == nullptr) return Status::Ok();
    if (dx != dy) PS_RETURN_IF_ERROR(CopyActivations(kernels_, b.batch, spec().out, dy, dx));
    return kernels_->ReluBackward(Count(b.batch, spec().out), y, dx);
  }
};

// CxHxW -> C*H*W: the same floats, a different shape.
class FlattenLayer final : public Layer {
 public:
  using Layer::Layer;

  Status Forward(const LayerBatch& b, std::span<const float* const>, const float* x,
                 float* y) override {
    return CopyActivations(kernels_, b.batch, spec().in, x, y);
  }

  Status Backward(const LayerBatch& b, std::span<const float* const>, const float*, const float*,
                  const float* dy, std::span<float* const>, float* dx) override {
    if (dx == nullptr) return Status::Ok();
    return CopyActivations(kernels_, b.batch, spec().in, dy, dx);
  }
};

// Inverted dropout: kept values are scaled by 1 / (1 - P) while training, so that
// evaluation passes values through unchanged.
class DropoutLayer final : public Layer {
 public:
  using Layer::Layer;

  Status Allocate(Kernels* kernels, int max_batch) override {
    kernels_ = kernels;
    PS_ASSIGN_OR_RETURN(mask_, DeviceBuffer<uint8_t>::Make(kernels, Count(max_batch, spec().in)));
    return Status::Ok();
  }

  Status Forward(const LayerBatch& b, std::span<const float* const>, const float* x,
                 float* y) override {
    if (!b.training || spec().drop == 0) return CopyActivations(kernels_, b.batch, spec().in, x, y);
    const size_t n = Count(b.batch, spec().in);
    PS_RETURN_IF_ERROR(kernels_->DropoutMask(n, Keep(), b.seed, mask_.get()));
    return kernels_->DropoutForward(n, Keep(), mask_.get(), x, y);
  }

  Status Backward(const LayerBatch& b, std::span<const float* const>, const float*, const float*,
                  const float* dy, std::span<float* const>, float* dx) override {
    if (dx == nullptr) return Status::Ok();
    if (!b.training || spec().drop == 0) {
      return CopyActivations(kernels_, b.batch, spec().in, dy, dx);
    }
    return kernels_->DropoutBackward(Count(b.batch, spec().in), Keep(), mask_.get(), dy, dx);
  }

 private:
  float Keep() const { return 1.0f - spec().drop; }
  DeviceBuffer<uint8_t> mask_;
};

// im2col + GEMM (Kernels::Conv2d*): weight [filters x C*K*K], bias [filters].
class Conv2dLayer final : public Layer {
 public:
  using Layer::Layer;

  Status Allocate(Kernels* kernels, int max_batch) override {
    kernels_ = kernels;
    (void)max_batch;
    PS_ASSIGN_OR_RETURN(workspace_, DeviceBuffer<float>::Make(kernels, Shape(1).WorkspaceFloats()));
    return Status::Ok();
  }

  Status Forward(const LayerBatch& b, std::span<const float* const> p, const float* x,
                 float* y) override {
    return kernels_->Conv2dForward(Shape(b.batch), x, p[0], p[1], y, workspace_.get());
  }

  Status Backward(const LayerBatch& b, std::span<const float* const> p, const float* x,
                  const float*, const float* dy, std::span<float* const> g, float* dx) override {
    const Conv2dShape shape = Shape(b.batch);
    PS_RETURN_IF_ERROR(kernels_->Conv2dBackwardFilter(shape, x, dy, g[0], g[1], workspace_.get()));
    if (dx == nullptr) return Status::Ok();
    return kernels_->Conv2dBackwardData(shape, dy, p[0], dx, workspace_.get());
  }

 private:
  Conv2dShape Shape(int batch) const {
    const LayerSpec& s = spec();
    return Conv2dShape{batch, s.in.c, s.in.h, s.in.w, s.filters, s.kernel, s.stride, s.pad};
  }
  DeviceBuffer<float> workspace_;
};

class MaxPoolLayer final : public Layer {
 public:
  using Layer::Layer;

  Status Allocate(Kernels* kernels, int max_batch) override {
    kernels_ = kernels;
    PS_ASSIGN_OR_RETURN(argmax_,
                        DeviceBuffer<int32_t>::Make(kernels, Count(max_batch, spec().out)));
    return Status::Ok();
  }

  Status Forward(const LayerBatch& b, std::span<const float* const>, const float* x,
                 float* y) override {
    return kernels_->MaxPool2dForward(Shape(b.batch), x, y, argmax_.get());
  }

  Status Backward(const LayerBatch& b, std::span<const float* const>, const float*, const float*,
                  const float* dy, std::span<float* const>, float* dx) override {
    if (dx == nullptr) return Status::Ok();
    return kernels_->MaxPool2dBackward(Shape(b.batch), dy, argmax_.get(), dx);
  }

 private:
  Pool2dShape Shape(int batch) const {
    const LayerSpec& s = spec();
    return Pool2dShape{batch, s.in.c, s.in.h, s.in.w, s.kernel, s.stride, s.pad};
  }
  DeviceBuffer<int32_t> argmax_;
};

}  // namespace

Result<std::unique_ptr<Layer>> MakeLayer(const LayerSpec& spec) {
  switch (spec.kind) {
    case LayerKind::kDense:
      return std::unique_ptr<Layer>(new DenseLayer(spec));
    case LayerKind::kRelu:
      return std::unique_ptr<Layer>(new ReluLayer(spec));
    case LayerKind::kFlatten:
      return std::unique_ptr<Layer>(new FlattenLayer(spec));
    case LayerKind::kDropout:
      return std::unique_ptr<Layer>(new DropoutLayer(spec));
    case LayerKind::kConv2d:
      return std::unique_ptr<Layer>(new Conv2dLayer(spec));
    case LayerKind::kMaxPool:
      return std::unique_ptr<Layer>(new MaxPoolLayer(spec));
    case LayerKind::kEmbedding:
    case LayerKind::kConcat:
    case LayerKind::kWide:
      break;  // they read the example's ids: --model=wide_deep runs them (worker/wide_deep.h)
  }
  return InvalidArgument(std::string("no layer implements kind ") + LayerKindName(spec.kind) +
                         " (it reads categorical ids: --model=wide_deep runs it)");
}

}  // namespace ps
