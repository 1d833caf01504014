#include "worker/model.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "worker/auc.h"
#include "worker/idx_reader.h"
#include "worker/libsvm_reader.h"
#include "worker/network.h"
#include "worker/wide_deep.h"

namespace ps {
namespace {

using nlohmann::json;

Status WaitAll(KVClient& client, const std::vector<Ticket>& tickets, RequestInfo* info,
               std::vector<std::vector<uint64_t>>* versions = nullptr) {
  Status first;
  if (versions != nullptr) versions->assign(tickets.size(), {});
  for (size_t i = 0; i < tickets.size(); ++i) {
    Ticket t = tickets[i];
    RequestInfo one;
    Status s = client.Wait(t, &one);
    if (versions != nullptr) (*versions)[i] = std::move(one.versions);
    if (first.ok()) first = s;
    // The requests were held side by side: the step waited as long as the longest.
    if (info != nullptr) {
      info->held_seconds = std::max(info->held_seconds, one.held_seconds);
      info->clock_lag = std::max(info->clock_lag, one.clock_lag);
    }
  }
  return first;
}

json EvalJson(const BatchResult& r) {
  const double n = static_cast<double>(std::max<int64_t>(1, r.examples));
  return {{"test_examples", r.examples},
          {"test_loss", r.loss_sum / n},
          {"test_accuracy", static_cast<double>(r.correct) / n}};
}

// ---- dense models (a --network, the MLP): every table pulled whole each step ----

// The network's parameter tensors are the first num_tables tables of the job.
class DenseModel final : public TrainableModel {
 public:
  DenseModel(const JobConfig& config, std::unique_ptr<Network> net, size_t num_tables,
             ImageDataset train, ImageDataset test)
      : config_(config), net_(std::move(net)), train_(std::move(train)), test_(std::move(test)) {
    for (size_t i = 0; i < num_tables; ++i) {
      const TableSpec& t = config_.table_specs[i];
      params_[0].emplace_back(t.rows * t.width);
      grads_.emplace_back(t.rows * t.width);
    }
    dim_ = static_cast<size_t>(train_.rows) * static_cast<size_t>(train_.cols);
  }

  int64_t train_examples() const override { return train_.count; }
  int max_batch() const override { return net_->max_batch(); }

  Status Pull(KVClient& client, std::span<const int64_t>, RequestInfo* info) override {
    return WaitAll(client, IssuePull(client, cur_, -1), info, &versions_);
  }

  bool CanPrefetch() const override { return true; }

  Status StartPull(KVClient& client, int64_t clock) override {
    if (!prefetch_.empty()) return Internal("a prefetch is already in flight");
    const int next = 1 - cur_;
    if (params_[next].empty()) params_[next] = params_[cur_];  // sized once, on first use
    prefetch_ = IssuePull(client, next, clock);
    return Status::Ok();
  }

  Status FinishPull(KVClient& client, RequestInfo* info) override {
    if (prefetch_.empty()) return Internal("no prefetch in flight");
    std::vector<Ticket> tickets = std::move(prefetch_);
    prefetch_.clear();
    // The buffers switch only now: the step that computed meanwhile read the other one.
    PS_RETURN_IF_ERROR(WaitAll(client, tickets, info, &versions_));
    cur_ = 1 - cur_;
    return Status::Ok();
  }

  Status Compute(std::span<const int64_t> examples, float grad_scale,
                 BatchResult* result) override {
    const size_t n = examples.size();
    x_.resize(n * dim_);
    y_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t e = static_cast<size_t>(examples[i]);
      std::memcpy(x_.data() + i * dim_, train_.pixels.data() + e * dim_, dim_ * sizeof(float));
      y_[i] = train_.labels[e];
    }
    std::vector<float*> grads;
    for (auto& g : grads_) grads.push_back(g.data());
    PS_RETURN_IF_ERROR(net_->ForwardBackward(x_.data(), y_.data(), static_cast<int>(n),
                                             ConstParams(), grads, result));
    if (grad_scale != 1.0f) {
      for (auto& g : grads_) {
        for (float& v : g) v *= grad_scale;
      }
    }
    pushed_versions_ = versions_;
    return Status::Ok();
  }

