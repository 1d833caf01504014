#include "common/divergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace ps {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

nlohmann::json Divergence::ToJson() const {
  nlohmann::json j = {{"reason", reason}, {"worker", worker}, {"clock", clock}, {"advice", advice}};
  if (table) j["table"] = *table;
  if (loss) j["loss"] = *loss;
  return j;
}

std::optional<Divergence> Divergence::FromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("reason") || !j["reason"].is_string()) return std::nullopt;
  Divergence d;
  d.reason = j["reason"].get<std::string>();
  if (j.contains("worker") && j["worker"].is_number_integer()) d.worker = j["worker"].get<int>();
  if (j.contains("clock") && j["clock"].is_number_integer()) d.clock = j["clock"].get<int64_t>();
  if (j.contains("table") && j["table"].is_string()) d.table = j["table"].get<std::string>();
  if (j.contains("loss") && j["loss"].is_number()) d.loss = j["loss"].get<double>();
  if (j.contains("advice") && j["advice"].is_array()) {
    for (const auto& a : j["advice"]) {
      if (a.is_string()) d.advice.push_back(a.get<std::string>());
    }
  }
  return d;
}

std::string Divergence::Describe() const {
  std::ostringstream out;
  out << "the model diverged";
  if (worker >= 0) out << " (worker " << worker << ", clock " << clock << ")";
  out << ": " << reason;
  if (!advice.empty()) {
    out << "\nthe job stopped; to try:";
    for (const std::string& a : advice) out << "\n  " << a;
  }
  return out.str();
}

std::vector<std::string> DivergenceAdvice(const JobConfig& config) {
  std::vector<std::string> advice;
  advice.push_back("--base_lr=" + Num(config.base_lr / 2) + " (half of " + Num(config.base_lr) +
                   ")");
  if (config.warmup_iters == 0) {
    // The first thirtieth of the schedule (half an epoch of the default job): the steps where
    // a fresh model is most fragile.
    const int64_t iters = std::max<int64_t>(100, config.max_iter / 30);
    advice.push_back("--warmup_iters=" + std::to_string(iters) +
                     " (ramp the rate up over the first updates)");
  }
  if (config.num_workers > 1 && config.staleness_lr == "none") {
    advice.push_back(
        "--staleness_lr=sqrt (weight each gradient by 1 / sqrt(1 + its "
        "staleness); " +
        std::to_string(config.num_workers) + " workers push stale gradients)");
  }
  if (config.clip_grad_norm == 0) advice.push_back("--clip_grad_norm=10 (cap each row's gradient)");
  if (config.staleness != 0 && config.num_workers > 1) {
    advice.push_back(
        "--staleness=" + std::to_string(config.staleness < 0 ? 2 : config.staleness / 2) +
        " (a tighter bound: fresher gradients)");
  }
  return advice;
}

std::optional<std::string> LossWatch::OnLoss(double loss) {
  if (!std::isfinite(loss)) return "the mean training loss is " + Num(loss);
  if (!first_) {
    first_ = loss;
    return std::nullopt;
  }
  if (ratio_ > 0 && *first_ > 0 && loss > ratio_ * *first_) {
    return "the mean training loss " + Num(loss) + " is " + Num(loss / *first_) +
           "x the first reported " + Num(*first_) +
           " (limit: --divergence_loss_ratio=" + Num(ratio_) + ")";
  }
  return std::nullopt;
}

}  // namespace ps
