// What a model's forward pass adds up over the examples of one or more batches.
#pragma once

#include <cstdint>

namespace ps {

struct BatchResult {
  double loss_sum = 0;  // summed loss (natural log)
  int64_t correct = 0;  // examples classified correctly
  int64_t examples = 0;
};

}  // namespace ps
