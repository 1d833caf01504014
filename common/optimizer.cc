#include "common/optimizer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

namespace ps {

void Optimizer::Extrapolate(std::span<const float> values, std::span<const float>, float,
                            std::span<float> out) const {
  DCHECK_EQ(out.size(), values.size());
  std::copy(values.begin(), values.end(), out.begin());
}

namespace {

// Every rule follows PyTorch's torch.optim step of the same name, so that a model trained
// here and one trained there with the same settings take the same steps. Notation, per
// element i of a row: w the value, g the pushed gradient, lr the step's learning rate.
//
// Shared preprocessing, in this order:
//   1. clip (clip_grad_norm c > 0):  g *= min(1, c / ||g||_2), ||g||_2 over the whole row;
//   2. L2 penalty (weight_decay wd, every optimizer but adamw):  g += wd * w.
// Both are folded into the element loops as g = scale * grad + wd * w, so Apply reads each
// array once and allocates nothing.
//
// Arithmetic is float per element; the per-row scalars (the gradient's norm, Adam's bias
// corrections) are computed in double because they are computed once per row and feed
// every element.

// The factor that scales the row's gradient to at most `clip` in L2 norm; 1 when clipping
// is off (clip <= 0) or the gradient is already within the bound (a zero gradient too).
float ClipScale(std::span<const float> grad, double clip) {
  if (clip <= 0) return 1.0f;
  double sum_sq = 0;  // double: no overflow or loss for any finite float gradient
  for (float x : grad) sum_sq += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum_sq);
  return norm > clip ? static_cast<float>(clip / norm) : 1.0f;
}

// Settings every rule shares.
struct Common {
  explicit Common(const UpdateRule& r) : weight_decay(r.weight_decay), clip(r.clip_grad_norm) {}
  float weight_decay;
  double clip;
};

// sgd:  g' = scale*g + wd*w;  w -= lr * g'.  No state.
class Sgd final : public Optimizer {
 public:
  explicit Sgd(const UpdateRule& r) : common_(r) {}
  size_t StateFloats(size_t) const override { return 0; }
  void Apply(std::span<float> values, std::span<float>, std::span<const float> grad,
             float lr) const override {
    const size_t n = values.size();
    const float scale = ClipScale(grad, common_.clip);
    const float wd = common_.weight_decay;
    float* __restrict w = values.data();
    const float* __restrict g = grad.data();
    for (size_t i = 0; i < n; ++i) w[i] -= lr * (scale * g[i] + wd * w[i]);
  }

 private:
  Common common_;
};

// momentum (heavy ball, PyTorch's convention with dampening 0: the buffer accumulates raw
// gradients and lr multiplies it at the step, so a change of lr acts at once):
//   g' = scale*g + wd*w;  v = mu*v + g';  w -= lr * v.
// nesterov (PyTorch's reformulation, which needs no look-ahead evaluation):
//   g' = scale*g + wd*w;  v = mu*v + g';  w -= lr * (g' + mu*v).
// State: v, `width` floats. A zero v makes the first step v = g', as PyTorch's first step.
class Momentum final : public Optimizer {
 public:
  Momentum(const UpdateRule& r, bool nesterov) : common_(r), mu_(r.momentum), nesterov_(nesterov) {}
  size_t StateFloats(size_t width) const override { return width; }
  void Apply(std::span<float> values, std::span<float> state, std::span<const float> grad,
             float lr) const override {
    const size_t n = values.size();
    DCHECK_EQ(state.size(), StateFloats(n));
    const float scale = ClipScale(grad, common_.clip);
    const float wd = common_.weight_decay;
    const float mu = mu_;
    float* __restrict w = values.data();
    float* __restrict v = state.data();
    const float* __restrict g = grad.data();
    if (nesterov_) {
      for (size_t i = 0; i < n; ++i) {
        const float gi = scale * g[i] + wd * w[i];
        v[i] = mu * v[i] + gi;
        w[i] -= lr * (gi + mu * v[i]);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const float gi = scale * g[i] + wd * w[i];
        v[i] = mu * v[i] + gi;
        w[i] -= lr * v[i];
      }
    }
  }

