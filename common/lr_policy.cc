#include "common/lr_policy.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace ps {

Result<LrPolicy> LrPolicy::Create(const JobConfig& config) {
  LrPolicy p;
  const std::string& name = config.lr_policy;
  if (name == "fixed") {
    p.schedule_ = Schedule::kFixed;
  } else if (name == "step") {
    p.schedule_ = Schedule::kStep;
  } else if (name == "multistep") {
    p.schedule_ = Schedule::kMultistep;
  } else if (name == "exp") {
    p.schedule_ = Schedule::kExp;
  } else if (name == "inv") {
    p.schedule_ = Schedule::kInv;
  } else if (name == "poly") {
    p.schedule_ = Schedule::kPoly;
  } else if (name == "cosine") {
    p.schedule_ = Schedule::kCosine;
  } else {
    return InvalidArgument("--lr_policy=" + name +
                           " is unknown: expected fixed|step|multistep|exp|inv|poly|cosine");
  }

  const std::string& scaling = config.staleness_lr;
  if (scaling == "none") {
    p.staleness_scaling_ = StalenessScaling::kNone;
  } else if (scaling == "inverse") {
    p.staleness_scaling_ = StalenessScaling::kInverse;
  } else if (scaling == "sqrt") {
    p.staleness_scaling_ = StalenessScaling::kSqrt;
  } else {
    return InvalidArgument("--staleness_lr=" + scaling + " is unknown: expected none|inverse|sqrt");
  }

  // FromFlagMap has validated these already; checked again because a config built in code
  // skips it, and a zero divisor would give NaN rates rather than an error.
  if (!(config.base_lr > 0)) {
    return InvalidArgument("--base_lr=" + std::to_string(config.base_lr) + " must be > 0");
  }
  if (p.schedule_ == Schedule::kStep && config.stepsize < 1) {
    return InvalidArgument("--stepsize=" + std::to_string(config.stepsize) +
                           " must be >= 1 for --lr_policy=step");
  }
  if ((p.schedule_ == Schedule::kPoly || p.schedule_ == Schedule::kCosine) && config.max_iter < 1) {
    return InvalidArgument("--max_iter=" + std::to_string(config.max_iter) +
                           " must be >= 1 for --lr_policy=" + name);
  }
  if (config.warmup_iters < 0) {
    return InvalidArgument("--warmup_iters=" + std::to_string(config.warmup_iters) +
                           " must be >= 0");
  }
  if (p.schedule_ == Schedule::kMultistep) {
    if (config.stepvalue.empty()) {
      return InvalidArgument("--lr_policy=multistep needs --stepvalue (increasing iterations)");
    }
    PS_ASSIGN_OR_RETURN(p.stepvalues_, ParseStepValues(config.stepvalue));
  }

  p.base_lr_ = config.base_lr;
  p.gamma_ = config.gamma;
  p.power_ = config.power;
  p.stepsize_ = config.stepsize;
  p.max_iter_ = config.max_iter;
  p.warmup_iters_ = config.warmup_iters;
  return p;
}

double LrPolicy::Scheduled(int64_t iter) const {
  const double x = static_cast<double>(iter);
  switch (schedule_) {
    case Schedule::kFixed:
      return base_lr_;
    case Schedule::kStep:
      return base_lr_ * std::pow(gamma_, static_cast<double>(iter / stepsize_));
    case Schedule::kMultistep: {
      // Caffe moves to the next value when iter reaches it: entries <= iter have passed.
      auto passed = std::upper_bound(stepvalues_.begin(), stepvalues_.end(), iter);
      return base_lr_ * std::pow(gamma_, static_cast<double>(passed - stepvalues_.begin()));
    }
    case Schedule::kExp:
      return base_lr_ * std::pow(gamma_, x);
    case Schedule::kInv:
      return base_lr_ * std::pow(1 + gamma_ * x, -power_);
    case Schedule::kPoly:
      // Explicit at the end: pow(0, 0) is 1, and power 0 must still stop at max_iter.
      if (iter >= max_iter_) return 0;
      return base_lr_ * std::pow(1 - x / static_cast<double>(max_iter_), power_);
    case Schedule::kCosine: {
      const double progress =
          static_cast<double>(std::min(iter, max_iter_)) / static_cast<double>(max_iter_);
      return base_lr_ * 0.5 * (1 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr_;  // unreachable: the switch covers every Schedule
}

double LrPolicy::ScheduleRate(int64_t iteration) const {
  const int64_t iter = std::max<int64_t>(iteration, 0);
  const double rate = Scheduled(iter);
  if (iter >= warmup_iters_) return rate;
  return rate * static_cast<double>(iter + 1) / static_cast<double>(warmup_iters_);
}

double LrPolicy::StalenessWeight(int64_t staleness) const {
  // 1 + staleness rather than max(1, staleness): a gradient one update old already costs
  // accuracy (at 8 workers under n-softsync, where most are 0 or 1 update old, weighting by
  // 1 / (1 + staleness) recovered about half the loss against BSP; README, Scaling).
  const double s = 1.0 + static_cast<double>(std::max<int64_t>(staleness, 0));
  switch (staleness_scaling_) {
    case StalenessScaling::kNone:
      return 1.0;
    case StalenessScaling::kInverse:
      return 1.0 / s;
    case StalenessScaling::kSqrt:
      return 1.0 / std::sqrt(s);
  }
  return 1.0;  // unreachable
}

double LrPolicy::Rate(int64_t iteration, int64_t staleness) const {
  return ScheduleRate(iteration) * StalenessWeight(staleness);
}

}  // namespace ps
