#include "worker/network.h"

#include <algorithm>
#include <string>
#include <utility>

namespace ps {
namespace {

template <typename T>
std::span<T const> Slice(const std::vector<T>& v, size_t first, size_t n) {
  return std::span<T const>(v.data() + first, n);
}

}  // namespace

Status CheckNetworkInput(const JobConfig& config, const NetworkSpec& spec, int64_t inputs,
                         const std::string& shape) {
  if (inputs == spec.input.size()) return Status::Ok();
  return InvalidArgument(
      "the data has " + std::to_string(inputs) + " inputs per example (" + shape + ") but " +
      (config.model == "mlp" ? "--mlp_layers starts with " : "--network's input is ") +
      spec.input.ToString());
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

Result<std::unique_ptr<Network>> Network::Create(const NetworkSpec& spec, Kernels* kernels,
                                                 int max_batch, uint64_t seed) {
  if (kernels == nullptr) return InvalidArgument("Network: kernels is null");
  if (spec.layers.empty()) {
    return InvalidArgument("Network: no layers between the input and the loss");
  }
  if (max_batch < 1) {
    return InvalidArgument("Network: max_batch = " + std::to_string(max_batch) + " must be >= 1");
  }
  std::unique_ptr<Network> net(new Network(spec, kernels, max_batch, seed));
  PS_RETURN_IF_ERROR(net->Allocate());
  return net;
}

Network::Network(const NetworkSpec& spec, Kernels* kernels, int max_batch, uint64_t seed)
    : spec_(spec),
      kernels_(kernels),
      max_batch_(max_batch),
      seed_(seed),
      on_device_(kernels->IsCuda()) {}

Network::~Network() = default;

Status Network::Allocate() {
  const size_t batch = static_cast<size_t>(max_batch_);
  for (const LayerSpec& s : spec_.layers) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer, MakeLayer(s));
    PS_RETURN_IF_ERROR(layer->Allocate(kernels_, max_batch_));
    layers_.push_back(std::move(layer));
    first_table_.push_back(param_sizes_.size());
    for (const TableSpec& t : s.tables) param_sizes_.push_back(t.rows * t.width);
    const size_t l = layers_.size() - 1;
    if (l > 0 && layers_[l]->RunsInPlace() && !layers_[l - 1]->BackwardReadsOutput() &&
        s.in.size() == s.out.size()) {
      act_.push_back(act_[l - 1]);
      dact_.push_back(dact_[l - 1]);
      continue;
    }
    const size_t out = batch * static_cast<size_t>(s.out.size());
    for (std::vector<float*>* view : {&act_, &dact_}) {
      PS_ASSIGN_OR_RETURN(DeviceBuffer<float> b, DeviceBuffer<float>::Make(kernels_, out));
      view->push_back(b.get());
      buffers_.push_back(std::move(b));
    }
  }
  params_.assign(param_sizes_.size(), nullptr);
  if (on_device_) {
    PS_ASSIGN_OR_RETURN(x_dev_, DeviceBuffer<float>::Make(
                                    kernels_, batch * static_cast<size_t>(spec_.input.size())));
    PS_ASSIGN_OR_RETURN(y_dev_, DeviceBuffer<int32_t>::Make(kernels_, batch));
    for (size_t n : param_sizes_) {
      PS_ASSIGN_OR_RETURN(DeviceBuffer<float> p, DeviceBuffer<float>::Make(kernels_, n));
      params_dev_.push_back(std::move(p));
      PS_ASSIGN_OR_RETURN(DeviceBuffer<float> g, DeviceBuffer<float>::Make(kernels_, n));
      grads_dev_.push_back(std::move(g));
    }
  }
  return Status::Ok();
}

Status Network::CheckBatch(const float* x, const int32_t* y, int batch, size_t num_params) const {
  if (batch < 0) {
    return InvalidArgument("Network: batch size " + std::to_string(batch) + " is negative");
  }
  if (num_params != param_sizes_.size()) {
    return InvalidArgument("Network: got " + std::to_string(num_params) +
                           " parameter tensors, the network has " +
                           std::to_string(param_sizes_.size()));
  }
  if (batch > 0 && (x == nullptr || y == nullptr)) {
    return InvalidArgument("Network: x or y is null for a batch of " + std::to_string(batch));
  }
  const int classes = spec_.loss == LossKind::kSoftmaxCe ? spec_.classes : 2;
  for (int i = 0; i < batch; ++i) {
    if (y[i] < 0 || y[i] >= classes) {
      return InvalidArgument("Network: label " + std::to_string(y[i]) + " of example " +
                             std::to_string(i) + " is outside [0, " + std::to_string(classes) +
                             ")");
    }
  }
  return Status::Ok();
}

Status Network::StageParams(const std::vector<const float*>& params, TensorHome home) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] == nullptr) {
      return InvalidArgument("Network: parameter tensor " + std::to_string(i) + " is null");
    }
    if (on_device_ && home == TensorHome::kHost) {
      PS_RETURN_IF_ERROR(
          kernels_->CopyToDevice(params_dev_[i].get(), params[i], param_sizes_[i] * sizeof(float)));
      params_[i] = params_dev_[i].get();
    } else {
      params_[i] = params[i];  // already where the kernels read
    }
  }
  return Status::Ok();
}

