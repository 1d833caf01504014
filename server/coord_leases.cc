#include "server/coord_leases.h"

#include <algorithm>

namespace ps {

LeaseDesk::LeaseDesk(LeaseDeskOptions options)
    : options_(options), table_(options.epochs, options.chunk_examples) {}

Result<std::vector<int>> LeaseDesk::Complete(int worker, int epoch, uint64_t chunk) {
  PS_RETURN_IF_ERROR(table_.Complete(worker, epoch, chunk));
  std::vector<int> completed = table_.TakeCompletedEpochs();
  for (int e : completed) {
    if (e < options_.epochs) evaluations_.push_back(e);  // the last one is the final eval
  }
  return completed;
}

void LeaseDesk::SetRate(int worker, double examples_per_sec) {
  if (worker < 0) return;
  if (static_cast<size_t>(worker) >= rates_.size()) rates_.resize(worker + 1, 0.0);
  rates_[static_cast<size_t>(worker)] = examples_per_sec;
}

int LeaseDesk::Release(int worker) {
  const int returned = table_.Release(worker);
  std::erase_if(held_, [worker](const HeldLease& h) { return h.worker == worker; });
  return returned;
}

void LeaseDesk::DropHeld(int worker, uint64_t request_id) {
  std::erase_if(
      held_, [&](const HeldLease& h) { return h.worker == worker && h.request_id == request_id; });
}

std::vector<LeaseAnswer> LeaseDesk::Answer(int evaluator, const std::vector<bool>& live) {
  std::vector<LeaseAnswer> answers;
  for (auto it = held_.begin(); it != held_.end();) {
    LeaseAnswer a;
    a.peer = it->peer;
    a.worker = it->worker;
    a.request_id = it->request_id;
    a.batch_size = BatchSizeFor(it->worker, live);
    if (it->worker == evaluator && !evaluations_.empty()) {
      a.evaluate_epoch = evaluations_.front();
      evaluations_.erase(evaluations_.begin());
    }
    if (std::optional<LeaseTable::Lease> lease = table_.Acquire(it->worker)) {
      a.chunk = *lease;
    } else if (table_.AllDone()) {
      a.finished = true;
    } else if (!it->may_wait) {
      a.wait = true;
    } else {
      ++it;  // held until a chunk comes back or the job is done
      continue;
    }
    answers.push_back(std::move(a));
    it = held_.erase(it);
  }
  return answers;
}

uint32_t LeaseDesk::BatchSizeFor(int worker, const std::vector<bool>& live) const {
  const double base = options_.batch_size;
  if (!options_.auto_batch) return static_cast<uint32_t>(base);
  double sum = 0;
  int known = 0;
  int alive = 0;
  for (size_t i = 0; i < rates_.size() && i < live.size(); ++i) {
    if (!live[i]) continue;
    ++alive;
    if (rates_[i] > 0) {
      sum += rates_[i];
      ++known;
    }
  }
  // Workers with no rate yet (none reported, or not in rates_) count as unknown.
  for (size_t i = rates_.size(); i < live.size(); ++i) alive += live[i] ? 1 : 0;
  const double mine =
      worker >= 0 && static_cast<size_t>(worker) < rates_.size() ? rates_[worker] : 0.0;
  if (known < alive || mine <= 0 || sum <= 0) return static_cast<uint32_t>(base);
  const double b = base * known * mine / sum;
  return static_cast<uint32_t>(std::clamp(b, 1.0, base * known));
}

}  // namespace ps