  bool HasVelocity() const override { return mu_ > 0; }
  // With no gradient each update does v = mu*v, then w -= lr*mu*v (nesterov: lr*mu*(mu*v)):
  // over k updates w moves by lr * v * m * (1 - mu^k) / (1 - mu), m = mu (momentum) or
  // mu^2 (nesterov); a fractional k follows the same curve.
  float LookaheadStep(float lr, double updates) const override {
    const double mu = mu_;
    const double first = nesterov_ ? mu * mu : mu;
    const double reach = mu < 1 ? (1 - std::pow(mu, updates)) / (1 - mu) : updates;
    return static_cast<float>(lr * first * reach);
  }
  void Extrapolate(std::span<const float> values, std::span<const float> state, float step,
                   std::span<float> out) const override {
    const size_t n = values.size();
    DCHECK_EQ(out.size(), n);
    DCHECK_EQ(state.size(), StateFloats(n));
    const float* __restrict w = values.data();
    const float* __restrict v = state.data();
    float* __restrict o = out.data();
    for (size_t i = 0; i < n; ++i) o[i] = w[i] - step * v[i];
  }

 private:
  Common common_;
  float mu_;
  bool nesterov_;
};

// adagrad (Duchi et al. 2011; PyTorch's with lr_decay 0 and initial accumulator 0):
//   g' = scale*g + wd*w;  s += g'^2;  w -= lr * g' / (sqrt(s) + eps).
// State: s, `width` floats.
class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(const UpdateRule& r) : common_(r), eps_(r.epsilon) {}
  size_t StateFloats(size_t width) const override { return width; }
  void Apply(std::span<float> values, std::span<float> state, std::span<const float> grad,
             float lr) const override {
    const size_t n = values.size();
    DCHECK_EQ(state.size(), StateFloats(n));
    const float scale = ClipScale(grad, common_.clip);
    const float wd = common_.weight_decay;
    const float eps = eps_;
    float* __restrict w = values.data();
    float* __restrict s = state.data();
    const float* __restrict g = grad.data();
    for (size_t i = 0; i < n; ++i) {
      const float gi = scale * g[i] + wd * w[i];
      s[i] += gi * gi;
      w[i] -= lr * gi / (std::sqrt(s[i]) + eps);
    }
  }

 private:
  Common common_;
  float eps_;
};

// adam (Kingma & Ba 2015, as PyTorch's Adam with amsgrad off), with t the ROW's step count
// (a row first touched mid-training starts at t = 1, so its first step is bias-corrected
// as a first step, not as the job's step):
//   g' = scale*g + wd*w   (adam: L2 penalty in the gradient)
//   t += 1;  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
//   w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// (eps is added after the bias correction of v, as PyTorch does).
// adamw (Loshchilov & Hutter 2019, as PyTorch's AdamW): the decay is decoupled from the
// gradient and applied to the weights before the Adam step with g' = scale*g:
//   w -= lr*wd*w;  then the step above.
//
// State layout: [m: width floats][v: width floats][t: 1 float]. t is a float so that the
// whole state is one float array, zero for a new row; it counts exactly up to 2^24
// (16.7M steps of that row). Beyond that t + 1 rounds back to 2^24 and the count stays
// there, which changes nothing that matters: both corrections are then 1 - beta^(2^24),
// within 1e-7 of 1 for any beta <= 1 - 1e-6.
class Adam final : public Optimizer {
 public:
  Adam(const UpdateRule& r, bool decoupled)
      : common_(r), beta1_(r.beta1), beta2_(r.beta2), eps_(r.epsilon), decoupled_(decoupled) {}
  size_t StateFloats(size_t width) const override { return 2 * width + 1; }
  void Apply(std::span<float> values, std::span<float> state, std::span<const float> grad,
             float lr) const override {
    const size_t n = values.size();
    DCHECK_EQ(state.size(), StateFloats(n));
    float* __restrict w = values.data();
    float* __restrict m = state.data();
    float* __restrict v = state.data() + n;
    float& t_slot = state[2 * n];
    const float* __restrict g = grad.data();

    t_slot += 1.0f;
    const double t = t_slot;
    const double bc1 = 1 - std::pow(beta1_, t);
    const double bc2 = 1 - std::pow(beta2_, t);
    const float step = static_cast<float>(lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1 / std::sqrt(bc2));
    const float b1 = static_cast<float>(beta1_);
    const float b2 = static_cast<float>(beta2_);
    const float one_minus_b1 = static_cast<float>(1 - beta1_);
    const float one_minus_b2 = static_cast<float>(1 - beta2_);
    const float eps = eps_;
    const float scale = ClipScale(grad, common_.clip);
    // adamw decays the weights (decay factor below), adam the gradient (wd in g').
    const float wd = decoupled_ ? 0.0f : common_.weight_decay;
    const float decay = decoupled_ ? 1.0f - lr * common_.weight_decay : 1.0f;
    for (size_t i = 0; i < n; ++i) {
      const float gi = scale * g[i] + wd * w[i];
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
      w[i] = decay * w[i] - step * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
    }
  }

