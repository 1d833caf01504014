// Wide-and-deep click-through model (Cheng et al. 2016), the compute of --model=wide_deep:
//
//   deep:  concat(emb[id_0], ..., emb[id_{F-1}], dense features) -> the --network's dense,
//          relu and dropout layers -> one logit
//   wide:  + wide.bias + sum over fields of wide.weight[id_f]        (when --network has wide)
//   loss:  sigmoid cross-entropy of the sum
//
// With input:sparse (LIBSVM rows: any number of id:value features an example) there is no
// deep part: the logit is wide.bias + sum of wide.weight[id] * value, sparse logistic
// regression (--model=sparse_lr).
//
// The embedding rows (table `emb`, width DIM) and wide weights (`wide.weight`, width 1) are
// rows of sparse server tables keyed by id, so a batch pulls and pushes only the ids it
// touches (and spilled rows come back from disk on their own); the MLP's tables are dense
// and pulled whole. No parameter-server code here: the caller pulls the rows of
// CtrBatch::keys, runs the model and pushes the gradients (worker/model.cc does).
//
// The MLP runs as the kernels-backed layers of worker/layer.h, on the CPU backend: the
// lookups and scatter-adds of the sparse rows are host loops.
//
// Thread model: a WideDeep is used by one thread (the training loop's), like its Kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/network_config.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/batch_result.h"
#include "worker/ctr_data.h"
#include "worker/layer.h"

namespace ps {

// The distinct ids of some examples and, per (example, id), which of them it uses.
struct CtrBatch {
  std::vector<uint64_t> keys;  // distinct ids, ascending: the rows to pull and push
  // The examples' ids in batch order, as indices into keys; example i's are the entries
  // [offsets[i], offsets[i + 1]) (examples x fields in all for CTR data).
  std::vector<uint32_t> key_index;
  std::vector<int64_t> offsets;   // examples + 1
  std::vector<float> values;      // parallel to key_index: LIBSVM's values; empty: each id is 1
  std::vector<int64_t> examples;  // indices into the data set
};

// The batch of `examples` (repeats allowed). InvalidArgument for an example outside
// [0, data.count) or variable-length data whose offsets do not fit its ids.
Result<CtrBatch> MakeCtrBatch(const CtrDataset& data, std::span<const int64_t> examples);

// One batch's parameters, as pulled: host memory.
struct WideDeepParams {
  std::span<const float> emb;   // keys x DIM (empty for input:sparse)
  std::span<const float> wide;  // keys (empty without a wide layer)
  float wide_bias = 0;
  std::vector<const float*> mlp;  // the MLP layers' tables, in NetworkSpec::Tables() order
};

// Where the gradients of the batch's mean loss go (overwritten), same shapes.
struct WideDeepGrads {
  std::span<float> emb;
  std::span<float> wide;
  float* wide_bias = nullptr;
  std::vector<float*> mlp;
};

class WideDeep {
 public:
  // spec must pass CheckNetworkForModel(spec, "wide_deep"). kernels: the CPU backend,
  // borrowed. FailedPrecondition on a CUDA backend; InvalidArgument for max_batch < 1.
  static Result<std::unique_ptr<WideDeep>> Create(const NetworkSpec& spec, Kernels* kernels,
                                                  int max_batch, uint64_t seed);

  // Trains on a batch: adds its loss sum, correct count and size to *result (may be null).
  // InvalidArgument when the batch, parameters or gradients do not fit (sizes, a batch over
  // max_batch, a dataset of another shape).
  Status ForwardBackward(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                         const WideDeepGrads& g, BatchResult* result);

  // Forward only (dropout off), in slices of max_batch: adds to *result and appends each
  // example's probability to *scores when not null.
  Status Evaluate(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                  BatchResult* result, std::vector<float>* scores);

  int dim() const { return dim_; }  // 0 without an embedding (input:sparse)
  bool has_wide() const { return has_wide_; }
  // Float counts of the MLP's tables.
  const std::vector<size_t>& mlp_sizes() const { return mlp_sizes_; }
  int max_batch() const { return max_batch_; }

 private:
  WideDeep(const NetworkSpec& spec, Kernels* kernels, int max_batch, uint64_t seed);
  Status Check(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p) const;
  // The logits of examples [begin, begin + n) of the batch into logit_ (training: dropout on).
  Status Forward(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                 size_t begin, int n, bool training);
  // The embeddings and dense features of examples [begin, begin + n) into x_.
  void Concat(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p, size_t begin,
              int n);
  Status Backward(const CtrBatch& batch, const WideDeepParams& p, const WideDeepGrads& g, int n);

  const NetworkSpec spec_;
  Kernels* const kernels_;
  const int max_batch_;
  const uint64_t seed_;
  uint64_t steps_ = 0;
  int dim_ = 0;
  int fields_ = 0;
  int64_t width_ = 0;  // the concat's width: fields * dim + dense
  bool has_wide_ = false;
  std::vector<std::unique_ptr<Layer>> layers_;  // the MLP
  std::vector<size_t> first_table_;             // per MLP layer, its first table in `mlp`
  std::vector<size_t> mlp_sizes_;
  std::vector<float> x_, dx_;                   // the concat and its gradient, max_batch x width
  std::vector<std::vector<float>> act_, dact_;  // per MLP layer
  std::vector<float> logit_, dlogit_;
  std::vector<int32_t> y_;
};

}  // namespace ps
