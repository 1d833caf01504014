// A network of layers (worker/layer.h) built from a parsed --network (common/network_config.h):
// runs them in order, then the loss, and back. The parameters live on the parameter server;
// the network holds each layer's output and its gradient for one batch, sized once for the
// largest batch. The MLP of --model=mlp is one such network (MlpNetwork in
// common/network_config.h).
//
// Thread safety: a Network is used by one thread at a time, like the Kernels it borrows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/network_config.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/batch_result.h"
#include "worker/layer.h"

namespace ps {

// Where the parameter and gradient tensors a network is given live.
enum class TensorHome {
  // Host buffers: on CUDA the network copies the parameters in and the gradients out each
  // call (the worker of a job, whose parameters come from and go to the servers).
  kHost,
  // The kernels' memory space already (device memory on CUDA; host memory on the CPU,
  // where the two homes are the same): only the batch is copied. For a model kept on the
  // device (ps_worker --standalone, worker/standalone.h).
  kKernels,
};

// OK when examples of `inputs` values (`shape`, e.g. "28x28", for the message) fill the
// input of the job's network `spec`; else InvalidArgument naming --mlp_layers or --network,
// as the job wrote it, and both sizes.
Status CheckNetworkInput(const JobConfig& config, const NetworkSpec& spec, int64_t inputs,
                         const std::string& shape);

// Zeroes tensors[i] (sizes[i] floats) in `home`: the gradient of a mean over no examples.
Status ZeroTensors(Kernels& kernels, TensorHome home, const std::vector<float*>& tensors,
                   const std::vector<size_t>& sizes);

class Network {
 public:
  // kernels is borrowed and must outlive the Network. max_batch >= 1 bounds the batches of
  // ForwardBackward. seed: dropout masks use seed + the number of training steps so far.
  // InvalidArgument for a network without layers between input and loss, or max_batch < 1.
  static Result<std::unique_ptr<Network>> Create(const NetworkSpec& spec, Kernels* kernels,
                                                 int max_batch, uint64_t seed = 1);

  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;
  ~Network();

  // Float counts of the parameter tensors (spec.Tables() order: each layer's weight, bias).
  const std::vector<size_t>& ParamSizes() const { return param_sizes_; }

  // x: host, batch x spec.input.size() floats; y: host, batch int32 labels (in
  // [0, classes) for softmax_ce, 0 or 1 for sigmoid_ce). params[i] / grads[i]: buffers
  // of ParamSizes()[i] floats in `home`. Writes the gradient of the MEAN loss into
  // grads and adds the batch's loss sum, correct count and size to *result (may be null). batch 0
  // zeroes grads. InvalidArgument for batch < 0 or > max_batch, a label out of range, a null
  // pointer or a wrong number of tensors.
  Status ForwardBackward(const float* x, const int32_t* y, int batch,
                         const std::vector<const float*>& params, const std::vector<float*>& grads,
                         BatchResult* result, TensorHome home = TensorHome::kHost);

  // Forward only (dropout off), in slices of max_batch; adds to *result.
  Status Evaluate(const float* x, const int32_t* y, int batch,
                  const std::vector<const float*>& params, BatchResult* result,
                  TensorHome home = TensorHome::kHost);

  const NetworkSpec& spec() const { return spec_; }
  int max_batch() const { return max_batch_; }

 private:
  Network(const NetworkSpec& spec, Kernels* kernels, int max_batch, uint64_t seed);
  Status Allocate();
  Status CheckBatch(const float* x, const int32_t* y, int batch, size_t num_params) const;
  Status StageParams(const std::vector<const float*>& params, TensorHome home);
  // x / y in the backend's memory (staged on CUDA); n <= max_batch.
  Status StageBatch(const float* x, const int32_t* y, int n, const float** x_in,
                    const int32_t** y_in);
  Status Forward(const LayerBatch& b, const float* x, const int32_t* y, float grad_scale,
                 bool want_grad, double* loss_sum, int64_t* correct);
  Status Backward(const LayerBatch& b, const float* x, const std::vector<float*>& grads);
  // "layer I (TEXT)" for an error of layer l.
  std::string LayerContext(size_t l) const;

  const NetworkSpec spec_;
  Kernels* const kernels_;
  const int max_batch_;
  const uint64_t seed_;
  const bool on_device_;
  uint64_t steps_ = 0;

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<size_t> first_table_;  // per layer, the index of its first parameter tensor
  std::vector<size_t> param_sizes_;
  std::vector<const float*> params_;  // what the kernels read: device copies on CUDA
  // Per layer, its output and the gradient of the loss with respect to it: views into
  // buffers_, the same as the layer before's for a layer that runs in place (ReLU).
  std::vector<float*> act_, dact_;
  std::vector<DeviceBuffer<float>> buffers_;
  // CUDA only: inputs, labels, parameters and gradients on the device.
  DeviceBuffer<float> x_dev_;
  DeviceBuffer<int32_t> y_dev_;
  std::vector<DeviceBuffer<float>> params_dev_, grads_dev_;
};

}  // namespace ps
