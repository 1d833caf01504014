// Update rules. An optimizer is a pure function of (row values, row state, gradient, lr):
// the table store decides where a row lives, the optimizer only how it changes. Its state
// (momentum, second moments, a step count) lives in the row beside the values:
// StateFloats(width) floats, zero for a new row.
//
// Thread safety: Apply is const and may run on several threads for different rows.
#pragma once

#include <memory>
#include <span>

#include "common/job_config.h"
#include "common/status.h"
#include "common/update_rule.h"

namespace ps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Floats of state a row of `width` values carries.
  virtual size_t StateFloats(size_t width) const = 0;
  // Applies one gradient to one row: values.size() == grad.size() == width,
  // state.size() == StateFloats(width). `lr` is the step's learning rate, schedule and
  // staleness scaling already applied.
  virtual void Apply(std::span<float> values, std::span<float> state, std::span<const float> grad,
                     float lr) const = 0;

  // Whether the state carries a velocity that moves a row with no new gradient (momentum,
  // nesterov): only then does Extrapolate differ from a copy.
  virtual bool HasVelocity() const { return false; }
  // How far, in units of the row's velocity, `updates` more updates at rate `lr` that bring
  // no gradient carry a row (a fraction of an update counts as that share along the same
  // geometric decay); 0 without a velocity. For pull look-ahead (--pull_lookahead): a
  // worker's gradient lands some updates after its pull, so it is computed about where the
  // model will be then. Computed once per pull, not per row.
  virtual float LookaheadStep(float /*lr*/, double /*updates*/) const { return 0; }
  // Writes to `out` the row moved `step` (LookaheadStep) along its velocity; without a
  // velocity, a copy. REQUIRES: out.size() == values.size(),
  // state.size() == StateFloats(values.size()).
  virtual void Extrapolate(std::span<const float> values, std::span<const float> state, float step,
                           std::span<float> out) const;
};

// The rule the job config names (--optimizer and its settings). An unknown name is an
// InvalidArgument.
Result<UpdateRule> MakeUpdateRule(const JobConfig& config);

// The optimizer of `rule`, each following PyTorch's rule of that name (formulas in
// optimizer.cc), with --clip_grad_norm applied to each row's gradient first and
// --weight_decay as an L2 term in the gradient (adamw: decoupled decay).
// State per row of width n:
//   sgd: none;  momentum, nesterov: velocity [n];  adagrad: sum of squares [n];
//   adam, adamw: [m: n][v: n][the row's step count t: 1 float, exact to 2^24].
std::unique_ptr<Optimizer> MakeOptimizer(const UpdateRule& rule);

// MakeOptimizer(MakeUpdateRule(config)): the optimizer the job config names.
Result<std::unique_ptr<Optimizer>> MakeOptimizer(const JobConfig& config);

}  // namespace ps
