#include "worker/mlp.h"

#include <algorithm>
#include <string>
#include <utility>

namespace ps {

std::vector<size_t> MlpParamSizes(const MlpShape& shape) {
  std::vector<size_t> sizes;
  for (size_t l = 0; l + 1 < shape.layers.size(); ++l) {
    sizes.push_back(static_cast<size_t>(shape.layers[l]) *
                    static_cast<size_t>(shape.layers[l + 1]));
    sizes.push_back(static_cast<size_t>(shape.layers[l + 1]));
  }
  return sizes;
}

Status ZeroTensors(Kernels& kernels, TensorHome home, const std::vector<float*>& tensors,
                   const std::vector<size_t>& sizes) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (home == TensorHome::kKernels && kernels.IsCuda()) {
      const std::vector<float> zeros(sizes[i], 0.0f);
      PS_RETURN_IF_ERROR(kernels.CopyToDevice(tensors[i], zeros.data(), sizes[i] * sizeof(float)));
    } else {
      std::fill(tensors[i], tensors[i] + sizes[i], 0.0f);
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Mlp>> Mlp::Create(const MlpShape& shape, Kernels* kernels, int max_batch) {
  if (kernels == nullptr) return InvalidArgument("Mlp: kernels is null");
  if (shape.layers.size() < 2) {
    return InvalidArgument("Mlp: a shape needs at least two layers (inputs and classes), got " +
                           std::to_string(shape.layers.size()));
  }
  for (size_t l = 0; l < shape.layers.size(); ++l) {
    if (shape.layers[l] < 1) {
      return InvalidArgument("Mlp: layer " + std::to_string(l) + " has width " +
                             std::to_string(shape.layers[l]) + "; widths must be >= 1");
    }
  }
  if (max_batch < 1) {
    return InvalidArgument("Mlp: max_batch = " + std::to_string(max_batch) + " must be >= 1");
  }
  std::unique_ptr<Mlp> mlp(new Mlp(shape, kernels, max_batch));
  PS_RETURN_IF_ERROR(mlp->Allocate());
  return mlp;
}

Mlp::Mlp(const MlpShape& shape, Kernels* kernels, int max_batch)
    : shape_(shape),
      kernels_(kernels),
      max_batch_(max_batch),
      on_device_(kernels->IsCuda()),
      num_layers_(static_cast<int>(shape.layers.size()) - 1) {}

Mlp::~Mlp() = default;

Status Mlp::Allocate() {
  const std::vector<int>& w = shape_.layers;
  const size_t batch = static_cast<size_t>(max_batch_);
  int widest = 0;
  for (int l = 0; l < num_layers_; ++l) {
    PS_ASSIGN_OR_RETURN(DeviceBuffer<float> a,
                        DeviceBuffer<float>::Make(kernels_, batch * w[l + 1]));
    act_.push_back(std::move(a));
    widest = std::max(widest, w[l + 1]);
  }
  for (DeviceBuffer<float>& d : delta_) {
    PS_ASSIGN_OR_RETURN(d, DeviceBuffer<float>::Make(kernels_, batch * widest));
  }
  params_.assign(2 * num_layers_, nullptr);
  if (on_device_) {
    PS_ASSIGN_OR_RETURN(x_dev_, DeviceBuffer<float>::Make(kernels_, batch * w[0]));
    PS_ASSIGN_OR_RETURN(y_dev_, DeviceBuffer<int32_t>::Make(kernels_, batch));
    for (size_t n : MlpParamSizes(shape_)) {
      PS_ASSIGN_OR_RETURN(DeviceBuffer<float> p, DeviceBuffer<float>::Make(kernels_, n));
      params_dev_.push_back(std::move(p));
      PS_ASSIGN_OR_RETURN(DeviceBuffer<float> g, DeviceBuffer<float>::Make(kernels_, n));
      grads_dev_.push_back(std::move(g));
    }
  }
  return Status::Ok();
}

Status Mlp::CheckBatch(const float* x, const int32_t* y, int batch, size_t num_params) const {
  if (batch < 0) {
    return InvalidArgument("Mlp: batch size " + std::to_string(batch) + " is negative");
  }
  if (num_params != params_.size()) {
    return InvalidArgument("Mlp: got " + std::to_string(num_params) + " parameter tensors, the " +
                           std::to_string(num_layers_) + "-layer model has " +
                           std::to_string(params_.size()));
  }
  if (batch > 0 && (x == nullptr || y == nullptr)) {
    return InvalidArgument("Mlp: x or y is null for a batch of " + std::to_string(batch));
  }
  const int classes = shape_.layers.back();
  for (int i = 0; i < batch; ++i) {
    if (y[i] < 0 || y[i] >= classes) {
      return InvalidArgument("Mlp: label " + std::to_string(y[i]) + " of example " +
                             std::to_string(i) + " is outside [0, " + std::to_string(classes) +
                             ")");
    }
  }
  return Status::Ok();
}

Status Mlp::StageParams(const std::vector<const float*>& params, TensorHome home) {
  const std::vector<size_t> sizes = MlpParamSizes(shape_);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return InvalidArgument("Mlp: parameter tensor " + std::to_string(i) + " is null");
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (on_device_ && home == TensorHome::kHost) {
      PS_RETURN_IF_ERROR(
          kernels_->CopyToDevice(params_dev_[i].get(), params[i], sizes[i] * sizeof(float)));
      params_[i] = params_dev_[i].get();
    } else {
      params_[i] = params[i];  // already where the kernels read
    }
  }
  return Status::Ok();
}

Status Mlp::Forward(const float* x, const int32_t* y, int batch, bool want_grad, float grad_scale,
                    double* loss_sum, int64_t* correct) {
  const std::vector<int>& w = shape_.layers;
  const float* in = x;
  for (int l = 0; l < num_layers_; ++l) {
    float* out = act_[l].get();
    PS_RETURN_IF_ERROR(
        kernels_->Gemm(false, false, batch, w[l + 1], w[l], 1.0f, in, params_[2 * l], 0.0f, out));
    PS_RETURN_IF_ERROR(kernels_->AddBias(batch, w[l + 1], params_[2 * l + 1], out));
    if (l + 1 < num_layers_) {
      PS_RETURN_IF_ERROR(kernels_->Relu(static_cast<size_t>(batch) * w[l + 1], out));
    }
    in = out;
  }
  logits_grad_ = 0;
  return kernels_->SoftmaxCrossEntropy(batch, w.back(), in, y, grad_scale,
                                       want_grad ? delta_[logits_grad_].get() : nullptr, loss_sum,
                                       correct);
}

Status Mlp::ForwardBackward(const float* x, const int32_t* y, int batch,
                            const std::vector<const float*>& params,
                            const std::vector<float*>& grads, BatchResult* result,
                            TensorHome home) {
  if (batch > max_batch_) {
    return InvalidArgument("Mlp: batch size " + std::to_string(batch) + " exceeds max_batch " +
                           std::to_string(max_batch_));
  }
  PS_RETURN_IF_ERROR(CheckBatch(x, y, batch, params.size()));
  if (grads.size() != params_.size()) {
    return InvalidArgument("Mlp: got " + std::to_string(grads.size()) +
                           " gradient tensors, the model has " + std::to_string(params_.size()));
  }
  const std::vector<size_t> sizes = MlpParamSizes(shape_);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i] == nullptr) {
      return InvalidArgument("Mlp: gradient tensor " + std::to_string(i) + " is null");
    }
  }
  // Gradients go through the model's device buffers only when the caller's are on the host.
  const bool stage_grads = on_device_ && home == TensorHome::kHost;
  // The gradient of a mean over no examples: zero rather than 0/0.
  if (batch == 0) return ZeroTensors(*kernels_, home, grads, MlpParamSizes(shape_));
  PS_RETURN_IF_ERROR(StageParams(params, home));
  const std::vector<int>& w = shape_.layers;
  const float* x_in = x;
  const int32_t* y_in = y;
  if (on_device_) {
    PS_RETURN_IF_ERROR(
        kernels_->CopyToDevice(x_dev_.get(), x, static_cast<size_t>(batch) * w[0] * sizeof(float)));
    PS_RETURN_IF_ERROR(kernels_->CopyToDevice(y_dev_.get(), y, batch * sizeof(int32_t)));
    x_in = x_dev_.get();
    y_in = y_dev_.get();
  }
  double loss_sum = 0;
  int64_t correct = 0;
  PS_RETURN_IF_ERROR(
      Forward(x_in, y_in, batch, /*want_grad=*/true, 1.0f / batch, &loss_sum, &correct));

  // Backward: delta_[cur] holds d(loss)/d(output of layer l) as l goes down.
  int cur = logits_grad_;
  for (int l = num_layers_ - 1; l >= 0; --l) {
    const float* in = l == 0 ? x_in : act_[l - 1].get();
    float* gw = stage_grads ? grads_dev_[2 * l].get() : grads[2 * l];
    float* gb = stage_grads ? grads_dev_[2 * l + 1].get() : grads[2 * l + 1];
    // dW = in^T delta, db = column sums of delta.
    PS_RETURN_IF_ERROR(
        kernels_->Gemm(true, false, w[l], w[l + 1], batch, 1.0f, in, delta_[cur].get(), 0.0f, gw));
    PS_RETURN_IF_ERROR(kernels_->BiasGrad(batch, w[l + 1], delta_[cur].get(), gb));
    if (l > 0) {
      // d(input) = delta W^T, then through the ReLU that produced the input.
      float* prev = delta_[1 - cur].get();
      PS_RETURN_IF_ERROR(kernels_->Gemm(false, true, batch, w[l], w[l + 1], 1.0f, delta_[cur].get(),
                                        params_[2 * l], 0.0f, prev));
      PS_RETURN_IF_ERROR(
          kernels_->ReluBackward(static_cast<size_t>(batch) * w[l], act_[l - 1].get(), prev));
      cur = 1 - cur;
    }
  }
  if (stage_grads) {
    for (size_t i = 0; i < grads.size(); ++i) {
      PS_RETURN_IF_ERROR(
          kernels_->CopyToHost(grads[i], grads_dev_[i].get(), sizes[i] * sizeof(float)));
    }
  }
  if (result != nullptr) {
    result->loss_sum += loss_sum;
    result->correct += correct;
    result->examples += batch;
  }
  return Status::Ok();
}

