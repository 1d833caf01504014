#include "worker/auc.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace ps {

double Auc(std::span<const float> scores, std::span<const int32_t> labels) {
  const size_t n = std::min(scores.size(), labels.size());
  std::vector<std::pair<float, bool>> items(n);
  for (size_t i = 0; i < n; ++i) items[i] = {scores[i], labels[i] != 0};
  // NaN first, then ascending; a plain < on NaN would break the sort's ordering contract.
  const auto less = [](float a, float b) {
    if (std::isnan(a)) return !std::isnan(b);
    return !std::isnan(b) && a < b;
  };
  std::sort(items.begin(), items.end(),
            [&](const auto& a, const auto& b) { return less(a.first, b.first); });
  // Walk groups of equal scores upwards: each positive beats every negative below its
  // group and ties half of the negatives in it.
  double wins = 0;
  double negatives_below = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double pos = 0;
    double neg = 0;
    while (j < n && !less(items[i].first, items[j].first)) {
      (items[j].second ? pos : neg) += 1;
      ++j;
    }
    wins += pos * (negatives_below + 0.5 * neg);
    negatives_below += neg;
    positives += pos;
    i = j;
  }
  if (positives == 0 || negatives_below == 0) return 0.5;
  return wins / (positives * negatives_below);
}

}  // namespace ps
