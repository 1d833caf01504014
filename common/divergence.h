// Divergence as a job-level event: the rule that says a model has run away, the record of
// it that summary.json and the console carry, and what to try next.
//
// Who detects what:
//   - A worker checks every step (worker/trainer.cc): a non-finite batch loss, or a
//     non-finite or huge gradient (common/gradient_check.h) in any table. It stops, and its
//     `done` carries the Divergence (its totals' "divergence"), instead of pushing a
//     gradient every server would refuse.
//   - The coordinator watches the job's train lines (LossWatch): a mean loss that is not
//     finite or more than --divergence_loss_ratio times the job's first reported loss.
// Either way the coordinator stops the job at once (servers shut down, summary.json written
// with "status": "diverged" and this record), rather than letting workers die one by one on
// refused pushes or wait on each other until killed.
//
// Thread model: plain values and a single-threaded watcher (the coordinator's thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/job_config.h"

namespace ps {

struct Divergence {
  std::string reason;                // e.g. "loss 3.2e+05 is 139x the first reported 2.3"
  int worker = -1;                   // who saw it (-1: unknown)
  int64_t clock = 0;                 // that worker's clock then
  std::optional<std::string> table;  // the table whose gradient ran away, when known
  std::optional<double> loss;        // the loss that ran away, when finite
  std::vector<std::string> advice;   // settings to try, most promising first

  nlohmann::json ToJson() const;
  // Tolerates missing keys; nullopt when `j` is not an object with a "reason".
  static std::optional<Divergence> FromJson(const nlohmann::json& j);
  // One console block: the reason, where, and what to try.
  std::string Describe() const;
};

// What to try when `config` diverged, most promising first: a smaller --base_lr, a warmup,
// the staleness-aware rate, gradient clipping, a smaller staleness bound. Each line names
// the flag and the value to try, computed from the config's own values.
std::vector<std::string> DivergenceAdvice(const JobConfig& config);

// The coordinator's rule on train lines. `ratio` <= 0 turns the ratio test off (a
// non-finite loss still counts).
class LossWatch {
 public:
  explicit LossWatch(double ratio) : ratio_(ratio) {}
  // A train line's mean loss. Returns the reason when it shows divergence.
  std::optional<std::string> OnLoss(double loss);
  std::optional<double> first_loss() const { return first_; }

 private:
  double ratio_;
  std::optional<double> first_;  // the first finite loss the job reported
};

}  // namespace ps
