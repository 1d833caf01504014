#include "worker/sparse_lr.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace ps {
namespace {

// Checks everything the forward pass indexes with, before it writes anything, so that an
// error leaves the outputs untouched.
Status CheckBatch(const SparseDataset& data, const SparseBatch& batch, size_t num_weights) {
  if (data.count < 0 || data.offsets.size() != static_cast<size_t>(data.count) + 1 ||
      data.labels.size() != static_cast<size_t>(data.count) ||
      data.values.size() != data.features.size() ||
      data.offsets.back() != static_cast<int64_t>(data.features.size())) {
    return InvalidArgument("sparse LR: inconsistent data set: " + std::to_string(data.count) +
                           " examples, " + std::to_string(data.offsets.size()) + " offsets, " +
                           std::to_string(data.labels.size()) + " labels, " +
                           std::to_string(data.features.size()) + " features, " +
                           std::to_string(data.values.size()) + " values");
  }
  if (num_weights != batch.keys.size()) {
    return InvalidArgument("sparse LR: " + std::to_string(num_weights) + " weights for " +
                           std::to_string(batch.keys.size()) + " keys");
  }
  size_t total = 0;
  for (const int64_t e : batch.examples) {
    if (e < 0 || e >= data.count) {
      return InvalidArgument("sparse LR: example " + std::to_string(e) + " is outside the " +
                             std::to_string(data.count) + " examples of the data set");
    }
    const int64_t begin = data.offsets[e];
    const int64_t end = data.offsets[e + 1];
    if (begin < 0 || end < begin || end > static_cast<int64_t>(data.features.size())) {
      return InvalidArgument("sparse LR: bad offsets [" + std::to_string(begin) + ", " +
                             std::to_string(end) + ") for example " + std::to_string(e));
    }
    if (data.labels[e] != 0 && data.labels[e] != 1) {
      return InvalidArgument("sparse LR: example " + std::to_string(e) + " has label " +
                             std::to_string(data.labels[e]) + ", expected 0 or 1");
    }
    total += static_cast<size_t>(end - begin);
  }
  if (batch.key_index.size() != total) {
    return InvalidArgument("sparse LR: the batch has " + std::to_string(batch.key_index.size()) +
                           " key indices for " + std::to_string(total) +
                           " features; was it made from this data set?");
  }
  for (const uint32_t k : batch.key_index) {
    if (k >= batch.keys.size()) {
      return InvalidArgument("sparse LR: key index " + std::to_string(k) + " is outside the " +
                             std::to_string(batch.keys.size()) + " keys of the batch");
    }
  }
  return Status::Ok();
}

double Sigmoid(double z) {
  // Either branch exponentiates a non-positive number: no overflow.
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

// log(1 + exp(z)) - y z, the log loss of logit z for label y, without overflow.
double LogLoss(double z, int32_t y) {
  return std::max(z, 0.0) - (y == 1 ? z : 0.0) + std::log1p(std::exp(-std::fabs(z)));
}

// The shared forward pass, after CheckBatch. With grads non-empty, also writes the
// gradients of the mean loss.
void Run(const SparseDataset& data, const SparseBatch& batch, std::span<const float> weights,
         float bias, std::span<float> grads, float* bias_grad, BatchResult* result,
         std::vector<float>* scores) {
  const bool backward = bias_grad != nullptr;
  if (backward) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    *bias_grad = 0;
  }
  if (batch.examples.empty()) return;
  const double inv_n = 1.0 / static_cast<double>(batch.examples.size());
  double loss_sum = 0;
  double bias_sum = 0;
  int64_t correct = 0;
  const uint32_t* index = batch.key_index.data();
  for (const int64_t e : batch.examples) {
    const int64_t begin = data.offsets[e];
    const int64_t n = data.offsets[e + 1] - begin;
    const float* values = data.values.data() + begin;
    double z = bias;
    for (int64_t j = 0; j < n; ++j) z += double{weights[index[j]]} * values[j];
    const int32_t y = data.labels[e];
    const double p = Sigmoid(z);
    loss_sum += LogLoss(z, y);
    correct += (p >= 0.5) == (y == 1) ? 1 : 0;
    if (scores != nullptr) scores->push_back(static_cast<float>(p));
    if (backward) {
      // d(loss)/dz = p - y; the chain rule through z = bias + sum w x.
      const double dz = (p - y) * inv_n;
      for (int64_t j = 0; j < n; ++j) grads[index[j]] += static_cast<float>(dz * values[j]);
      bias_sum += dz;
    }
    index += n;
  }
  if (backward) *bias_grad = static_cast<float>(bias_sum);
  if (result != nullptr) {
    result->loss_sum += loss_sum;
    result->correct += correct;
    result->examples += static_cast<int64_t>(batch.examples.size());
  }
}

}  // namespace

SparseBatch MakeSparseBatch(const SparseDataset& data, std::span<const int64_t> examples) {
  SparseBatch batch;
  batch.examples.assign(examples.begin(), examples.end());
  const auto in_range = [&](int64_t e) {
    return e >= 0 && e < data.count && static_cast<size_t>(e) + 1 < data.offsets.size();
  };
  // Gather the ids, then sort and dedupe them: cheaper than a hash map for the few thousand
  // ids of a batch, and the sorted keys are what a range-sharded table wants anyway.
  for (const int64_t e : examples) {
    if (!in_range(e)) continue;
    for (int64_t f = data.offsets[e]; f < data.offsets[e + 1]; ++f) {
      batch.keys.push_back(data.features[f]);
    }
  }
  std::vector<uint64_t> ids = batch.keys;  // in example order, for key_index
  std::sort(batch.keys.begin(), batch.keys.end());
  batch.keys.erase(std::unique(batch.keys.begin(), batch.keys.end()), batch.keys.end());
  batch.key_index.reserve(ids.size());
  for (const uint64_t id : ids) {
    const auto it = std::lower_bound(batch.keys.begin(), batch.keys.end(), id);
    batch.key_index.push_back(static_cast<uint32_t>(it - batch.keys.begin()));
  }
  return batch;
}

Status SparseLrForwardBackward(const SparseDataset& data, const SparseBatch& batch,
                               std::span<const float> weights, float bias, std::span<float> grads,
                               float* bias_grad, BatchResult* result) {
  if (bias_grad == nullptr) return InvalidArgument("sparse LR: null bias_grad");
  if (grads.size() != batch.keys.size()) {
    return InvalidArgument("sparse LR: " + std::to_string(grads.size()) + " gradients for " +
                           std::to_string(batch.keys.size()) + " keys");
  }
  PS_RETURN_IF_ERROR(CheckBatch(data, batch, weights.size()));
  Run(data, batch, weights, bias, grads, bias_grad, result, nullptr);
  return Status::Ok();
}

Status SparseLrEvaluate(const SparseDataset& data, const SparseBatch& batch,
                        std::span<const float> weights, float bias, BatchResult* result,
                        std::vector<float>* scores) {
  PS_RETURN_IF_ERROR(CheckBatch(data, batch, weights.size()));
  Run(data, batch, weights, bias, {}, nullptr, result, scores);
  return Status::Ok();
}

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
