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

double UniformFrom(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

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

  if (options.zipf > 0) {
    const double s = options.zipf;
    gen.h_integral_x1_ = HIntegral(1.5, s) - 1.0;
    gen.h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5, s);
    gen.s_ = 2.0 - HIntegralInverse(HIntegral(2.5, s) - H(2.0, s), s);
  }
  return gen;
}

double SparseDataGenerator::Uniform() { return UniformFrom(rng_); }

uint64_t SparseDataGenerator::DrawRank() {
  const uint64_t n = static_cast<uint64_t>(options_.features);
  if (options_.zipf == 0) return 1 + static_cast<uint64_t>(Uniform() * static_cast<double>(n)) % n;
  const double s = options_.zipf;
  while (true) {
    // u is uniform in (H(1.5) - 1, H(n + 0.5)]; x = H^-1(u) has the continuous density
    // x^-s, and k = round(x) is accepted with the probability that makes it Zipf.
    const double u = h_integral_n_ + Uniform() * (h_integral_x1_ - h_integral_n_);
    const double x = HIntegralInverse(u, s);
    uint64_t k = static_cast<uint64_t>(std::max(x + 0.5, 1.0));
    k = std::min(k, n);
    const double kd = static_cast<double>(k);
    if (kd - x <= s_ || u >= HIntegral(kd + 0.5, s) - H(kd, s)) return k;
  }
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

}  // namespace ps