 private:
  Common common_;
  double beta1_;
  double beta2_;
  float eps_;
  bool decoupled_;
};

}  // namespace

Result<UpdateRule> MakeUpdateRule(const JobConfig& config) {
  static const std::pair<const char*, UpdateRule::Kind> kKinds[] = {
      {"sgd", UpdateRule::Kind::kSgd},           {"momentum", UpdateRule::Kind::kMomentum},
      {"nesterov", UpdateRule::Kind::kNesterov}, {"adagrad", UpdateRule::Kind::kAdagrad},
      {"adam", UpdateRule::Kind::kAdam},         {"adamw", UpdateRule::Kind::kAdamW}};
  UpdateRule rule;
  const auto* found = std::find_if(std::begin(kKinds), std::end(kKinds),
                                   [&](const auto& k) { return config.optimizer == k.first; });
  if (found == std::end(kKinds)) {
    return InvalidArgument("--optimizer=" + config.optimizer +
                           " is unknown: expected sgd|momentum|nesterov|adagrad|adam|adamw");
  }
  rule.kind = found->second;
  rule.weight_decay = static_cast<float>(config.weight_decay);
  rule.clip_grad_norm = config.clip_grad_norm;
  rule.momentum = static_cast<float>(config.momentum);
  rule.epsilon = static_cast<float>(config.epsilon);
  rule.beta1 = config.beta1;
  rule.beta2 = config.beta2;
  return rule;
}

std::unique_ptr<Optimizer> MakeOptimizer(const UpdateRule& rule) {
  switch (rule.kind) {
    case UpdateRule::Kind::kSgd:
      return std::make_unique<Sgd>(rule);
    case UpdateRule::Kind::kMomentum:
      return std::make_unique<Momentum>(rule, false);
    case UpdateRule::Kind::kNesterov:
      return std::make_unique<Momentum>(rule, true);
    case UpdateRule::Kind::kAdagrad:
      return std::make_unique<Adagrad>(rule);
    case UpdateRule::Kind::kAdam:
      return std::make_unique<Adam>(rule, false);
    case UpdateRule::Kind::kAdamW:
      return std::make_unique<Adam>(rule, true);
  }
  LOG(FATAL) << "UpdateRule kind " << static_cast<int>(rule.kind) << " has no optimizer";
}

Result<std::unique_ptr<Optimizer>> MakeOptimizer(const JobConfig& config) {
  PS_ASSIGN_OR_RETURN(UpdateRule rule, MakeUpdateRule(config));
  return MakeOptimizer(rule);
}

}  // namespace ps
