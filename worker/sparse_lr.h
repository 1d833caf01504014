// Sparse logistic regression, the model of click-through-rate prediction: one weight per
// feature id, held on the parameter server in a sparse table (width 1) keyed by the id, and
// one bias. A batch names the distinct ids its examples touch, so the worker pulls and
// pushes only those rows. No parameter-server code here: the caller pulls the weights for
// SparseBatch::keys, runs the model and pushes the gradients it returns.
//
// Thread safety: the functions share no state; call them from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/batch_result.h"
#include "worker/libsvm_reader.h"

namespace ps {

// The distinct feature ids of some examples and, for each of their (example, feature)
// pairs, which of those ids it uses.
struct SparseBatch {
  std::vector<uint64_t> keys;  // distinct feature ids, ascending: the rows to pull and push
  // One entry per feature of each example, the examples' features concatenated in the order
  // of `examples`: the index in `keys` of that feature's id.
  std::vector<uint32_t> key_index;
  std::vector<int64_t> examples;  // the examples, as indices into the data set
};

// Builds the batch of `examples` (indices into data, repeats allowed). An index outside
// [0, data.count) is kept in `examples` but contributes no features; the model functions
// below reject such a batch with InvalidArgument.
SparseBatch MakeSparseBatch(const SparseDataset& data, std::span<const int64_t> examples);

// For each example, p = sigmoid(bias + sum over its features of weight[key] * value), and
// its log loss -(y log p + (1 - y) log(1 - p)), computed without overflow for any logit.
// weights[k] is the weight of batch.keys[k]. Writes the gradient of the MEAN loss over the
// batch into grads (overwriting; grads[k] belongs to keys[k]) and *bias_grad, and adds the
// batch's loss sum, correct count (p >= 0.5 matching the label) and size to *result (may
// be null). An empty batch writes zero gradients and leaves *result as it was.
// InvalidArgument when weights or grads do not have keys.size() entries, bias_grad is null,
// the batch does not fit the data (an example out of range, a key_index of the wrong
// length or out of range) or a label is not 0 or 1; on error *result is unchanged and the
// gradients are unspecified.
Status SparseLrForwardBackward(const SparseDataset& data, const SparseBatch& batch,
                               std::span<const float> weights, float bias, std::span<float> grads,
                               float* bias_grad, BatchResult* result);

// Forward only, for evaluation: adds to *result (may be null) like SparseLrForwardBackward
// and appends each example's probability p, in batch order, to *scores when not null.
// Same errors, except that there are no gradients; on error neither output is changed.
Status SparseLrEvaluate(const SparseDataset& data, const SparseBatch& batch,
                        std::span<const float> weights, float bias, BatchResult* result,
                        std::vector<float>* scores);

// Area under the ROC curve: the probability that a random positive scores above a random
// negative, ties counted half. labels are 0 or 1 (anything non-zero counts as 1); a NaN
// score ranks below every other score. 0.5 when either class is absent.
// REQUIRES: scores.size() == labels.size() (only the common prefix is used otherwise).
double Auc(std::span<const float> scores, std::span<const int32_t> labels);

}  // namespace ps
