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
  const bool variable = data.fields == 0;
  if (variable && data.id_offsets.size() != static_cast<size_t>(data.count) + 1) {
    return InvalidArgument("CTR batch: " + std::to_string(data.id_offsets.size()) +
                           " id offsets for " + std::to_string(data.count) + " examples");
  }
  CtrBatch b;
  b.examples.assign(examples.begin(), examples.end());
  for (const int64_t e : examples) {
    if (e < 0 || e >= data.count) {
      return InvalidArgument("CTR batch: example " + std::to_string(e) + " is outside [0, " +
                             std::to_string(data.count) + ")");
    }
    const int64_t begin = data.ids_begin(e);
    const int64_t end = data.ids_end(e);
    if (begin < 0 || end < begin || end > static_cast<int64_t>(data.ids.size()) ||
        (variable && end > static_cast<int64_t>(data.id_values.size()))) {
      return InvalidArgument("CTR batch: example " + std::to_string(e) + "'s ids [" +
                             std::to_string(begin) + ", " + std::to_string(end) +
                             ") are outside the data set's " + std::to_string(data.ids.size()));
    }
    b.keys.insert(b.keys.end(), data.ids.begin() + begin, data.ids.begin() + end);
  }
  // One key_index entry (and value) per id gathered, before the dedupe shrinks the count.
  b.key_index.reserve(b.keys.size());
  if (variable) b.values.reserve(b.keys.size());
  // Sort and dedupe: cheaper than a hash map for the few thousand ids of a batch, and the
  // sorted keys are what a range-sharded table wants anyway.
  std::sort(b.keys.begin(), b.keys.end());
  b.keys.erase(std::unique(b.keys.begin(), b.keys.end()), b.keys.end());
  b.offsets.reserve(examples.size() + 1);
  b.offsets.push_back(0);
  for (const int64_t e : examples) {
    for (int64_t j = data.ids_begin(e); j < data.ids_end(e); ++j) {
      const auto it = std::lower_bound(b.keys.begin(), b.keys.end(), data.ids[j]);
      b.key_index.push_back(static_cast<uint32_t>(it - b.keys.begin()));
      if (variable) b.values.push_back(data.id_values[j]);
    }
    b.offsets.push_back(static_cast<int64_t>(b.key_index.size()));
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
  m->has_wide_ = spec.layers.back().kind == LayerKind::kWide;
  if (!spec.sparse_input) {  // else no embedding, concat or MLP: the wide part alone
    m->dim_ = spec.layers[0].units;
    m->fields_ = spec.fields;
    m->width_ = spec.layers[1].out.size();
  }
  const size_t end = spec.layers.size() - (m->has_wide_ ? 1 : 0);
  const size_t mb = static_cast<size_t>(max_batch);
  size_t table = 0;
  for (size_t i = spec.sparse_input ? end : 2; i < end; ++i) {
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
  if (spec_.sparse_input
          ? data.fields != 0 || data.dense != 0
          : data.fields != fields_ || data.dense + int64_t{fields_} * dim_ != width_) {
    return InvalidArgument("WideDeep: the data has " + std::to_string(data.dense) + " dense and " +
                           std::to_string(data.fields) + " categorical fields, the network " +
                           std::to_string(width_ - int64_t{fields_} * dim_) + " and " +
                           std::to_string(fields_) +
                           (spec_.sparse_input ? " (input:sparse reads LIBSVM rows)" : ""));
  }
  const size_t keys = batch.keys.size();
  const size_t n = batch.examples.size();
  const size_t entries = batch.key_index.size();
  if (batch.offsets.size() != n + 1 || batch.offsets.front() != 0 ||
      batch.offsets.back() != static_cast<int64_t>(entries) ||
      (!batch.values.empty() && batch.values.size() != entries) ||
      (fields_ > 0 && entries != n * static_cast<size_t>(fields_))) {
    return InvalidArgument("WideDeep: the batch's " + Size(entries) + " ids, " +
                           Size(batch.offsets.size()) + " offsets and " +
                           Size(batch.values.size()) + " values do not fit its " + Size(n) +
                           " examples; was it made by MakeCtrBatch from this data?");
  }
  if (data.fields == 0 && data.id_offsets.size() != static_cast<size_t>(data.count) + 1) {
    return InvalidArgument("WideDeep: the data has " + Size(data.id_offsets.size()) +
                           " id offsets for " + std::to_string(data.count) + " examples");
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t e = batch.examples[i];
    if (e < 0 || e >= data.count) {
      return InvalidArgument("WideDeep: example " + std::to_string(e) + " is outside [0, " +
                             std::to_string(data.count) + ")");
    }
    // Each example's ids, as many as the data gives it: a batch of other data is refused.
    if (batch.offsets[i + 1] < batch.offsets[i] ||
        batch.offsets[i + 1] - batch.offsets[i] != data.ids_end(e) - data.ids_begin(e)) {
      return InvalidArgument("WideDeep: the batch gives example " + std::to_string(e) + " " +
                             std::to_string(batch.offsets[i + 1] - batch.offsets[i]) +
                             " ids, the data " +
                             std::to_string(data.ids_end(e) - data.ids_begin(e)) +
                             "; was the batch made from this data?");
    }
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
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    y_[i] = data.labels[static_cast<size_t>(batch.examples[begin + i])];
  }
  const float* deep = nullptr;  // the deep part's logits; none for input:sparse
  if (!spec_.sparse_input) {
    Concat(data, batch, p, begin, n);
    const LayerBatch lb{n, training, seed_ + steps_};
    deep = x_.data();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t nt = layers_[l]->spec().tables.size();
      const std::span<const float* const> params(p.mlp.data() + first_table_[l], nt);
      PS_RETURN_IF_ERROR(layers_[l]
                             ->Forward(lb, params, deep, act_[l].data())
                             .WithContext("layer " + std::to_string(layers_[l]->spec().index) +
                                          " (" + layers_[l]->spec().text + ")"));
      deep = act_[l].data();
    }
  }
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    float z = deep != nullptr ? deep[i] : 0.0f;
    if (has_wide_) {
      z += p.wide_bias;
      for (int64_t j = batch.offsets[begin + i]; j < batch.offsets[begin + i + 1]; ++j) {
        z += p.wide[batch.key_index[j]] * (batch.values.empty() ? 1.0f : batch.values[j]);
      }
    }
    logit_[i] = z;
  }
  return Status::Ok();
}

