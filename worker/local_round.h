// Local updates (--local_steps=T, common/job_config.h): a worker pulls, takes T steps on
// its own copy of the dense tables, and pushes the sum of the T gradients as one update.
// Between the steps of a round the copy moves by plain SGD at the servers' current rate
// (nesterov: times 1 + momentum, Rate), so that each step's gradient is computed where the
// previous ones left the copy; the servers then apply their own optimizer to the sum as one
// update. (Replaying it as T updates of the mean was tried: with momentum 0.9 that is T
// updates on gradients up to T updates stale, and the default job fell to 0.76.) The sum
// weighs every example as a push per step would (each gradient is its batch's mean times
// n / batch_size), in a T-th of the messages and clock ticks.
//
// A round ends after T steps or with its data chunk (Finish), whichever comes first, so
// that a chunk reported complete has all its examples pushed; a chunk given back on
// SIGTERM drops its round (Drop): its examples are trained again by another worker.
//
// Thread model: used by one thread (the training loop's).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/job_config.h"
#include "common/lr_policy.h"

namespace ps {

class LocalRound {
 public:
  // config.local_steps steps a round. With more than one, LrPolicy::Create(config) must
  // succeed (the worker's Train checks it before training).
  explicit LocalRound(const JobConfig& config);

  // Whether rounds are longer than one step (local_steps > 1).
  bool active() const { return steps_ > 1; }
  // Whether the next step starts a round (and so pulls).
  bool starting() const { return taken_ == 0; }

  // After a step's compute, with the model's parameter and gradient buffers (one span per
  // dense table, in table order): adds the gradient to the round's sum. A step that does
  // not end the round moves the parameters by -rate x gradient and returns false; the
  // round's last step leaves the round's sum in `grads` and returns true: push it.
  bool Add(std::span<const std::span<float>> params, std::span<const std::span<float>> grads,
           float rate);
  // Ends the round early: true, with the round's sum in `grads`, when it took a step; false
  // (nothing to push) otherwise.
  bool Finish(std::span<const std::span<float>> grads);
  // Forgets the round (its steps are not pushed).
  void Drop();

  // The rate of the local steps: `server_rate` (the servers' rate for this worker's last
  // push) when there was one (> 0), else the schedule's rate at `clock` as if every worker
  // were there (the job's first round, or its first after a restore); with nesterov, times
  // 1 + momentum (step_scale_).
  float Rate(double server_rate, int64_t clock) const;

 private:
  void TakeSum(std::span<const std::span<float>> grads);

  const JobConfig config_;  // a copy: the round may outlive the caller's
  const int steps_;
  std::optional<LrPolicy> lr_policy_;  // rounds of more than one step only
  // What a new gradient moves a row by at once under the servers' rule, per unit of rate:
  // nesterov's lr x (1 + momentum) x g, the others' lr x g. Not the velocity's share,
  // which the worker does not have. On the default job at 4 local steps, 1 + momentum
  // (1.9) took test accuracy from 0.8836 (1) to about 0.887; 3 and 5 gave 0.886, 10 0.879.
  const double step_scale_;
  int taken_ = 0;                        // steps of the current round so far
  std::vector<std::vector<float>> sum_;  // per table: the round's gradients added up
};

}  // namespace ps