Status Mlp::Evaluate(const float* x, const int32_t* y, int batch,
                     const std::vector<const float*>& params, BatchResult* result,
                     TensorHome home) {
  PS_RETURN_IF_ERROR(CheckBatch(x, y, batch, params.size()));
  if (batch == 0) return Status::Ok();
  PS_RETURN_IF_ERROR(StageParams(params, home));
  const size_t in_width = static_cast<size_t>(shape_.layers[0]);
  BatchResult sum;
  for (int start = 0; start < batch; start += max_batch_) {
    const int n = std::min(max_batch_, batch - start);
    const float* x_in = x + static_cast<size_t>(start) * in_width;
    const int32_t* y_in = y + start;
    if (on_device_) {
      PS_RETURN_IF_ERROR(kernels_->CopyToDevice(x_dev_.get(), x_in,
                                                static_cast<size_t>(n) * in_width * sizeof(float)));
      PS_RETURN_IF_ERROR(kernels_->CopyToDevice(y_dev_.get(), y_in, n * sizeof(int32_t)));
      x_in = x_dev_.get();
      y_in = y_dev_.get();
    }
    double loss = 0;
    int64_t correct = 0;
    PS_RETURN_IF_ERROR(Forward(x_in, y_in, n, /*want_grad=*/false, 0.0f, &loss, &correct));
    sum.loss_sum += loss;
    sum.correct += correct;
    sum.examples += n;
  }
  if (result != nullptr) {
    result->loss_sum += sum.loss_sum;
    result->correct += sum.correct;
    result->examples += sum.examples;
  }
  return Status::Ok();
}

}  // namespace ps
