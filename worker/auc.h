// The area under the ROC curve, the ranking metric of click-through models: what a job of
// a binary model (sparse_lr, wide_deep) reports as test_auc, and what the synthetic data
// generators print as the best reachable.
//
// Thread safety: a pure function; call it from any thread.
#pragma once

#include <cstdint>
#include <span>

namespace ps {

// The probability that a random positive scores above a random negative, ties counted
// half. labels are 0 or 1 (anything non-zero counts as 1); a NaN score ranks below every
// other score. 0.5 when either class is absent.
// REQUIRES: scores.size() == labels.size() (only the common prefix is used otherwise).
double Auc(std::span<const float> scores, std::span<const int32_t> labels);

}  // namespace ps