Status Network::StageBatch(const float* x, const int32_t* y, int n, const float** x_in,
                           const int32_t** y_in) {
  *x_in = x;
  *y_in = y;
  if (!on_device_) return Status::Ok();
  const size_t floats = static_cast<size_t>(n) * static_cast<size_t>(spec_.input.size());
  PS_RETURN_IF_ERROR(kernels_->CopyToDevice(x_dev_.get(), x, floats * sizeof(float)));
  PS_RETURN_IF_ERROR(kernels_->CopyToDevice(y_dev_.get(), y, n * sizeof(int32_t)));
  *x_in = x_dev_.get();
  *y_in = y_dev_.get();
  return Status::Ok();
}

Status Network::Forward(const LayerBatch& b, const float* x, const int32_t* y, float grad_scale,
                        bool want_grad, double* loss_sum, int64_t* correct) {
  const float* in = x;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::span<const float* const> p =
        Slice(params_, first_table_[l], spec_.layers[l].tables.size());
    // The context is built only for an error: this runs every step.
    const Status s = layers_[l]->Forward(b, p, in, act_[l]);
    if (!s.ok()) return s.WithContext(LayerContext(l));
    in = act_[l];
  }
  float* grad = want_grad ? dact_.back() : nullptr;
  if (spec_.loss == LossKind::kSoftmaxCe) {
    return kernels_->SoftmaxCrossEntropy(b.batch, spec_.classes, in, y, grad_scale, grad, loss_sum,
                                         correct);
  }
  return kernels_->SigmoidCrossEntropy(b.batch, in, y, grad_scale, grad, loss_sum, correct);
}

Status Network::Backward(const LayerBatch& b, const float* x, const std::vector<float*>& grads) {
  for (size_t l = layers_.size(); l-- > 0;) {
    const size_t n = spec_.layers[l].tables.size();
    const std::span<const float* const> p = Slice(params_, first_table_[l], n);
    const std::span<float* const> g = Slice(grads, first_table_[l], n);
    const float* in = l == 0 ? x : act_[l - 1];
    float* dx = l == 0 ? nullptr : dact_[l - 1];
    const Status s = layers_[l]->Backward(b, p, in, act_[l], dact_[l], g, dx);
    if (!s.ok()) return s.WithContext(LayerContext(l) + " backward");
  }
  return Status::Ok();
}

std::string Network::LayerContext(size_t l) const {
  return "layer " + std::to_string(spec_.layers[l].index) + " (" + spec_.layers[l].text + ")";
}

Status Network::ForwardBackward(const float* x, const int32_t* y, int batch,
                                const std::vector<const float*>& params,
                                const std::vector<float*>& grads, BatchResult* result,
                                TensorHome home) {
  if (batch > max_batch_) {
    return InvalidArgument("Network: batch size " + std::to_string(batch) + " exceeds max_batch " +
                           std::to_string(max_batch_));
  }
  PS_RETURN_IF_ERROR(CheckBatch(x, y, batch, params.size()));
  if (grads.size() != param_sizes_.size()) {
    return InvalidArgument("Network: got " + std::to_string(grads.size()) +
                           " gradient tensors, the network has " +
                           std::to_string(param_sizes_.size()));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i] == nullptr) {
      return InvalidArgument("Network: gradient tensor " + std::to_string(i) + " is null");
    }
  }
  // Gradients go through the network's device buffers only when the caller's are on the host.
  const bool stage_grads = on_device_ && home == TensorHome::kHost;
  // The gradient of a mean over no examples: zero rather than 0/0.
  if (batch == 0) return ZeroTensors(*kernels_, home, grads, param_sizes_);
  PS_RETURN_IF_ERROR(StageParams(params, home));
  const float* x_in = nullptr;
  const int32_t* y_in = nullptr;
  PS_RETURN_IF_ERROR(StageBatch(x, y, batch, &x_in, &y_in));
  const LayerBatch b{batch, /*training=*/true, seed_ + steps_++};
  double loss_sum = 0;
  int64_t correct = 0;
  PS_RETURN_IF_ERROR(Forward(b, x_in, y_in, 1.0f / batch, /*want_grad=*/true, &loss_sum, &correct));
  std::vector<float*> grads_in = grads;
  if (stage_grads) {
    for (size_t i = 0; i < grads.size(); ++i) grads_in[i] = grads_dev_[i].get();
  }
  PS_RETURN_IF_ERROR(Backward(b, x_in, grads_in));
  if (stage_grads) {
    for (size_t i = 0; i < grads.size(); ++i) {
      PS_RETURN_IF_ERROR(
          kernels_->CopyToHost(grads[i], grads_dev_[i].get(), param_sizes_[i] * sizeof(float)));
    }
  }
  if (result != nullptr) {
    result->loss_sum += loss_sum;
    result->correct += correct;
    result->examples += batch;
  }
  return Status::Ok();
}

Status Network::Evaluate(const float* x, const int32_t* y, int batch,
                         const std::vector<const float*>& params, BatchResult* result,
                         TensorHome home) {
  PS_RETURN_IF_ERROR(CheckBatch(x, y, batch, params.size()));
  if (batch == 0) return Status::Ok();
  PS_RETURN_IF_ERROR(StageParams(params, home));
  const size_t in_width = static_cast<size_t>(spec_.input.size());
  BatchResult sum;
  for (int start = 0; start < batch; start += max_batch_) {
    const int n = std::min(max_batch_, batch - start);
    const float* x_in = nullptr;
    const int32_t* y_in = nullptr;
    PS_RETURN_IF_ERROR(
        StageBatch(x + static_cast<size_t>(start) * in_width, y + start, n, &x_in, &y_in));
    double loss = 0;
    int64_t correct = 0;
    const LayerBatch b{n, /*training=*/false, 0};
    PS_RETURN_IF_ERROR(Forward(b, x_in, y_in, 0.0f, /*want_grad=*/false, &loss, &correct));
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