  void Push(KVClient& client, std::vector<Ticket>* tickets) override {
    KVClient::Corked batch(client);  // one message per server, not one per table
    for (size_t i = 0; i < grads_.size(); ++i) {
      const TableSpec& t = config_.table_specs[i];
      std::span<const uint64_t> v;
      if (i < pushed_versions_.size()) v = pushed_versions_[i];
      tickets->push_back(client.PushRange(t.id, RowRange{0, t.rows}, grads_[i], nullptr, v));
    }
  }

  std::vector<std::span<float>> DenseParams() override {
    return {params_[cur_].begin(), params_[cur_].end()};
  }
  std::vector<std::span<float>> DenseGrads() override { return {grads_.begin(), grads_.end()}; }

  Result<json> Evaluate(KVClient& client) override {
    PS_RETURN_IF_ERROR(Pull(client, {}, nullptr));
    BatchResult r;
    PS_RETURN_IF_ERROR(net_->Evaluate(test_.pixels.data(), test_.labels.data(),
                                      static_cast<int>(test_.count), ConstParams(), &r));
    return EvalJson(r);
  }

 private:
  std::vector<Ticket> IssuePull(KVClient& client, int buffer, int64_t clock) {
    std::vector<Ticket> tickets;
    KVClient::Corked batch(client);  // one message per server, not one per table
    for (size_t i = 0; i < params_[buffer].size(); ++i) {
      const TableSpec& t = config_.table_specs[i];
      tickets.push_back(
          client.PullRange(t.id, RowRange{0, t.rows}, params_[buffer][i], nullptr, clock));
    }
    return tickets;
  }

  std::vector<const float*> ConstParams() const {
    std::vector<const float*> p;
    for (const auto& v : params_[cur_]) p.push_back(v.data());
    return p;
  }

  const JobConfig& config_;
  std::unique_ptr<Network> net_;
  ImageDataset train_, test_;
  size_t dim_ = 0;
  // Two parameter buffers: Compute reads params_[cur_] while a prefetch fills the other.
  std::vector<std::vector<float>> params_[2];
  int cur_ = 0;
  std::vector<Ticket> prefetch_;  // the prefetch in flight, if any
  // Per table, the shard versions of the pull params_[cur_] came from, and of the pull the
  // last gradient was computed from (what its push reports).
  std::vector<std::vector<uint64_t>> versions_, pushed_versions_;
  std::vector<std::vector<float>> grads_;
  std::vector<float> x_;
  std::vector<int32_t> y_;
};

// ---- wide and deep (and sparse LR, its wide part alone): the batch's embedding rows and
// wide weights, the MLP whole ----

class WideDeepModel final : public TrainableModel {
 public:
  // Table ids follow NetworkSpec::Tables(): emb (unless input:sparse), the MLP's tables,
  // wide.weight, wide.bias.
  WideDeepModel(std::unique_ptr<WideDeep> net, CtrDataset train, CtrDataset test)
      : net_(std::move(net)), train_(std::move(train)), test_(std::move(test)) {
    for (const size_t n : net_->mlp_sizes()) {
      mlp_.emplace_back(n);
      mlp_grads_.emplace_back(n);
    }
    first_mlp_ = net_->dim() > 0 ? 1 : 0;
    wide_id_ = static_cast<uint32_t>(first_mlp_ + mlp_.size());
  }

  int64_t train_examples() const override { return train_.count; }
  int max_batch() const override { return net_->max_batch(); }

  Status Pull(KVClient& client, std::span<const int64_t> examples, RequestInfo* info) override {
    PS_ASSIGN_OR_RETURN(batch_, MakeCtrBatch(train_, examples));
    return WaitAll(client, IssuePull(client, batch_, &emb_, &wide_), info);
  }

