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
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/ctr_data.h"
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

// Zipf ranks 1..n with P(k) proportional to k^-s (s > 0), by rejection-inversion (Hormann
// and Derflinger 1996): O(1) per draw without a table over the ranks. Stateless after
// construction; the caller's generator supplies the randomness.
class ZipfSampler {
 public:
  ZipfSampler() = default;
  // REQUIRES: n >= 1, s > 0.
  ZipfSampler(uint64_t n, double s);
  uint64_t Draw(std::mt19937_64& rng) const;

 private:
  uint64_t n_ = 1;
  double s_ = 1;
  double h_integral_x1_ = 0;
  double h_integral_n_ = 0;
  double threshold_ = 0;
};

// A uniform double in [0, 1) from the top 53 bits of one draw.
inline double UniformFrom(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

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
  ZipfSampler zipf_;
  std::vector<uint64_t> draw_;  // scratch for Next
};

// Criteo-like click-through data with a known answer, for --model=wide_deep (worker/ctr_data.h
// has the file layout). Each example has `dense` numeric features drawn from N(0, 1) and one
// id in each of `fields` categorical fields. Field f has its own vocabulary, sizes growing
// geometrically from min_vocab (field 0) to max_vocab (the last field), and its own id range
// (ids are 1 + the sizes of the fields before it + rank - 1); within a field the rank follows
// a Zipf law, so a few values recur in most examples. The label is drawn from
// Bernoulli(sigmoid(z)), the hidden model being
//
//   z = bias + sum_f w_f[rank_f]                 wide: the `head` most frequent values of each
//                                                field have a N(0, wide_std^2) weight, the
//                                                long tail none
//       + sum_j u_j x_j + x_0 x_1                 dense: linear, and one product
//       + <e_0[rank_0], e_1[rank_1]>              a field interaction: 2-d hidden embeddings
//                                                of the values of fields 0 and 1
//
// with u_j ~ N(0, dense_std^2) and e ~ N(0, 0.8^2). The best AUC any model can reach on a
// test set is the AUC of the true probabilities there (BestAuc).
//
// Same randomness rules as SparseDataGenerator. Thread safety: used by one thread at a time.
struct CtrDataGenOptions {
  int dense = 13;
  int fields = 26;  // >= 2 (fields 0 and 1 interact)
  int64_t min_vocab = 10;
  int64_t max_vocab = 100'000;
  double zipf = 1.1;  // > 0
  int head = 50;      // values per field with a wide weight
  double wide_std = 0.4;
  double dense_std = 0.3;
  double bias = -1.0;  // about 30% positives
  uint64_t seed = 1;
};

class CtrDataGenerator {
 public:
  // Draws the hidden model. InvalidArgument for options out of range.
  static Result<CtrDataGenerator> Create(const CtrDataGenOptions& options);

  // The next example: `dense` values, `fields` ids, its label and true probability.
  void Next(float* values, uint64_t* ids, int32_t* label, double* prob);
  // Appends the next `examples` examples to *data (empty, or of this generator's shape) and
  // their true probabilities to *probs when not null.
  void Generate(int64_t examples, CtrDataset* data, std::vector<float>* probs);
  // Writes the next `examples` examples to `path` (worker/ctr_data.h), streaming; appends
  // their labels and true probabilities when the vectors are not null. Calls continue one
  // stream. Unavailable when the file cannot be written.
  Status WriteCtr(const std::string& path, int64_t examples, std::vector<int32_t>* labels,
                  std::vector<float>* probs);
  // Writes the hidden model and best_auc (the BestAuc of the test set) as text lines.
  Status WriteTruth(const std::string& path, double best_auc) const;

  // The AUC of the true probabilities: the best any model can score on these examples.
  static double BestAuc(std::span<const float> probs, std::span<const int32_t> labels);

  int64_t vocab(int field) const { return vocab_[static_cast<size_t>(field)]; }
  int64_t total_ids() const { return offsets_.back(); }
  const CtrDataGenOptions& options() const { return options_; }

 private:
  explicit CtrDataGenerator(const CtrDataGenOptions& options);

  CtrDataGenOptions options_;
  std::vector<int64_t> vocab_;    // per field
  std::vector<int64_t> offsets_;  // per field, the ids before it; then the total
  std::vector<ZipfSampler> zipf_;
  std::vector<std::vector<float>> wide_;  // per field, the weights of ranks 1..head
  std::vector<float> dense_w_;
  std::vector<std::vector<float>> emb_;  // fields 0 and 1: 2 floats per rank
  std::mt19937_64 rng_;
};

}  // namespace ps
