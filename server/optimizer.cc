#include "server/optimizer.h"

namespace ps {
namespace {

// Plain SGD: w -= lr * g. Stateless.
class Sgd final : public Optimizer {
 public:
  size_t StateFloats(size_t) const override { return 0; }
  void Apply(std::span<float> values, std::span<float>, std::span<const float> grad,
             float lr) const override {
    const size_t n = values.size();
    float* __restrict w = values.data();
    const float* __restrict g = grad.data();
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
  }
};

}  // namespace

Result<std::unique_ptr<Optimizer>> MakeOptimizer(const JobConfig& config) {
  if (config.optimizer == "sgd") return std::unique_ptr<Optimizer>(new Sgd());
  return InvalidArgument("--optimizer=" + config.optimizer + " is unknown: expected sgd");
}

}  // namespace ps
