// The learning rate of one pushed gradient: a schedule over the job's minibatch updates
// (Caffe's solver policies plus cosine, with an optional linear warmup), divided by the
// gradient's staleness when --staleness_lr asks for it.
//
// Thread safety: an LrPolicy is immutable after Create; its const methods may run on any
// number of threads at once.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

// Learning-rate schedules as Caffe's solvers define them, plus cosine, with optional linear
// warmup, and staleness-aware scaling. With iter the iteration and lr0 = --base_lr:
//   fixed:      lr0
//   step:       lr0 * gamma^floor(iter / stepsize)
//   multistep:  lr0 * gamma^(number of --stepvalue entries <= iter)
//   exp:        lr0 * gamma^iter
//   inv:        lr0 * (1 + gamma * iter)^(-power)
//   poly:       lr0 * (1 - iter / max_iter)^power, and 0 at and after max_iter
//   cosine:     lr0 * 0.5 * (1 + cos(pi * min(iter, max_iter) / max_iter))
class LrPolicy {
 public:
  // The policy the job config names (--lr_policy, --staleness_lr and their settings). An
  // unknown name or a setting the policy cannot use (e.g. multistep without --stepvalue)
  // is an InvalidArgument.
  static Result<LrPolicy> Create(const JobConfig& config);

  // The schedule's rate at `iteration` (minibatch updates so far, >= 0; a negative one
  // counts as 0), warmup included: for iter < warmup_iters the rate is
  // schedule(iter) * (iter + 1) / warmup_iters, so that iteration 0 already takes a step
  // (1/warmup_iters of the rate) and iteration warmup_iters - 1 takes the full one.
  double ScheduleRate(int64_t iteration) const;

  // The share of its rate a gradient `staleness` updates old gets, per --staleness_lr:
  // 1 / (1 + staleness) (inverse), 1 / sqrt(1 + staleness) (sqrt), 1 (none). A fresh
  // gradient (0) keeps its whole rate. Summed (--softsync) tables weight each push by it
  // as it joins the sum; other tables multiply the push's rate (Rate).
  double StalenessWeight(int64_t staleness) const;

  // ScheduleRate(iteration) * StalenessWeight(staleness).
  double Rate(int64_t iteration, int64_t staleness) const;

 private:
  enum class Schedule { kFixed, kStep, kMultistep, kExp, kInv, kPoly, kCosine };
  enum class StalenessScaling { kNone, kInverse, kSqrt };

  LrPolicy() = default;

  // The schedule without warmup.
  double Scheduled(int64_t iteration) const;

  Schedule schedule_ = Schedule::kFixed;
  StalenessScaling staleness_scaling_ = StalenessScaling::kNone;
  double base_lr_ = 0;
  double gamma_ = 0;
  double power_ = 0;
  int64_t stepsize_ = 1;
  int64_t max_iter_ = 1;
  int64_t warmup_iters_ = 0;
  std::vector<int64_t> stepvalues_;  // multistep: increasing
};

}  // namespace ps
