#include "worker/wide_deep.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace ps {
namespace {

std::string Size(size_t n) { return std::to_string(n); }

}  // namespace

Result<CtrBatch> MakeCtrBatch(const CtrDataset& data, std::span<const int64_t> examples) {
  CtrBatch b;
  b.examples.assign(examples.begin(), examples.end());
  const size_t fields = static_cast<size_t>(data.fields);
  for (const int64_t e : examples) {
    if (e < 0 || e >= data.count) {
      return InvalidArgument("CTR batch: example " + std::to_string(e) + " is outside [0, " +
                             std::to_string(data.count) + ")");
    }
    const uint64_t* ids = data.ids_of(e);
    b.keys.insert(b.keys.end(), ids, ids + fields);
  }
  std::sort(b.keys.begin(), b.keys.end());
  b.keys.erase(std::unique(b.keys.begin(), b.keys.end()), b.keys.end());
  b.key_index.reserve(examples.size() * fields);
  for (const int64_t e : examples) {
    const uint64_t* ids = data.ids_of(e);
    for (size_t f = 0; f < fields; ++f) {
      const auto it = std::lower_bound(b.keys.begin(), b.keys.end(), ids[f]);
      b.key_index.push_back(static_cast<uint32_t>(it - b.keys.begin()));
    }
  }
  return b;
}

WideDeep::WideDeep(const NetworkSpec& spec, Kernels* kernels, int max_batch, uint64_t seed)
    : spec_(spec), kernels_(kernels), max_batch_(max_batch), seed_(seed) {}

Result<std::unique_ptr<WideDeep>> WideDeep::Create(const NetworkSpec& spec, Kernels* kernels,
                                                   int max_batch, uint64_t seed) {
  PS_RETURN_IF_ERROR(CheckNetworkForModel(spec, "wide_deep"));
  if (kernels->IsCuda()) {
    return FailedPrecondition(
        "--model=wide_deep runs on the CPU: expected ps_worker --device=cpu, "
        "not " +
        kernels->DeviceName());
  }
  if (max_batch < 1) return InvalidArgument("WideDeep: max_batch must be >= 1");
  std::unique_ptr<WideDeep> m(new WideDeep(spec, kernels, max_batch, seed));
  m->dim_ = spec.layers[0].units;
  m->fields_ = spec.fields;
  m->width_ = spec.layers[1].out.size();
  m->has_wide_ = spec.layers.back().kind == LayerKind::kWide;
  const size_t end = spec.layers.size() - (m->has_wide_ ? 1 : 0);
  const size_t mb = static_cast<size_t>(max_batch);
  size_t table = 0;
  for (size_t i = 2; i < end; ++i) {
    const LayerSpec& l = spec.layers[i];
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer, MakeLayer(l));
    PS_RETURN_IF_ERROR(layer->Allocate(kernels, max_batch));
    m->layers_.push_back(std::move(layer));
    m->first_table_.push_back(table);
    for (const TableSpec& t : l.tables) m->mlp_sizes_.push_back(t.rows * t.width);
    table += l.tables.size();
    m->act_.emplace_back(mb * static_cast<size_t>(l.out.size()));
    m->dact_.emplace_back(mb * static_cast<size_t>(l.out.size()));
  }
  m->x_.resize(mb * static_cast<size_t>(m->width_));
  m->dx_.resize(m->x_.size());
  m->logit_.resize(mb);
  m->dlogit_.resize(mb);
  m->y_.resize(mb);
  return m;
}

Status WideDeep::Check(const CtrDataset& data, const CtrBatch& batch,
                       const WideDeepParams& p) const {
  if (data.fields != fields_ || data.dense + int64_t{fields_} * dim_ != width_) {
    return InvalidArgument("WideDeep: the data has " + std::to_string(data.dense) + " dense and " +
                           std::to_string(data.fields) + " categorical fields, the network " +
                           std::to_string(width_ - int64_t{fields_} * dim_) + " and " +
                           std::to_string(fields_));
  }
  const size_t keys = batch.keys.size();
  if (batch.key_index.size() != batch.examples.size() * static_cast<size_t>(fields_)) {
    return InvalidArgument("WideDeep: key_index has " + Size(batch.key_index.size()) +
                           " entries, expected examples x fields");
  }
  for (const uint32_t k : batch.key_index) {
    if (k >= keys) return InvalidArgument("WideDeep: a key_index entry is out of range");
  }
  if (p.emb.size() != keys * static_cast<size_t>(dim_) || (has_wide_ && p.wide.size() != keys) ||
      p.mlp.size() != mlp_sizes_.size()) {
    return InvalidArgument("WideDeep: the parameters do not fit the batch's " + Size(keys) +
                           " keys (emb " + Size(p.emb.size()) + " floats, wide " +
                           Size(p.wide.size()) + ", " + Size(p.mlp.size()) + " MLP tables)");
  }
  return Status::Ok();
}

Status WideDeep::Forward(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                         size_t begin, int n, bool training) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t fields = static_cast<size_t>(fields_);
  const size_t width = static_cast<size_t>(width_);
  // The concat: each field's embedding row, then the dense features.
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    const int64_t e = batch.examples[begin + i];
    float* x = x_.data() + i * width;
    const uint32_t* ki = batch.key_index.data() + (begin + i) * fields;
    for (size_t f = 0; f < fields; ++f)
      std::memcpy(x + f * d, &p.emb[ki[f] * d], d * sizeof(float));
    std::memcpy(x + fields * d, data.values_of(e), static_cast<size_t>(data.dense) * sizeof(float));
    y_[i] = data.labels[static_cast<size_t>(e)];
  }
  const LayerBatch lb{n, training, seed_ + steps_};
  const float* in = x_.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const size_t nt = layers_[l]->spec().tables.size();
    const std::span<const float* const> params(p.mlp.data() + first_table_[l], nt);
    PS_RETURN_IF_ERROR(layers_[l]
                           ->Forward(lb, params, in, act_[l].data())
                           .WithContext("layer " + std::to_string(layers_[l]->spec().index) + " (" +
                                        layers_[l]->spec().text + ")"));
    in = act_[l].data();
  }
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    float z = in[i];
    if (has_wide_) {
      z += p.wide_bias;
      const uint32_t* ki = batch.key_index.data() + (begin + i) * fields;
      for (size_t f = 0; f < fields; ++f) z += p.wide[ki[f]];
    }
    logit_[i] = z;
  }
  return Status::Ok();
}

