#include "common/lease_table.h"

#include <glog/logging.h>

#include <algorithm>

namespace ps {

LeaseTable::LeaseTable(int epochs, uint64_t chunk_examples)
    : epochs_(epochs),
      chunk_examples_(chunk_examples),
      chunks_done_(static_cast<size_t>(epochs), 0),
      examples_done_(static_cast<size_t>(epochs), 0) {
  CHECK_GT(chunk_examples_, 0u);
}

LeaseTable::State LeaseTable::Snapshot() const {
  State s;
  s.examples = examples_;
  s.opened_epochs = opened_epochs_;
  s.pending.assign(pending_.begin(), pending_.end());
  for (const auto& [key, worker] : outstanding_) {
    s.outstanding.push_back(Outstanding{key.first, key.second, worker});
  }
  s.chunks_done = chunks_done_;
  s.examples_done = examples_done_;
  s.newly_completed = newly_completed_;
  return s;
}

Status LeaseTable::Restore(const State& state) {
  const size_t epochs = static_cast<size_t>(epochs_);
  if (state.chunks_done.size() != epochs || state.examples_done.size() != epochs ||
      state.opened_epochs < 0 || state.opened_epochs > epochs_) {
    return InvalidArgument("a lease table of " + std::to_string(state.chunks_done.size()) +
                           " epochs does not fit a job of " + std::to_string(epochs_));
  }
  examples_ = 0;
  if (state.examples > 0) PS_RETURN_IF_ERROR(SetDatasetSize(state.examples));
  opened_epochs_ = state.opened_epochs;
  pending_.assign(state.pending.begin(), state.pending.end());
  outstanding_.clear();
  for (const Outstanding& o : state.outstanding) outstanding_[{o.epoch, o.chunk}] = o.worker;
  chunks_done_ = state.chunks_done;
  examples_done_ = state.examples_done;
  newly_completed_ = state.newly_completed;
  return Status::Ok();
}

Status LeaseTable::SetDatasetSize(uint64_t examples) {
  if (examples == 0) return InvalidArgument("a worker reports an empty training set");
  if (examples_ != 0 && examples != examples_) {
    return InvalidArgument("a worker reports " + std::to_string(examples) +
                           " training examples, another " + std::to_string(examples_) +
                           ": every worker must read the same data");
  }
  examples_ = examples;
  chunks_per_epoch_ = (examples_ + chunk_examples_ - 1) / chunk_examples_;
  return Status::Ok();
}

void LeaseTable::OpenNextEpochIfIdle() {
  if (!pending_.empty() || opened_epochs_ >= epochs_ || examples_ == 0) return;
  ++opened_epochs_;
  for (uint64_t k = 0; k < chunks_per_epoch_; ++k) {
    pending_.push_back(Lease{opened_epochs_, k, k * chunk_examples_,
                             std::min(examples_, (k + 1) * chunk_examples_)});
  }
}

std::optional<LeaseTable::Lease> LeaseTable::Acquire(int worker) {
  OpenNextEpochIfIdle();
  if (pending_.empty()) return std::nullopt;
  Lease lease = pending_.front();
  pending_.pop_front();
  outstanding_[{lease.epoch, lease.chunk}] = worker;
  return lease;
}

Status LeaseTable::Complete(int worker, int epoch, uint64_t chunk) {
  auto it = outstanding_.find({epoch, chunk});
  if (it == outstanding_.end() || it->second != worker) {
    return FailedPrecondition("worker " + std::to_string(worker) + " does not hold chunk " +
                              std::to_string(chunk) + " of epoch " + std::to_string(epoch));
  }
  outstanding_.erase(it);
  const size_t e = static_cast<size_t>(epoch - 1);
  const uint64_t begin = chunk * chunk_examples_;
  examples_done_[e] += std::min(examples_, begin + chunk_examples_) - begin;
  if (++chunks_done_[e] == chunks_per_epoch_) newly_completed_.push_back(epoch);
  return Status::Ok();
}

int LeaseTable::Release(int worker) {
  std::vector<Lease> back;
  for (auto it = outstanding_.begin(); it != outstanding_.end();) {
    if (it->second != worker) {
      ++it;
      continue;
    }
    const uint64_t k = it->first.second;
    back.push_back(Lease{it->first.first, k, k * chunk_examples_,
                         std::min(examples_, (k + 1) * chunk_examples_)});
    it = outstanding_.erase(it);
  }
  // To the front, oldest epoch first: the unfinished epoch closes as soon as possible.
  std::sort(back.begin(), back.end(), [](const Lease& a, const Lease& b) {
    return a.epoch != b.epoch ? a.epoch > b.epoch : a.chunk > b.chunk;
  });
  for (const Lease& l : back) pending_.push_front(l);
  return static_cast<int>(back.size());
}

void LeaseTable::StartAtEpoch(int epoch) {
  CHECK(pending_.empty() && outstanding_.empty()) << "StartAtEpoch after leases were handed out";
  opened_epochs_ = std::clamp(epoch - 1, opened_epochs_, epochs_);
}

bool LeaseTable::AllDone() const {
  return examples_ > 0 && opened_epochs_ == epochs_ && pending_.empty() && outstanding_.empty();
}

std::vector<int> LeaseTable::TakeCompletedEpochs() {
  std::vector<int> out;
  out.swap(newly_completed_);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ps
