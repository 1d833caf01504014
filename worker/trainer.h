// A worker process's training driver: registers with the coordinator, trains the job's
// model on its share of the data, and reports progress.
//
// Data: every epoch all workers draw the same permutation of the training set (seeded by
// the job seed and the epoch); worker r takes positions r, r + W, r + 2W, ... of it.
//
// A step: pull every table (dense range pulls, one per table, all in flight together),
// compute the gradient of the batch's mean loss, push it (asynchronously: the next step's
// pull goes out behind it on the same connections, so it sees it). Worker 0 evaluates the
// test set at the end of each epoch, and after the last one, once every worker is done,
// evaluates the final model.
//
// Thread model: one thread (the caller of RunWorker) drives everything; the KVClient has
// its own I/O thread.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "common/status.h"
#include "common/transport.h"

namespace ps {

struct WorkerOptions {
  // The coordinator's endpoint. Required.
  std::string coordinator;
  // "cpu", "cuda", "cuda:N" (see kernels/kernels.h).
  std::string device = "cpu";
  std::chrono::milliseconds register_timeout{120000};
  // How long a push or pull may take before the step fails.
  std::chrono::milliseconds request_timeout{60000};
};

Status RunWorker(const WorkerOptions& options, Transport* transport, const std::atomic<bool>& stop);

}  // namespace ps
