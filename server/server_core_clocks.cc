// A ServerCore's clock table: workers' ticks, leaves and evictions, the slowest live clock
// the staleness bound and n-softsync read, the job's steps the lr schedule reads, held pulls
// that time out, and the checkpoints a tick of the slowest worker triggers.
#include <algorithm>
#include <climits>

#include "server/server_core.h"

namespace ps {

int64_t ServerCore::MinLiveClock(int* slowest) const {
  int64_t min = INT64_MAX;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (left_[w] || clocks_[w] >= min) continue;
    min = clocks_[w];
    if (slowest != nullptr) *slowest = static_cast<int>(w);
  }
  return min;
}

void ServerCore::ExpireHeldPulls(Clock::time_point now, std::vector<Outgoing>* out) {
  const auto limit = std::chrono::duration<double>(config_.staleness_wait_seconds);
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->since < limit) {
      ++it;
      continue;
    }
    int slowest = -1;
    int64_t min_clock = MinLiveClock(&slowest);
    Status s = DeadlineExceeded(
        "pull of worker " + std::to_string(it->worker) + " at clock " + std::to_string(it->clock) +
        " waited " + std::to_string(config_.staleness_wait_seconds) + " s for worker " +
        std::to_string(slowest) + ", still at clock " + std::to_string(min_clock) +
        " (the staleness bound needs " + std::to_string(it->needed) + ")");
    out->push_back(Outgoing{it->peer, ErrorReply(it->header.get().getRequestId(), server_id_, s)});
    it = held_.erase(it);
  }
}

Result<Frames> ServerCore::HandleClock(wire::Header::Reader h, std::vector<Outgoing>* out) {
  const int worker = h.getSenderId();
  PS_RETURN_IF_ERROR(CheckWorker(worker, "clock tick"));
  auto tick = h.getBody().getClock();
  const size_t w = static_cast<size_t>(worker);
  if (tick.getLeave()) {
    left_[w] = true;
  } else {
    PS_RETURN_IF_ERROR(CheckClock(tick.getClock(), "clock tick"));
    const uint32_t batches = tick.getBatches();
    if (batches > static_cast<uint32_t>(std::max(config_.num_workers, 1))) {
      return InvalidArgument("clock tick of worker " + std::to_string(worker) + " covers " +
                             std::to_string(batches) + " batches a clock: expected 0.." +
                             std::to_string(config_.num_workers) +
                             " (an all-reduce group's size, at most --num_workers)");
    }
    if (batches > 0) batches_per_clock_[w] = batches;
    if (left_[w]) {
      // Rejoining (after waiting for data): start at the slowest live clock, so that
      // nobody waits on clocks this worker skipped while it was out.
      const int64_t min_clock = MinLiveClock();
      left_[w] = false;
      if (min_clock != INT64_MAX) clocks_[w] = std::max(clocks_[w], min_clock);
    }
    // Clocks only move forward; a repeated tick changes nothing. Every worker ticks every
    // server, so the servers (and a backup's shadow) count the same batches.
    if (tick.getClock() > clocks_[w]) {
      job_batches_ += (tick.getClock() - clocks_[w]) * batches_per_clock_[w];
      clocks_[w] = tick.getClock();
    }
  }
  // The tick's reply goes first: it answers the request that released the others.
  capnp::MallocMessageBuilder b;
  const int64_t min_clock = MinLiveClock();
  NewHeader(b, h.getRequestId(), server_id_)
      .getBody()
      .initClockReply()
      .setMinClock(min_clock == INT64_MAX ? clocks_[w] : min_clock);
  Frames reply;
  reply.push_back(EncodeFrame(b));
  std::vector<Outgoing> released;
  ReleaseHeldPulls(&released);
  for (Outgoing& o : released) out->push_back(std::move(o));
  // Every --checkpoint_every clocks of the slowest live worker. Under BSP no push of that
  // clock can have arrived yet (its pull waits for this very tick), so the servers'
  // snapshots at one clock agree.
  // Or at the clock the coordinator named (--checkpoint_every=<N>s): exactly there, since
  // the other servers write that clock too; a clock passed in a jump (a worker left) is
  // missed, and the coordinator names a later one.
  int64_t checkpoint_at = -1;
  if (!config_.checkpoint_dir.empty() && min_clock != INT64_MAX) {
    if (config_.checkpoint_every > 0 &&
        min_clock >= last_checkpoint_clock_ + config_.checkpoint_every &&
        (!replacement_ || (min_clock - checkpoint_base_) % config_.checkpoint_every == 0)) {
      checkpoint_at = min_clock;
    } else if (checkpoint_requested_ >= 0 && min_clock >= checkpoint_requested_) {
      if (min_clock == checkpoint_requested_) {
        checkpoint_at = min_clock;
      } else {
        LOG(WARNING) << "server " << server_id_ << ": missed checkpoint clock "
                     << checkpoint_requested_ << " (the slowest clock jumped to " << min_clock
                     << ")";
      }
      checkpoint_requested_ = -1;
    }
  }
  if (checkpoint_at >= 0) {
    Status s = WriteCheckpoint(checkpoint_at);
    // A failed checkpoint must not stop training; the previous complete one still stands.
    if (!s.ok()) LOG(ERROR) << "server " << server_id_ << ": checkpoint failed: " << s.ToString();
  }
  return reply;
}

Result<Frames> ServerCore::HandleEvict(wire::Header::Reader h, std::vector<Outgoing>* out) {
  const int worker = h.getBody().getEvict().getWorker();
  Status known = CheckWorker(worker, "evict");
  if (!known.ok() && known.code() != StatusCode::kFailedPrecondition) return known;
  const size_t w = static_cast<size_t>(worker);
  if (!evicted_[w]) ++stats_.workers_evicted;
  evicted_[w] = true;
  left_[w] = true;
  // Its own held pulls will never be read; the others may now pass.
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->worker != worker) {
      ++it;
      continue;
    }
    out->push_back(Outgoing{it->peer, ErrorReply(it->header.get().getRequestId(), server_id_,
                                                 FailedPrecondition("worker evicted"))});
    it = held_.erase(it);
  }
  ReleaseHeldPulls(out);
  capnp::MallocMessageBuilder b;
  NewHeader(b, h.getRequestId(), server_id_).getBody().setEvictReply();
  Frames reply;
  reply.push_back(EncodeFrame(b));
  return reply;
}

}  // namespace ps
