// Update rules. An optimizer is a pure function of (row values, row state, gradient, lr):
// the table store decides where a row lives, the optimizer only how it changes. Its state
// (momentum, second moments) lives in the row beside the values, StateFloatsPerValue()
// floats for each value.
//
// Thread safety: Apply is const and may run on several threads for different rows.
#pragma once

#include <memory>
#include <span>

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual int StateFloatsPerValue() const = 0;
  // values -= update(grad); state.size() == values.size() * StateFloatsPerValue().
  virtual void Apply(std::span<float> values, std::span<float> state, std::span<const float> grad,
                     float lr) const = 0;
};

// The optimizer the job config names (--optimizer).
Result<std::unique_ptr<Optimizer>> MakeOptimizer(const JobConfig& config);

}  // namespace ps
