#include "worker/local_round.h"

#include <glog/logging.h>

#include <algorithm>

namespace ps {

LocalRound::LocalRound(const JobConfig& config)
    : config_(config),
      steps_(std::max(config.local_steps, 1)),
      step_scale_(config.optimizer == "nesterov" ? 1.0 + config.momentum : 1.0) {
  if (!active()) return;
  Result<LrPolicy> policy = LrPolicy::Create(config);
  CHECK(policy.ok()) << "LocalRound: " << policy.status().ToString();
  lr_policy_ = std::move(policy).value();
}

bool LocalRound::Add(std::span<const std::span<float>> params,
                     std::span<const std::span<float>> grads, float rate) {
  CHECK_EQ(params.size(), grads.size()) << "one parameter buffer per gradient buffer";
  if (sum_.size() != grads.size()) {
    sum_.clear();
    for (std::span<float> g : grads) sum_.emplace_back(g.size(), 0.0f);
  }
  for (size_t t = 0; t < grads.size(); ++t) {
    CHECK_EQ(params[t].size(), grads[t].size()) << "table " << t;
    CHECK_EQ(sum_[t].size(), grads[t].size()) << "table " << t << " changed size";
    float* sum = sum_[t].data();
    const float* g = grads[t].data();
    for (size_t i = 0; i < grads[t].size(); ++i) sum[i] += g[i];
  }
  if (++taken_ < steps_) {
    for (size_t t = 0; t < grads.size(); ++t) {
      float* w = params[t].data();
      const float* g = grads[t].data();
      for (size_t i = 0; i < grads[t].size(); ++i) w[i] -= rate * g[i];
    }
    return false;
  }
  TakeSum(grads);
  return true;
}

bool LocalRound::Finish(std::span<const std::span<float>> grads) {
  if (taken_ == 0) return false;
  TakeSum(grads);
  return true;
}

void LocalRound::Drop() {
  taken_ = 0;
  for (std::vector<float>& s : sum_) std::fill(s.begin(), s.end(), 0.0f);
}

void LocalRound::TakeSum(std::span<const std::span<float>> grads) {
  for (size_t t = 0; t < grads.size(); ++t) {
    std::copy(sum_[t].begin(), sum_[t].end(), grads[t].begin());
  }
  Drop();
}

float LocalRound::Rate(double server_rate, int64_t clock) const {
  const double rate =
      server_rate > 0 || !lr_policy_
          ? server_rate
          : lr_policy_->ScheduleRate(config_.ScheduleIteration(clock * config_.num_workers));
  return static_cast<float>(rate * step_scale_);
}

}  // namespace ps
