// An update rule as plain data: which of the servers' rules (common/optimizer.h) and the
// job settings it reads. It is what a backend that cannot call an Optimizer is given (a
// CUDA kernel: kernels/kernels.h ApplyUpdate); the Optimizer made from it is the reference
// such a backend is checked against. No dependency beyond the standard library, so that
// CUDA sources can include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ps {

struct UpdateRule {
  enum class Kind : uint8_t { kSgd, kMomentum, kNesterov, kAdagrad, kAdam, kAdamW };
  Kind kind = Kind::kSgd;
  float weight_decay = 0;     // --weight_decay (adamw: decoupled)
  double clip_grad_norm = 0;  // --clip_grad_norm, per row; <= 0: off
  float momentum = 0.9f;      // momentum, nesterov
  float epsilon = 1e-8f;      // adagrad, adam, adamw
  double beta1 = 0.9;         // adam, adamw
  double beta2 = 0.999;       // adam, adamw

  // Floats of state a row of `width` values carries (Optimizer::StateFloats): none for
  // sgd, a velocity or a sum of squares for momentum, nesterov and adagrad, [m][v][t] for
  // adam and adamw.
  size_t StateFloats(size_t width) const {
    switch (kind) {
      case Kind::kSgd:
        return 0;
      case Kind::kMomentum:
      case Kind::kNesterov:
      case Kind::kAdagrad:
        return width;
      case Kind::kAdam:
      case Kind::kAdamW:
        return 2 * width + 1;
    }
    return 0;
  }
};

}  // namespace ps