  Status Compute(std::span<const int64_t> examples, float grad_scale,
                 BatchResult* result) override {
    if (examples.size() != batch_.examples.size()) {
      return Internal("Compute's examples differ from the last Pull's");
    }
    emb_grads_.resize(emb_.size());
    wide_grads_.resize(wide_.size());
    WideDeepGrads g{emb_grads_, wide_grads_, &wide_bias_grad_[0], {}};
    for (auto& v : mlp_grads_) g.mlp.push_back(v.data());
    PS_RETURN_IF_ERROR(net_->ForwardBackward(train_, batch_, Params(emb_, wide_), g, result));
    if (grad_scale != 1.0f) {
      for (auto* v : {&emb_grads_, &wide_grads_, &wide_bias_grad_}) {
        for (float& x : *v) x *= grad_scale;
      }
      for (auto& v : mlp_grads_) {
        for (float& x : v) x *= grad_scale;
      }
    }
    return Status::Ok();
  }

  void Push(KVClient& client, std::vector<Ticket>* tickets) override {
    KVClient::Corked batch(client);  // one message per server
    if (net_->dim() > 0) tickets->push_back(client.Push(kEmb, batch_.keys, emb_grads_));
    for (size_t i = 0; i < mlp_grads_.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(first_mlp_ + i);
      tickets->push_back(client.PushRange(id, RowRange{0, client.table(id).rows}, mlp_grads_[i]));
    }
    if (!net_->has_wide()) return;
    tickets->push_back(client.Push(wide_id_, batch_.keys, wide_grads_));
    tickets->push_back(client.PushRange(wide_id_ + 1, RowRange{0, 1}, wide_bias_grad_));
  }

  Result<json> Evaluate(KVClient& client) override {
    // In slices, so that the pulled rows of a large test set stay bounded.
    constexpr int64_t kSlice = 8192;
    BatchResult r;
    std::vector<float> scores, emb, wide;
    std::vector<int64_t> ids;
    for (int64_t begin = 0; begin < test_.count; begin += kSlice) {
      ids.clear();
      for (int64_t i = begin; i < std::min(test_.count, begin + kSlice); ++i) ids.push_back(i);
      PS_ASSIGN_OR_RETURN(CtrBatch batch, MakeCtrBatch(test_, ids));
      PS_RETURN_IF_ERROR(WaitAll(client, IssuePull(client, batch, &emb, &wide), nullptr));
      PS_RETURN_IF_ERROR(net_->Evaluate(test_, batch, Params(emb, wide), &r, &scores));
    }
    json out = EvalJson(r);
    out["test_auc"] = Auc(scores, test_.labels);
    return out;
  }

 private:
  static constexpr uint32_t kEmb = 0;

  // Pulls the rows of batch's keys into *emb and *wide, and the MLP and wide bias whole.
  std::vector<Ticket> IssuePull(KVClient& client, const CtrBatch& batch, std::vector<float>* emb,
                                std::vector<float>* wide) {
    emb->resize(batch.keys.size() * static_cast<size_t>(net_->dim()));
    wide->resize(net_->has_wide() ? batch.keys.size() : 0);
    std::vector<Ticket> tickets;
    KVClient::Corked cork(client);  // one message per server
    if (net_->dim() > 0) tickets.push_back(client.Pull(kEmb, batch.keys, *emb));
    for (size_t i = 0; i < mlp_.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(first_mlp_ + i);
      tickets.push_back(client.PullRange(id, RowRange{0, client.table(id).rows}, mlp_[i]));
    }
    if (net_->has_wide()) {
      tickets.push_back(client.Pull(wide_id_, batch.keys, *wide));
      tickets.push_back(client.PullRange(wide_id_ + 1, RowRange{0, 1}, wide_bias_));
    }
    return tickets;
  }

  WideDeepParams Params(const std::vector<float>& emb, const std::vector<float>& wide) const {
    WideDeepParams p{emb, wide, wide_bias_[0], {}};
    for (const auto& v : mlp_) p.mlp.push_back(v.data());
    return p;
  }

  std::unique_ptr<WideDeep> net_;
  CtrDataset train_, test_;
  uint32_t first_mlp_ = 0;  // the MLP's first table: after emb, if there is one
  uint32_t wide_id_ = 0;
  CtrBatch batch_;
  std::vector<float> emb_, wide_, emb_grads_, wide_grads_;
  std::vector<std::vector<float>> mlp_, mlp_grads_;
  std::vector<float> wide_bias_ = std::vector<float>(1), wide_bias_grad_ = std::vector<float>(1);
};

// The examples of a wide-and-deep network: LIBSVM rows for input:sparse, else CTR lines.
Result<CtrDataset> LoadCtrOrLibsvm(const JobConfig& config, const NetworkSpec& spec,
                                   const std::string& path) {
  LOG(INFO) << "loading " << path;
  if (!spec.sparse_input) return LoadCtr(path, static_cast<int>(spec.input.size()), spec.fields);
  LibsvmOptions o;
  o.hash_features = config.hash_features;
  PS_ASSIGN_OR_RETURN(SparseDataset rows, LoadLibsvm(path, o));
  return CtrFromLibsvm(std::move(rows));
}

}  // namespace

