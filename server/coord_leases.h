// The coordinator's side of data leasing (common/lease_table.h): the lease requests held
// until a chunk is free, the per-epoch evaluations the evaluator is asked for, and the
// batch size each worker is told (--batch_size=auto: proportional to its throughput).
//
// Requests are answered in arrival order whenever something changes (a chunk completed or
// came back, a worker left): Answer() returns the replies to send, and the coordinator's
// loop sends them.
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/lease_table.h"
#include "common/status.h"

namespace ps {

struct LeaseDeskOptions {
  int epochs = 1;               // --epochs
  uint64_t chunk_examples = 1;  // --chunk_examples
  int batch_size = 1;           // --batch_size (the mean under auto)
  bool auto_batch = false;      // --batch_size=auto
};

// A lease request waiting for its answer.
struct HeldLease {
  std::string peer;
  uint64_t request_id = 0;
  int worker = -1;
  bool may_wait = true;  // false: answer `wait` rather than hold it
};

// One reply to a lease request: a chunk, `finished`, or `wait`, with the worker's batch
// size and, for the evaluator, an epoch to evaluate.
struct LeaseAnswer {
  std::string peer;
  int worker = -1;
  uint64_t request_id = 0;
  uint32_t batch_size = 0;
  std::optional<int> evaluate_epoch;
  std::optional<LeaseTable::Lease> chunk;
  bool finished = false;
  bool wait = false;
};

class LeaseDesk {
 public:
  explicit LeaseDesk(LeaseDeskOptions options);

  LeaseTable& table() { return table_; }
  const LeaseTable& table() const { return table_; }

  // `worker` finished `chunk` of `epoch`; returns the epochs every chunk of which is now
  // complete (ascending). Each but the last is queued for the evaluator.
  Result<std::vector<int>> Complete(int worker, int epoch, uint64_t chunk);
  // The worker's throughput, examples/s (for --batch_size=auto).
  void SetRate(int worker, double examples_per_sec);
  // Returns the chunks `worker` holds to the queue and drops its held requests; how many
  // chunks.
  int Release(int worker);
  void Hold(HeldLease request) { held_.push_back(std::move(request)); }

  // The requests that can be answered now (removed from the held ones). `live[w]`: worker
  // w is neither dead nor left; `evaluator`: the worker told which epochs to evaluate.
  std::vector<LeaseAnswer> Answer(int evaluator, const std::vector<bool>& live);
  uint32_t BatchSizeFor(int worker, const std::vector<bool>& live) const;

  // The epochs queued for the evaluator, for the journal (server/coord_resume.h).
  const std::vector<int>& evaluations() const { return evaluations_; }
  void set_evaluations(std::vector<int> epochs) { evaluations_ = std::move(epochs); }
  // Drops the held requests of `worker` with request id `request_id` (a resend replaces
  // them).
  void DropHeld(int worker, uint64_t request_id);

 private:
  LeaseDeskOptions options_;
  LeaseTable table_;
  std::vector<HeldLease> held_;
  std::vector<double> rates_;     // per worker: examples/s (0: not known yet)
  std::vector<int> evaluations_;  // epochs the evaluator should evaluate
};

}  // namespace ps
