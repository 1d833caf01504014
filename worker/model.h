// What the training loop trains: a model, its data, and how its parameters map to tables,
// behind the four things a step does (pull, compute, push) plus evaluation. The loop knows
// nothing of layers or features; a model knows nothing of leases, clocks or reports.
//
//   Network (--model=network): the layers of --network (worker/network.h), dense tables
//     convN.* / fcN.* pulled whole every step; IDX image data (Fashion-MNIST).
//   MLP (--model=mlp): the network of --mlp_layers (MlpNetwork, common/network_config.h):
//     dense tables fcL.weight / fcL.bias, run as above.
//   Sparse logistic regression (--model=sparse_lr): the network kSparseLrNetwork
//     (input:sparse,wide,sigmoid_ce), run as wide and deep below: a sparse table
//     `wide.weight` of width 1 keyed by feature id and a one-row `wide.bias`; each step pulls
//     only the features its batch touches. LIBSVM data.
//   Wide and deep (--model=wide_deep): the --network with embedding, concat and wide
//     (worker/wide_deep.h): sparse tables `emb` and `wide.weight` keyed by id, of which each
//     step pulls the batch's ids, and the MLP's dense tables, pulled whole. CTR data
//     (worker/ctr_data.h), or LIBSVM rows for input:sparse.
//
// Thread model: used by one thread (the training loop's).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/batch_result.h"
#include "worker/ctr_data.h"
#include "worker/idx_reader.h"
#include "worker/kv_client.h"

namespace ps {

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  virtual int64_t train_examples() const = 0;
  // The largest batch Compute accepts.
  virtual int max_batch() const = 0;
  // Pulls the parameters `examples` (positions in the training set) need, all requests in
  // flight together; the longest hold and clock lag of them go into *info.
  virtual Status Pull(KVClient& client, std::span<const int64_t> examples, RequestInfo* info) = 0;
  // The gradient of the batch's mean loss, times grad_scale, from the last pull.
  virtual Status Compute(std::span<const int64_t> examples, float grad_scale,
                         BatchResult* result) = 0;
  // Pushes the last gradient; appends one ticket per request.
  virtual void Push(KVClient& client, std::vector<Ticket>* tickets) = 0;

  // Prefetch, for models whose pulls do not depend on the batch (the MLP): StartPull issues
  // the next step's pull into a second buffer, tagged with `clock` (the clock the rows will
  // be used at), and returns at once; FinishPull waits for it and makes it the parameters
  // the next Compute uses (instead of Pull). The push of the step computing meanwhile still
  // carries the versions of the pull it was computed from.
  virtual bool CanPrefetch() const { return false; }
  virtual Status StartPull(KVClient&, int64_t) {
    return FailedPrecondition("this model does not prefetch");
  }
  virtual Status FinishPull(KVClient&, RequestInfo*) {
    return FailedPrecondition("this model does not prefetch");
  }
  // Pulls the current model and evaluates the test set: {"test_examples", "test_loss",
  // "test_accuracy"} and, for binary models, "test_auc".
  virtual Result<nlohmann::json> Evaluate(KVClient& client) = 0;

  // Dense models (all-reduce groups): the host buffers of the parameters of the last pull
  // and of the last gradient, one span per table; a member of a group gets the former from
  // its leader instead of pulling and sends the latter to be summed. Empty: the model
  // cannot train in a group.
  virtual std::vector<std::span<float>> DenseParams() { return {}; }
  virtual std::vector<std::span<float>> DenseGrads() { return {}; }
};

// The network of the job (JobNetwork: --network, or the MLP of --mlp_layers) on these data
// sets; its input shape must hold the images' pixels (e.g. input:1x28x28 for 28x28 images).
Result<std::unique_ptr<TrainableModel>> MakeNetworkModel(const JobConfig& config, Kernels* kernels,
                                                         int max_batch, ImageDataset train,
                                                         ImageDataset test);

// The wide-and-deep model of config.network (--model=wide_deep) on these data sets.
Result<std::unique_ptr<TrainableModel>> MakeWideDeepModel(const JobConfig& config, Kernels* kernels,
                                                          int max_batch, CtrDataset train,
                                                          CtrDataset test);

// Loads the job's data (config.data_dir, or config.train_data / test_data) and builds its
// model. max_batch bounds the batches the model will be asked to compute.
Result<std::unique_ptr<TrainableModel>> LoadModel(const JobConfig& config, Kernels* kernels,
                                                  int max_batch);

}  // namespace ps