Result<std::unique_ptr<TrainableModel>> MakeWideDeepModel(const JobConfig& config, Kernels* kernels,
                                                          int max_batch, CtrDataset train,
                                                          CtrDataset test) {
  if (config.model != "wide_deep" && config.model != "sparse_lr") {
    return InvalidArgument("the job's model is not wide_deep or sparse_lr");
  }
  PS_ASSIGN_OR_RETURN(NetworkSpec spec, JobNetwork(config));
  const std::vector<TableSpec> tables = spec.Tables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (i >= config.table_specs.size() || config.table_specs[i].name != tables[i].name) {
      return Internal("the job's table " + std::to_string(i) + " does not match --network's '" +
                      tables[i].name + "'");
    }
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<WideDeep> net,
                      WideDeep::Create(spec, kernels, max_batch, config.seed));
  return std::unique_ptr<TrainableModel>(
      new WideDeepModel(std::move(net), std::move(train), std::move(test)));
}

Result<std::unique_ptr<TrainableModel>> MakeNetworkModel(const JobConfig& config, Kernels* kernels,
                                                         int max_batch, ImageDataset train,
                                                         ImageDataset test) {
  PS_ASSIGN_OR_RETURN(NetworkSpec spec, JobNetwork(config));
  const std::vector<TableSpec> tables = spec.Tables();
  for (size_t i = 0; i < tables.size(); ++i) {
    if (i >= config.table_specs.size() || config.table_specs[i].name != tables[i].name ||
        config.table_specs[i].rows * config.table_specs[i].width !=
            tables[i].rows * tables[i].width) {
      return Internal("the job's table " + std::to_string(i) + " does not match --network's '" +
                      tables[i].name + "'");
    }
  }
  PS_RETURN_IF_ERROR(
      CheckNetworkInput(config, spec, static_cast<int64_t>(train.rows) * train.cols,
                        std::to_string(train.rows) + "x" + std::to_string(train.cols)));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Network> net,
                      Network::Create(spec, kernels, max_batch, config.seed));
  return std::unique_ptr<TrainableModel>(
      new DenseModel(config, std::move(net), tables.size(), std::move(train), std::move(test)));
}

Result<std::unique_ptr<TrainableModel>> LoadModel(const JobConfig& config, Kernels* kernels,
                                                  int max_batch) {
  if (config.model == "mlp" || config.model == "network") {
    LOG(INFO) << "loading " << config.data_dir;
    PS_ASSIGN_OR_RETURN(ImageDataset train, LoadIdxDatasetCached(config.data_dir, "train"));
    PS_ASSIGN_OR_RETURN(ImageDataset test, LoadIdxDatasetCached(config.data_dir, "t10k"));
    return MakeNetworkModel(config, kernels, max_batch, std::move(train), std::move(test));
  }
  if (config.model == "sparse_lr" || config.model == "wide_deep") {
    PS_ASSIGN_OR_RETURN(NetworkSpec spec, JobNetwork(config));
    PS_ASSIGN_OR_RETURN(CtrDataset train, LoadCtrOrLibsvm(config, spec, config.train_data));
    CtrDataset test = CtrDataset::Empty(static_cast<int>(spec.input.size()), spec.fields);
    if (!config.test_data.empty()) {
      PS_ASSIGN_OR_RETURN(test, LoadCtrOrLibsvm(config, spec, config.test_data));
    }
    return MakeWideDeepModel(config, kernels, max_batch, std::move(train), std::move(test));
  }
  return InvalidArgument(
      "ps_worker trains --model=mlp, network, sparse_lr or wide_deep; this job's model is '" +
      config.model + "'");
}

}  // namespace ps
