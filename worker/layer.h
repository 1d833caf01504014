// The interface a layer of a --model=network network implements (worker/network.h runs
// them in order). A layer is stateless between batches apart from what its backward pass
// needs from its forward pass (pooling's argmax, dropout's mask); its parameters live on the
// parameter server, as the tables of its LayerSpec (common/network_config.h), and arrive in
// every call as pointers.
//
// Memory: every pointer is in the Kernels backend's memory space (host on the CPU, device
// on CUDA); a layer computes only through Kernels, so the same code runs on both. Arrays
// are row-major, one example after another: x is batch x spec().in.size() floats (NCHW for
// images), y is batch x spec().out.size().
//
// Adding a layer kind: parse its fields and shapes, and name its tables, in
// common/network_config.cc (ParseLayer); implement this interface in worker/layers.cc; add
// it to MakeLayer; test its Backward against a numerical gradient
// (tests/worker/network_layers_test.cc).
//
// Thread model: used by one thread (the training loop's), like the Kernels it is given.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "common/network_config.h"
#include "common/status.h"
#include "kernels/kernels.h"

namespace ps {

// One call's batch.
struct LayerBatch {
  int batch = 0;          // examples, 0 <= batch <= the max_batch given to Allocate
  bool training = false;  // false: evaluation (dropout passes values through)
  uint64_t seed = 0;      // a fresh value per training step, for random layers (dropout)
};

class Layer {
 public:
  explicit Layer(const LayerSpec& spec) : spec_(spec) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerSpec& spec() const { return spec_; }

  // Allocates, once, what Forward and Backward need for up to max_batch examples
  // (workspaces, masks). kernels is borrowed and outlives the layer.
  virtual Status Allocate(Kernels* kernels, int max_batch) {
    kernels_ = kernels;
    (void)max_batch;
    return Status::Ok();
  }

  // y = f(x; params). params holds one pointer per table of spec().tables, in order, each
  // a row-major rows x width array.
  virtual Status Forward(const LayerBatch& b, std::span<const float* const> params, const float* x,
                         float* y) = 0;

  // Given x and y of the last Forward (same batch) and dy = dL/dy, writes dL/dparams into
  // grads (one per table, summed over the batch, overwritten) and dL/dx into dx
  // (overwritten; null for the first layer, whose input needs no gradient).
  virtual Status Backward(const LayerBatch& b, std::span<const float* const> params, const float* x,
                          const float* y, const float* dy, std::span<float* const> grads,
                          float* dx) = 0;

  // Whether Forward accepts y == x and Backward dx == dy (same shape in and out): the
  // network then runs the layer in place on the output of the layer before it, which saves
  // a copy each way and a buffer. Only after a layer whose Backward does not read its y.
  virtual bool RunsInPlace() const { return false; }
  // Whether Backward reads y, this layer's own output: a layer running in place after it
  // would have overwritten it.
  virtual bool BackwardReadsOutput() const { return false; }

 protected:
  Kernels* kernels_ = nullptr;

 private:
  const LayerSpec spec_;
};

// The layer for spec.kind (unallocated).
Result<std::unique_ptr<Layer>> MakeLayer(const LayerSpec& spec);

}  // namespace ps