void WideDeep::Concat(const CtrDataset& data, const CtrBatch& batch, const WideDeepParams& p,
                      size_t begin, int n) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t fields = static_cast<size_t>(fields_);
  const size_t width = static_cast<size_t>(width_);
  // Each field's embedding row, then the dense features.
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    float* x = x_.data() + i * width;
    const uint32_t* ki = batch.key_index.data() + batch.offsets[begin + i];
    for (size_t f = 0; f < fields; ++f)
      std::memcpy(x + f * d, &p.emb[ki[f] * d], d * sizeof(float));
    std::memcpy(x + fields * d, data.values_of(batch.examples[begin + i]),
                static_cast<size_t>(data.dense) * sizeof(float));
  }
}

Status WideDeep::Backward(const CtrBatch& batch, const WideDeepParams& p, const WideDeepGrads& g,
                          int n) {
  const size_t d = static_cast<size_t>(dim_);
  const size_t fields = static_cast<size_t>(fields_);
  const size_t width = static_cast<size_t>(width_);
  if (!layers_.empty()) {
    // dlogit_ is the gradient of the deep part's output and of the wide sum alike.
    std::memcpy(dact_.back().data(), dlogit_.data(), static_cast<size_t>(n) * sizeof(float));
  }
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
    const uint32_t* ki = batch.key_index.data() + batch.offsets[i];
    const float* dx = dx_.data() + i * width;
    for (size_t f = 0; f < fields; ++f) {
      float* row = &g.emb[ki[f] * d];
      for (size_t j = 0; j < d; ++j) row[j] += dx[f * d + j];
    }
    if (has_wide_) {
      for (int64_t j = batch.offsets[i]; j < batch.offsets[i + 1]; ++j) {
        g.wide[batch.key_index[j]] += dlogit_[i] * (batch.values.empty() ? 1.0f : batch.values[j]);
      }
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
