#include "worker/sparse_data_gen.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numbers>
#include <numeric>

#include "worker/auc.h"

namespace ps {
namespace {

// The truth vector is held in memory: 4 GB of floats is the sane limit.
constexpr int64_t kMaxFeatures = 1'000'000'000;
// Rounds of redrawing duplicate ids before the remaining ids of an example are drawn
// uniformly: with a steep Zipf law and a large nnz the top ids alone cannot fill an example.
constexpr int kMaxZipfRounds = 16;

// Seeds for the weight stream and the example stream, decorrelated by SplitMix64 so that
// the truth does not depend on how many examples are drawn.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Box-Muller: one standard normal from two uniforms (the second value is not kept: the
// weights are drawn once, speed does not matter there).
double NormalFrom(std::mt19937_64& rng) {
  const double u1 = 1.0 - UniformFrom(rng);  // (0, 1]: log is finite
  const double u2 = UniformFrom(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

// Helpers of the rejection-inversion sampler: log1p(x)/x and expm1(x)/x, with their limits
// near 0 where the quotients lose precision.
double Helper1(double x) {
  return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}
double Helper2(double x) {
  return std::fabs(x) > 1e-8 ? std::expm1(x) / x
                             : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

// H(x), the integral of h(x) = x^-s, shifted so that it is defined for s = 1, and its
// inverse.
double HIntegral(double x, double s) {
  const double log_x = std::log(x);
  return Helper2((1.0 - s) * log_x) * log_x;
}
double H(double x, double s) { return std::exp(-s * std::log(x)); }
double HIntegralInverse(double x, double s) {
  double t = x * (1.0 - s);
  if (t < -1.0) t = -1.0;  // rounding can push it past the pole
  return std::exp(Helper1(t) * x);
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

Result<File> OpenForWrite(const std::string& path) {
  errno = 0;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return Unavailable("cannot write " + path + ": " + std::strerror(errno));
  }
  // A large buffer: the files run to hundreds of MB of short tokens.
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  return File(f);
}

Status Close(File file, const std::string& path) {
  const bool failed = std::ferror(file.get()) != 0;
  const int rc = std::fclose(file.release());
  if (failed || rc != 0) {
    return Unavailable("cannot write " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double s)
    : n_(n),
      s_(s),
      h_integral_x1_(HIntegral(1.5, s) - 1.0),
      h_integral_n_(HIntegral(static_cast<double>(n) + 0.5, s)),
      threshold_(2.0 - HIntegralInverse(HIntegral(2.5, s) - H(2.0, s), s)) {}

uint64_t ZipfSampler::Draw(std::mt19937_64& rng) const {
  while (true) {
    // u is uniform in (H(1.5) - 1, H(n + 0.5)]; x = H^-1(u) has the continuous density
    // x^-s, and k = round(x) is accepted with the probability that makes it Zipf.
    const double u = h_integral_n_ + UniformFrom(rng) * (h_integral_x1_ - h_integral_n_);
    const double x = HIntegralInverse(u, s_);
    uint64_t k = static_cast<uint64_t>(std::max(x + 0.5, 1.0));
    k = std::min(k, n_);
    const double kd = static_cast<double>(k);
    if (kd - x <= threshold_ || u >= HIntegral(kd + 0.5, s_) - H(kd, s_)) return k;
  }
}

SparseDataGenerator::SparseDataGenerator(const SparseDataGenOptions& options)
    : options_(options), rng_(SplitMix64(options.seed ^ 0x5eed0fe8a3b1e5ULL)) {}

Result<SparseDataGenerator> SparseDataGenerator::Create(const SparseDataGenOptions& options) {
  if (options.features < 1 || options.features > kMaxFeatures) {
    return InvalidArgument("sparse data: features must be in [1, " + std::to_string(kMaxFeatures) +
                           "], got " + std::to_string(options.features));
  }
  if (options.nnz < 1 || options.nnz > options.features) {
    return InvalidArgument(
        "sparse data: nnz must be in [1, features=" + std::to_string(options.features) + "], got " +
        std::to_string(options.nnz));
  }
  if (!(options.zipf >= 0 && options.zipf <= 100)) {
    return InvalidArgument("sparse data: zipf must be in [0, 100], got " +
                           std::to_string(options.zipf));
  }
  if (!(options.nonzero_fraction >= 0 && options.nonzero_fraction <= 1)) {
    return InvalidArgument("sparse data: nonzero_fraction must be in [0, 1], got " +
                           std::to_string(options.nonzero_fraction));
  }
  if (!(options.logit_std >= 0 && options.logit_std <= 1e3)) {
    return InvalidArgument("sparse data: logit_std must be in [0, 1000], got " +
                           std::to_string(options.logit_std));
  }
  if (!std::isfinite(options.bias)) {
    return InvalidArgument("sparse data: bias must be finite, got " + std::to_string(options.bias));
  }

  SparseDataGenerator gen(options);
  const uint64_t n = static_cast<uint64_t>(options.features);

  // The true weights, from their own stream.
  std::mt19937_64 weight_rng(SplitMix64(options.seed));
  const double expected_nonzero = options.nnz * options.nonzero_fraction;
  const double sigma = expected_nonzero > 0 ? options.logit_std / std::sqrt(expected_nonzero) : 0;
  gen.weights_.assign(n, 0.0f);
  for (float& w : gen.weights_) {
    if (UniformFrom(weight_rng) < options.nonzero_fraction) {
      w = static_cast<float>(sigma * NormalFrom(weight_rng));
    }
  }

  // A multiplier near n / golden ratio that is coprime with n, so that neighbouring ranks
  // land far apart.
  gen.multiplier_ = std::max<uint64_t>(1, static_cast<uint64_t>(n / std::numbers::phi));
  while (std::gcd(gen.multiplier_, n) != 1) ++gen.multiplier_;
  gen.shift_ = SplitMix64(options.seed + 1) % n;

  if (options.zipf > 0) gen.zipf_ = ZipfSampler(n, options.zipf);
  return gen;
}

double SparseDataGenerator::Uniform() { return UniformFrom(rng_); }

uint64_t SparseDataGenerator::DrawRank() {
  const uint64_t n = static_cast<uint64_t>(options_.features);
  if (options_.zipf == 0) return 1 + static_cast<uint64_t>(Uniform() * static_cast<double>(n)) % n;
  return zipf_.Draw(rng_);
}

void SparseDataGenerator::Next(std::vector<uint64_t>* ids, int32_t* label, double* prob) {
  const uint64_t n = static_cast<uint64_t>(options_.features);
  const size_t nnz = static_cast<size_t>(options_.nnz);
  ids->clear();
  // Draw, drop duplicates, draw the shortfall; popular ids repeat often, so a few rounds.
  for (int round = 0; ids->size() < nnz; ++round) {
    const bool zipf = round < kMaxZipfRounds;
    while (ids->size() < nnz) {
      const uint64_t rank =
          zipf ? DrawRank() : 1 + static_cast<uint64_t>(Uniform() * static_cast<double>(n)) % n;
      const uint64_t id =
          static_cast<uint64_t>(
              (static_cast<unsigned __int128>(multiplier_) * (rank - 1) + shift_) % n) +
          1;
      ids->push_back(id);
    }
    std::sort(ids->begin(), ids->end());
    ids->erase(std::unique(ids->begin(), ids->end()), ids->end());
  }
  double z = options_.bias;
  for (const uint64_t id : *ids) z += weights_[id - 1];
  *prob = Sigmoid(z);
  *label = Uniform() < *prob ? 1 : 0;
}

void SparseDataGenerator::Generate(int64_t examples, SparseDataset* data,
                                   std::vector<float>* probs) {
  if (data->offsets.empty()) data->offsets.push_back(static_cast<int64_t>(data->features.size()));
  std::vector<uint64_t> ids;
  int32_t label = 0;
  double prob = 0;
  for (int64_t i = 0; i < examples; ++i) {
    Next(&ids, &label, &prob);
    data->features.insert(data->features.end(), ids.begin(), ids.end());
    data->values.insert(data->values.end(), ids.size(), 1.0f);
    data->labels.push_back(label);
    data->offsets.push_back(static_cast<int64_t>(data->features.size()));
    ++data->count;
    if (probs != nullptr) probs->push_back(static_cast<float>(prob));
  }
}

Status SparseDataGenerator::WriteLibsvm(const std::string& path, int64_t examples) {
  PS_ASSIGN_OR_RETURN(File file, OpenForWrite(path));
  std::vector<uint64_t> ids;
  std::string line;
  int32_t label = 0;
  double prob = 0;
  char num[24];
  for (int64_t i = 0; i < examples; ++i) {
    Next(&ids, &label, &prob);
    line.assign(label == 1 ? "1" : "0");
    for (const uint64_t id : ids) {
      line.push_back(' ');
      const auto [end, ec] = std::to_chars(num, num + sizeof(num), id);
      line.append(num, end);
      line.append(":1");
    }
    line.push_back('\n');
    if (std::fwrite(line.data(), 1, line.size(), file.get()) != line.size()) break;
  }
  return Close(std::move(file), path);
}

Status SparseDataGenerator::WriteTruth(const std::string& path) const {
  PS_ASSIGN_OR_RETURN(File file, OpenForWrite(path));
  std::fprintf(file.get(), "# bias %.9g\n", options_.bias);
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (weights_[i] != 0) std::fprintf(file.get(), "%zu %.9g\n", i + 1, weights_[i]);
  }
  return Close(std::move(file), path);
}

// ---- Criteo-like data ----

CtrDataGenerator::CtrDataGenerator(const CtrDataGenOptions& options)
    : options_(options), rng_(SplitMix64(options.seed ^ 0xc7a0da7a5eedULL)) {}

Result<CtrDataGenerator> CtrDataGenerator::Create(const CtrDataGenOptions& o) {
  auto bad = [](const std::string& name, const std::string& value, const std::string& want) {
    return InvalidArgument("CTR data: " + name + " = " + value + ": expected " + want);
  };
  if (o.dense < 2 || o.dense > 1000) return bad("dense", std::to_string(o.dense), "[2, 1000]");
  if (o.fields < 2 || o.fields > 1000) return bad("fields", std::to_string(o.fields), "[2, 1000]");
  if (o.min_vocab < 1 || o.max_vocab < o.min_vocab || o.max_vocab > 100'000'000) {
    return bad("min_vocab..max_vocab",
               std::to_string(o.min_vocab) + ".." + std::to_string(o.max_vocab),
               "1 <= min_vocab <= max_vocab <= 1e8");
  }
  if (!(o.zipf > 0 && o.zipf <= 100)) return bad("zipf", std::to_string(o.zipf), "(0, 100]");
  if (o.head < 0) return bad("head", std::to_string(o.head), ">= 0");
  if (!(o.wide_std >= 0 && o.wide_std <= 100 && o.dense_std >= 0 && o.dense_std <= 100)) {
    return bad("wide_std, dense_std",
               std::to_string(o.wide_std) + ", " + std::to_string(o.dense_std), "[0, 100]");
  }
  if (!std::isfinite(o.bias)) return bad("bias", std::to_string(o.bias), "a finite number");

  CtrDataGenerator gen(o);
  std::mt19937_64 truth_rng(SplitMix64(o.seed + 0xc7));
  const double ratio = static_cast<double>(o.max_vocab) / static_cast<double>(o.min_vocab);
  gen.offsets_.push_back(0);
  for (int f = 0; f < o.fields; ++f) {
    const double t = static_cast<double>(f) / static_cast<double>(o.fields - 1);
    const auto v =
        static_cast<int64_t>(std::llround(static_cast<double>(o.min_vocab) * std::pow(ratio, t)));
    gen.vocab_.push_back(v);
    gen.offsets_.push_back(gen.offsets_.back() + v);
    gen.zipf_.emplace_back(static_cast<uint64_t>(v), o.zipf);
    std::vector<float> w(static_cast<size_t>(std::min<int64_t>(v, o.head)));
    for (float& x : w) x = static_cast<float>(o.wide_std * NormalFrom(truth_rng));
    gen.wide_.push_back(std::move(w));
  }
  for (int j = 0; j < o.dense; ++j) {
    gen.dense_w_.push_back(static_cast<float>(o.dense_std * NormalFrom(truth_rng)));
  }
  for (int f = 0; f < 2; ++f) {
    std::vector<float> e(2 * static_cast<size_t>(std::min<int64_t>(gen.vocab_[f], o.head)));
    for (float& x : e) x = static_cast<float>(0.8 * NormalFrom(truth_rng));
    gen.emb_.push_back(std::move(e));
  }
  return gen;
}

void CtrDataGenerator::Next(float* values, uint64_t* ids, int32_t* label, double* prob) {
  double z = options_.bias;
  for (int j = 0; j < options_.dense; ++j) {
    // Normals in pairs would be faster; one per draw keeps the stream simple.
    values[j] = static_cast<float>(NormalFrom(rng_));
    z += dense_w_[static_cast<size_t>(j)] * values[j];
  }
  z += static_cast<double>(values[0]) * values[1];
  uint64_t ranks[2] = {0, 0};
  for (int f = 0; f < options_.fields; ++f) {
    const size_t fi = static_cast<size_t>(f);
    const uint64_t rank = zipf_[fi].Draw(rng_);
    ids[f] = static_cast<uint64_t>(offsets_[fi]) + rank;  // 1-based: id 0 is never used
    if (rank <= wide_[fi].size()) z += wide_[fi][rank - 1];
    if (f < 2) ranks[f] = rank;
  }
  if (ranks[0] <= emb_[0].size() / 2 && ranks[1] <= emb_[1].size() / 2) {
    const float* a = &emb_[0][2 * (ranks[0] - 1)];
    const float* b = &emb_[1][2 * (ranks[1] - 1)];
    z += a[0] * b[0] + a[1] * b[1];
  }
  *prob = Sigmoid(z);
  *label = UniformFrom(rng_) < *prob ? 1 : 0;
}

void CtrDataGenerator::Generate(int64_t examples, CtrDataset* data, std::vector<float>* probs) {
  data->dense = options_.dense;
  data->fields = options_.fields;
  int32_t label = 0;
  double prob = 0;
  for (int64_t i = 0; i < examples; ++i) {
    data->values.resize(data->values.size() + static_cast<size_t>(options_.dense));
    data->ids.resize(data->ids.size() + static_cast<size_t>(options_.fields));
    Next(data->values.data() + data->values.size() - options_.dense,
         data->ids.data() + data->ids.size() - options_.fields, &label, &prob);
    data->labels.push_back(label);
    ++data->count;
    if (probs != nullptr) probs->push_back(static_cast<float>(prob));
  }
}

Status CtrDataGenerator::WriteCtr(const std::string& path, int64_t examples,
                                  std::vector<int32_t>* labels, std::vector<float>* probs) {
  PS_ASSIGN_OR_RETURN(File file, OpenForWrite(path));
  std::vector<float> values(static_cast<size_t>(options_.dense));
  std::vector<uint64_t> ids(static_cast<size_t>(options_.fields));
  std::string line;
  char num[32];
  for (int64_t i = 0; i < examples; ++i) {
    int32_t label = 0;
    double prob = 0;
    Next(values.data(), ids.data(), &label, &prob);
    if (labels != nullptr) labels->push_back(label);
    if (probs != nullptr) probs->push_back(static_cast<float>(prob));
    line.assign(label == 1 ? "1" : "0");
    for (const float v : values) {
      // 4 decimals: the dense features are N(0, 1); finer digits only bloat the file.
      line.append(num, static_cast<size_t>(std::snprintf(num, sizeof(num), "\t%.4f", v)));
    }
    for (const uint64_t id : ids) {
      line.push_back('\t');
      const auto [end, ec] = std::to_chars(num, num + sizeof(num), id);
      line.append(num, end);
    }
    line.push_back('\n');
    if (std::fwrite(line.data(), 1, line.size(), file.get()) != line.size()) break;
  }
  return Close(std::move(file), path);
}

Status CtrDataGenerator::WriteTruth(const std::string& path, double best_auc) const {
  PS_ASSIGN_OR_RETURN(File file, OpenForWrite(path));
  FILE* f = file.get();
  std::fprintf(f, "best_auc %.6f\n# the AUC of the true probabilities on the test set\n", best_auc);
  std::fprintf(f, "bias %.9g\n", options_.bias);
  for (size_t j = 0; j < dense_w_.size(); ++j) std::fprintf(f, "dense %zu %.9g\n", j, dense_w_[j]);
  std::fprintf(f, "product dense 0 dense 1 weight 1\n");
  for (size_t i = 0; i < vocab_.size(); ++i) {
    std::fprintf(f, "field %zu ids %lld..%lld\n", i, static_cast<long long>(offsets_[i] + 1),
                 static_cast<long long>(offsets_[i + 1]));
    for (size_t r = 0; r < wide_[i].size(); ++r) {
      std::fprintf(f, "wide %llu %.9g\n", static_cast<unsigned long long>(offsets_[i] + r + 1),
                   wide_[i][r]);
    }
  }
  for (size_t i = 0; i < 2; ++i) {
    for (size_t r = 0; r < emb_[i].size() / 2; ++r) {
      std::fprintf(f, "interaction %llu %.9g %.9g\n",
                   static_cast<unsigned long long>(offsets_[i] + r + 1), emb_[i][2 * r],
                   emb_[i][2 * r + 1]);
    }
  }
  return Close(std::move(file), path);
}

double CtrDataGenerator::BestAuc(std::span<const float> probs, std::span<const int32_t> labels) {
  return Auc(probs, labels);
}

}  // namespace ps
