// A multilayer perceptron on top of Kernels: dense layers with ReLU between them and a
// softmax cross-entropy loss at the end. The parameters live on the parameter server; the
// model only holds the activations of one batch, sized once for the largest batch.
//
// Thread safety: an Mlp is used by one thread at a time, like the Kernels it borrows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"

namespace ps {

// Layer widths, input first and classes last, e.g. {784, 256, 128, 10}: ReLU between
// layers, softmax cross-entropy after the last one.
struct MlpShape {
  std::vector<int> layers;
};

// Parameter layout (what the parameter server stores): for layer l (0-based) there are two
// tensors, weight l as a row-major [layers[l] x layers[l+1]] matrix (y = x W + b) and bias
// l as [layers[l+1]]. Returns their float counts in the order W0, b0, W1, b1, ...
// (empty when the shape has fewer than two layers).
std::vector<size_t> MlpParamSizes(const MlpShape& shape);

// Sums over the examples of one or more batches.
struct BatchResult {
  double loss_sum = 0;  // summed cross-entropy (natural log)
  int64_t correct = 0;  // examples whose argmax equals the label
  int64_t examples = 0;
};

// Where the parameter and gradient tensors a model is given live.
enum class TensorHome {
  // Host buffers: on CUDA the model copies the parameters in and the gradients out each
  // call (the worker of a job, whose parameters come from and go to the servers).
  kHost,
  // The kernels' memory space already (device memory on CUDA; host memory on the CPU,
  // where the two homes are the same): only the batch is copied. For a model kept on the
  // device (ps_worker --standalone, worker/standalone.h).
  kKernels,
};

// Zeroes tensors[i] (sizes[i] floats) in `home`: the gradient of a mean over no examples.
Status ZeroTensors(Kernels& kernels, TensorHome home, const std::vector<float*>& tensors,
                   const std::vector<size_t>& sizes);

class Mlp {
 public:
  // kernels is borrowed and must outlive the Mlp. max_batch (>= 1) bounds the batch size
  // passed to ForwardBackward; the activations for it are allocated here, once.
  // InvalidArgument for a shape with fewer than two layers or a width < 1.
  static Result<std::unique_ptr<Mlp>> Create(const MlpShape& shape, Kernels* kernels,
                                             int max_batch);

  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;
  ~Mlp();

  // x: host, batch x layers[0] floats (row-major); y: host, batch int32 labels in
  // [0, layers.back()). params[i] / grads[i] are buffers of MlpParamSizes()[i] floats, in
  // `home`. Writes the gradient of the MEAN loss over the batch into grads (overwriting)
  // and adds the batch's loss sum, correct count and size to *result (may be null).
  // batch 0 zeroes grads and leaves *result as it was. InvalidArgument for batch < 0,
  // batch > max_batch, a label out of range, a null pointer or a wrong number of tensors;
  // on any error *result is unchanged and grads are unspecified.
  Status ForwardBackward(const float* x, const int32_t* y, int batch,
                         const std::vector<const float*>& params, const std::vector<float*>& grads,
                         BatchResult* result, TensorHome home = TensorHome::kHost);

  // Forward only, for evaluation; adds to *result. batch may exceed max_batch: it is
  // processed in slices of max_batch.
  Status Evaluate(const float* x, const int32_t* y, int batch,
                  const std::vector<const float*>& params, BatchResult* result,
                  TensorHome home = TensorHome::kHost);

  const MlpShape& shape() const { return shape_; }
  int max_batch() const { return max_batch_; }

 private:
  Mlp(const MlpShape& shape, Kernels* kernels, int max_batch);
  Status Allocate();
  Status CheckBatch(const float* x, const int32_t* y, int batch, size_t num_params) const;
  // Makes params_ point at the parameters in the backend's memory space (copied there from
  // the host when `home` is kHost on CUDA).
  Status StageParams(const std::vector<const float*>& params, TensorHome home);
  // Runs the layers on `batch` examples at x / y and the loss; writes d(loss)/d(logits)
  // scaled by grad_scale into the last gradient buffer when want_grad.
  Status Forward(const float* x, const int32_t* y, int batch, bool want_grad, float grad_scale,
                 double* loss_sum, int64_t* correct);

  const MlpShape shape_;
  Kernels* const kernels_;
  const int max_batch_;
  const bool on_device_;  // the backend's memory is not host memory: copies are needed
  const int num_layers_;  // dense layers: shape_.layers.size() - 1

  // Per dense layer l, the pointers its kernels read: device copies on CUDA, the caller's
  // host buffers on the CPU.
  std::vector<const float*> params_;
  // Outputs of every dense layer, max_batch x layers[l+1] each (post-ReLU except the last).
  std::vector<DeviceBuffer<float>> act_;
  // Two gradient buffers for the backward pass, max_batch x the widest hidden/output layer.
  DeviceBuffer<float> delta_[2];
  // CUDA only: inputs, labels, parameters and gradients on the device.
  DeviceBuffer<float> x_dev_;
  DeviceBuffer<int32_t> y_dev_;
  std::vector<DeviceBuffer<float>> params_dev_;
  std::vector<DeviceBuffer<float>> grads_dev_;
  // Which delta_ holds d(loss)/d(logits) after Forward.
  int logits_grad_ = 0;
};

}  // namespace ps