Status WideDeep::Backward(const CtrBatch& batch, const WideDeepParams& p, const WideDeepGrads& g,
                          int n) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t fields = static_cast<size_t>(fields_);
  const size_t width = static_cast<size_t>(width_);
  // dlogit_ is the gradient of the deep part's output and of the wide sum alike.
  std::memcpy(dact_.back().data(), dlogit_.data(), static_cast<size_t>(n) * sizeof(float));
  const LayerBatch lb{n, true, seed_ + steps_};
  for (size_t l = layers_.size(); l-- > 0;) {
    const size_t nt = layers_[l]->spec().tables.size();
    const std::span<const float* const> params(p.mlp.data() + first_table_[l], nt);
    const std::span<float* const> grads(g.mlp.data() + first_table_[l], nt);
    const float* in = l == 0 ? x_.data() : act_[l - 1].data();
    float* dx = l == 0 ? dx_.data() : dact_[l - 1].data();
    PS_RETURN_IF_ERROR(
        layers_[l]->Backward(lb, params, in, act_[l].data(), dact_[l].data(), grads, dx));
  }
  // Scatter-add into the rows: an id used by several examples (or fields) sums.
  std::fill(g.emb.begin(), g.emb.end(), 0.0f);
  std::fill(g.wide.begin(), g.wide.end(), 0.0f);
  float bias = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    const uint32_t* ki = batch.key_index.data() + i * fields;
    const float* dx = dx_.data() + i * width;
    for (size_t f = 0; f < fields; ++f) {
      float* row = &g.emb[ki[f] * d];
      for (size_t j = 0; j < d; ++j) row[j] += dx[f * d + j];
      if (has_wide_) g.wide[ki[f]] += dlogit_[i];
    }
    bias += dlogit_[i];
  }
  if (has_wide_) *g.wide_bias = bias;
  return Status::Ok();
}

Status WideDeep::ForwardBackward(const CtrDataset& data, const CtrBatch& batch,
                                 const WideDeepParams& p, const WideDeepGrads& g,
                                 BatchResult* result) {
  PS_RETURN_IF_ERROR(Check(data, batch, p));
  const int n = static_cast<int>(batch.examples.size());
  if (n > max_batch_) {
    return InvalidArgument("WideDeep: batch of " + std::to_string(n) + " exceeds max_batch " +
                           std::to_string(max_batch_));
  }
  if (g.emb.size() != p.emb.size() || g.wide.size() != p.wide.size() ||
      g.mlp.size() != mlp_sizes_.size() || (has_wide_ && g.wide_bias == nullptr)) {
    return InvalidArgument("WideDeep: the gradients do not have the parameters' shapes");
  }
  if (n == 0) {
    std::fill(g.emb.begin(), g.emb.end(), 0.0f);
    std::fill(g.wide.begin(), g.wide.end(), 0.0f);
    if (has_wide_) *g.wide_bias = 0;
    for (size_t t = 0; t < g.mlp.size(); ++t) std::fill(g.mlp[t], g.mlp[t] + mlp_sizes_[t], 0.0f);
    return Status::Ok();
  }
  ++steps_;
  PS_RETURN_IF_ERROR(Forward(data, batch, p, 0, n, true));
  double loss = 0;
  int64_t correct = 0;
  PS_RETURN_IF_ERROR(kernels_->SigmoidCrossEntropy(n, logit_.data(), y_.data(), 1.0f / n,
                                                   dlogit_.data(), &loss, &correct));
  PS_RETURN_IF_ERROR(Backward(batch, p, g, n));
  if (result != nullptr) {
    result->loss_sum += loss;
    result->correct += correct;
    result->examples += n;
  }
  return Status::Ok();
}

Status WideDeep::Evaluate(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                          BatchResult* result, std::vector<float>* scores) {
  PS_RETURN_IF_ERROR(Check(data, batch, p));
  const size_t total = batch.examples.size();
  for (size_t begin = 0; begin < total; begin += static_cast<size_t>(max_batch_)) {
    const int n = static_cast<int>(std::min(total - begin, static_cast<size_t>(max_batch_)));
    PS_RETURN_IF_ERROR(Forward(data, batch, p, begin, n, false));
    double loss = 0;
    int64_t correct = 0;
    PS_RETURN_IF_ERROR(kernels_->SigmoidCrossEntropy(n, logit_.data(), y_.data(), 1.0f,
                                                     dlogit_.data(), &loss, &correct));
    if (result != nullptr) {
      result->loss_sum += loss;
      result->correct += correct;
      result->examples += n;
    }
    if (scores != nullptr) {
      for (int i = 0; i < n; ++i) {
        const float z = logit_[static_cast<size_t>(i)];
        // Stable for any logit: exp of a non-positive number only.
        scores->push_back(z >= 0 ? 1.0f / (1.0f + std::exp(-z))
                                 : std::exp(z) / (1.0f + std::exp(z)));
      }
    }
  }
  return Status::Ok();
}

}  // namespace ps
