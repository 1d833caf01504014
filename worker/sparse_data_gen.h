// Synthetic click-through-rate data with a known answer, for sparse logistic regression:
// a true weight per feature id (a fraction of them non-zero, drawn from a normal), examples
// that each hold `nnz` distinct binary features whose popularity follows a Zipf law (a few
// ids recur in most examples, most ids are rare, as in real CTR logs), and labels drawn from
// Bernoulli(sigmoid(bias + sum of the example's true weights)).
//
// Every draw comes from std::mt19937_64 (whose output the standard fixes) through
// hand-written transforms, so one seed gives the same files with any standard library.
//
// Thread safety: a SparseDataGenerator is used by one thread at a time.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/libsvm_reader.h"

namespace ps {

struct SparseDataGenOptions {
  int64_t features = 1'000'000;   // feature ids are 1..features (LIBSVM numbers from 1)
  int nnz = 20;                   // distinct features per example, in [1, features]
  double zipf = 1.1;              // exponent of feature popularity, >= 0; 0 = uniform
  double nonzero_fraction = 0.2;  // share of features with a non-zero true weight, [0, 1]
  // Standard deviation of the true logit (bias aside) over examples: the weights are drawn
  // from N(0, logit_std^2 / (nnz * nonzero_fraction)). 4 gives a Bayes AUC of 0.92-0.94.
  double logit_std = 4.0;
  double bias = 0.0;  // true bias; negative values make positives rarer, as in CTR data
  uint64_t seed = 1;
};

class SparseDataGenerator {
 public:
  // Draws the true weights (features floats of memory). InvalidArgument for options out
  // of range.
  static Result<SparseDataGenerator> Create(const SparseDataGenOptions& options);

  // Draws the next example: its feature ids (distinct, ascending), label (0 or 1) and true
  // probability of label 1.
  void Next(std::vector<uint64_t>* ids, int32_t* label, double* prob);

  // Appends the next `examples` examples to *data (values 1; data may start empty, with no
  // offsets), and their true probabilities to *probs when not null.
  void Generate(int64_t examples, SparseDataset* data, std::vector<float>* probs);

  // Writes the next `examples` examples to `path` in LIBSVM format ("1 ID:1 ID:1 ..." or
  // "0 ..."), streaming. Calls continue one stream: a second file holds fresh examples
  // from the same distribution, e.g. a held-out test set. Unavailable when the file
  // cannot be written.
  Status WriteLibsvm(const std::string& path, int64_t examples);

  // Writes "ID WEIGHT" lines for the non-zero true weights, ascending by id, and a first
  // line "# bias B".
  Status WriteTruth(const std::string& path) const;

  // The true weight of a feature id; 0 for ids outside 1..features.
  float weight(uint64_t id) const {
    return id >= 1 && id <= weights_.size() ? weights_[id - 1] : 0.0f;
  }
  const SparseDataGenOptions& options() const { return options_; }

 private:
  explicit SparseDataGenerator(const SparseDataGenOptions& options);

  double Uniform();     // in [0, 1)
  uint64_t DrawRank();  // 1-based popularity rank

  SparseDataGenOptions options_;
  std::vector<float> weights_;  // by id - 1
  std::mt19937_64 rng_;         // example stream
  // Popular ranks are spread over the id space by id = (multiplier * (rank - 1) + shift)
  // mod features + 1, a bijection: a range-sharded table sees the hot ids on every shard.
  uint64_t multiplier_ = 1;
  uint64_t shift_ = 0;
  // Rejection-inversion Zipf sampler (Hormann and Derflinger 1996), O(1) per draw without
  // a table over the ids.
  double h_integral_x1_ = 0;
  double h_integral_n_ = 0;
  double s_ = 0;
  std::vector<uint64_t> draw_;  // scratch for Next
};

}  // namespace ps
