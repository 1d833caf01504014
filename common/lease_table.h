// Data leasing: each epoch's examples are cut into chunks that workers lease one at a
// time, so a fast worker simply leases more, and a chunk whose worker left goes back to the
// queue: an epoch covers every example exactly once, whoever processes it.
//
// Chunk k of epoch e is positions [k * chunk_examples, min(n, (k+1) * chunk_examples)) of
// that epoch's example order (a seeded permutation every worker computes the same way, see
// EpochShare in worker/trainer.h). Epoch e + 1 opens once every chunk of epoch e has been
// handed out, so workers never idle at an epoch boundary while others finish.
//
// Thread model: not thread-safe; the coordinator (or a local source) owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "common/status.h"

namespace ps {

class LeaseTable {
 public:
  struct Lease {
    int epoch = 0;  // 1-based
    uint64_t chunk = 0;
    uint64_t begin = 0;  // positions in the epoch's order
    uint64_t end = 0;
  };

  // Everything the table holds, for a coordinator that journals it and resumes
  // (server/coord_resume.h).
  struct Outstanding {
    int epoch = 0;
    uint64_t chunk = 0;
    int worker = -1;
  };
  struct State {
    uint64_t examples = 0;
    int opened_epochs = 0;
    std::vector<Lease> pending;  // in queue order
    std::vector<Outstanding> outstanding;
    std::vector<uint64_t> chunks_done, examples_done;  // per epoch
    std::vector<int> newly_completed;
  };

  LeaseTable(int epochs, uint64_t chunk_examples);

  State Snapshot() const;
  // Takes `state` in (a snapshot of a table with the same epochs and chunk size); an error
  // when it does not fit them.
  Status Restore(const State& state);

  // The number of training examples; the first call fixes it, later ones must agree
  // (every worker reads the same data set).
  Status SetDatasetSize(uint64_t examples);
  bool has_dataset_size() const { return examples_ > 0; }

  // The next chunk for `worker`, or nullopt when none is pending right now.
  std::optional<Lease> Acquire(int worker);
  // `worker` finished the chunk. An error when it does not hold it.
  Status Complete(int worker, int epoch, uint64_t chunk);
  // Returns every chunk `worker` holds to the front of the queue; how many.
  int Release(int worker);

  // A job restored from a checkpoint: epochs before `epoch` count as done and are never
  // handed out (nor reported by TakeCompletedEpochs). Call before the first Acquire.
  void StartAtEpoch(int epoch);

  // Every chunk of every epoch completed.
  bool AllDone() const;
  // Epochs whose every chunk completed since the last call, ascending.
  std::vector<int> TakeCompletedEpochs();
  // Examples of completed chunks, by epoch (index 0 is epoch 1).
  const std::vector<uint64_t>& examples_per_epoch() const { return examples_done_; }
  uint64_t chunks_per_epoch() const { return chunks_per_epoch_; }
  size_t outstanding() const { return outstanding_.size(); }

 private:
  void OpenNextEpochIfIdle();

  const int epochs_;
  const uint64_t chunk_examples_;
  uint64_t examples_ = 0;
  uint64_t chunks_per_epoch_ = 0;
  int opened_epochs_ = 0;
  std::deque<Lease> pending_;
  std::map<std::pair<int, uint64_t>, int> outstanding_;  // (epoch, chunk) -> worker
  std::vector<uint64_t> chunks_done_;                    // per epoch
  std::vector<uint64_t> examples_done_;                  // per epoch
  std::vector<int> newly_completed_;
};

}  // namespace ps
