#include "worker/group_trainer.h"

#include <glog/logging.h>

#include <algorithm>

#include "worker/trainer.h"

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

void ZeroGrads(TrainableModel* model) {
  for (std::span<float> g : model->DenseGrads()) std::fill(g.begin(), g.end(), 0.0f);
}

// The gradients plus one small tensor of the batch's {loss sum, correct, examples}, so
// that the leader's progress reports speak for the whole group. (Counts stay exact in a
// float up to 2^24 per step.)
std::vector<std::span<float>> GradsAndStats(TrainableModel* model, const BatchResult& br,
                                            std::vector<float>* stats) {
  *stats = {static_cast<float>(br.loss_sum), static_cast<float>(br.correct),
            static_cast<float>(br.examples)};
  std::vector<std::span<float>> tensors = model->DenseGrads();
  tensors.push_back(*stats);
  return tensors;
}

}  // namespace

std::pair<uint64_t, uint64_t> MemberSlice(uint64_t count, int rank, int size) {
  const uint64_t q = (count + static_cast<uint64_t>(size) - 1) / static_cast<uint64_t>(size);
  const uint64_t first = std::min(count, q * static_cast<uint64_t>(rank));
  return {first, std::min(count, first + q)};
}

void TrainingLoop::DissolveGroup(const Status& why) {
  LOG(WARNING) << "worker " << worker_id_ << ": the all-reduce group breaks (" << why.ToString()
               << "); nothing of the failed step is pushed, training alone from here";
  group_->Dissolve();
  SetGroup(nullptr);
}

Status TrainingLoop::GroupStep(std::span<const int64_t> examples, uint64_t begin, int epoch,
                               double fraction) {
  const int size = group_->size();
  std::vector<int64_t> words = {kGroupStep, epoch, static_cast<int64_t>(begin),
                                static_cast<int64_t>(examples.size())};
  Status s = group_->BroadcastControl(&words);
  RequestInfo info;
  BatchResult br;
  std::vector<float> stats;
  auto [first, last] = MemberSlice(examples.size(), 0, size);
  std::span<const int64_t> mine = examples.subspan(first, last - first);
  if (s.ok()) {
    PS_RETURN_IF_ERROR(model_->Pull(*client_, examples, &info));
    s = group_->Broadcast(model_->DenseParams());
  }
  if (s.ok()) {
    auto compute_start = SteadyClock::now();
    const float scale = static_cast<float>(mine.size()) / static_cast<float>(config_.batch_size);
    PS_RETURN_IF_ERROR(model_->Compute(mine, scale, &br));
    compute_seconds_ += SecondsSince(compute_start);
    s = group_->ReduceSum(GradsAndStats(model_, br, &stats));
  }
  if (!s.ok()) {
    DissolveGroup(s);
    // The whole step again, alone: the epoch still covers every example once.
    for (size_t b = 0; b < examples.size(); b += static_cast<size_t>(batch_)) {
      const size_t n = std::min(static_cast<size_t>(batch_), examples.size() - b);
      PS_RETURN_IF_ERROR(TrainStep(examples.subspan(b, n), epoch, fraction));
    }
    return Status::Ok();
  }
  PS_RETURN_IF_ERROR(PushAndTick());
  ++steps_;
  // The leader counts the whole step: only it knows which steps were pushed, so the job's
  // totals stay exact whenever the group breaks (members count theirs only in their log).
  examples_ += static_cast<int64_t>(examples.size());
  wait_seconds_ += info.held_seconds;
  interval_wait_ += info.held_seconds;
  interval_lag_ = std::max(interval_lag_, info.clock_lag);
  // The group's loss and accuracy (summed with the gradients): members send no reports.
  interval_.loss_sum += stats[0];
  interval_.correct += static_cast<int64_t>(stats[1]);
  interval_.examples += static_cast<int64_t>(stats[2]);
  return ReportTraining(epoch, fraction, false);
}

Result<GroupMemberResult> RunGroupMember(const JobConfig& config, KVClient* client,
                                         TrainableModel* model, GroupComm* group,
                                         const std::atomic<bool>& stop) {
  GroupMemberResult result;
  if (model->DenseParams().empty()) {
    return FailedPrecondition("this model cannot train in an all-reduce group (dense only)");
  }
  // The leader ticks for the group: a member waiting at the staleness bound would wait on
  // itself.
  PS_RETURN_IF_ERROR(client->Wait(client->Leave()));
  std::vector<int64_t> order;
  int order_epoch = 0;
  bool idle = false;
  auto dissolve = [&](const Status& why) {
    LOG(WARNING) << "group member " << group->rank() << ": the all-reduce group breaks ("
                 << why.ToString() << ") after " << result.steps << " steps, " << result.examples
                 << " examples; training alone from here";
    result.dissolved = true;
    return result;
  };
  while (true) {
    if (stop.load()) return Aborted("stopped by signal");
    std::vector<int64_t> words;
    // While the leader waits for data, so do the members, a second at a time (to see stop).
    Status s = group->BroadcastControl(
        &words, idle ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(0));
    if (!s.ok()) {
      if (idle && s.code() == StatusCode::kDeadlineExceeded) continue;
      return dissolve(s);
    }
    if (words.empty()) return dissolve(Internal("an empty control message from the leader"));
    idle = false;
    if (words[0] == kGroupFinished) return result;
    if (words[0] == kGroupIdle) {
      idle = true;
      continue;
    }
    if (words[0] != kGroupStep || words.size() != 4 || words[1] < 1 || words[2] < 0 ||
        words[3] < 0 || words[2] + words[3] > model->train_examples()) {
      return dissolve(Internal("a malformed control message from the leader"));
    }
    const int epoch = static_cast<int>(words[1]);
    if (epoch != order_epoch) {
      order = EpochOrder(config.seed, epoch, model->train_examples());
      order_epoch = epoch;
    }
    auto [first, last] = MemberSlice(static_cast<uint64_t>(words[3]), group->rank(), group->size());
    std::span<const int64_t> mine(order.data() + words[2] + first, last - first);
    s = group->Broadcast(model->DenseParams());
    if (!s.ok()) return dissolve(s);
    if (mine.empty()) ZeroGrads(model);
    BatchResult br;
    if (!mine.empty()) {
      const float scale = static_cast<float>(mine.size()) / static_cast<float>(config.batch_size);
      PS_RETURN_IF_ERROR(model->Compute(mine, scale, &br));
    }
    std::vector<float> stats;
    s = group->ReduceSum(GradsAndStats(model, br, &stats));
    if (!s.ok()) return dissolve(s);
    result.examples += static_cast<int64_t>(mine.size());
    ++result.steps;
  }
}

}  // namespace ps
