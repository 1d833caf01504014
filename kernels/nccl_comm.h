// NCCL communicators behind a plain host API: no CUDA or NCCL types leave kernels/.
// One communicator per all-reduce group (worker/group_comm.h builds on it); each call takes
// host floats, stages them on the communicator's GPU, runs the collective on the
// communicator's own stream and copies the result back.
//
// Hangs: an NCCL collective whose peer died never completes by itself. Every call waits on
// its stream with a deadline, checking ncclCommGetAsyncError; past the deadline it aborts
// the communicator (ncclCommAbort, as NCCL's documentation prescribes) and returns
// DeadlineExceeded. An aborted communicator fails every later call.
//
// In a build without CUDA or nccl.h, or where libnccl.so.2 cannot be loaded (it is opened
// at first use, not linked), every function returns FailedPrecondition.
//
// Thread model: a NcclComm is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"

namespace ps {

// The size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
constexpr size_t kNcclUniqueIdBytes = 128;

// Whether this build has NCCL and libnccl.so.2 loads here.
bool NcclBuiltIn();

// A fresh unique id. Its bootstrap root runs in this process, which must outlive the
// communicator's creation.
Result<std::vector<char>> NcclNewUniqueId();

class NcclComm {
 public:
  // Joins the communicator of `unique_id` as `rank` of `size` on GPU `device`; blocks until
  // every rank has joined or `timeout` passed.
  static Result<std::unique_ptr<NcclComm>> Create(std::span<const char> unique_id, int rank,
                                                  int size, int device,
                                                  std::chrono::milliseconds timeout);
  virtual ~NcclComm() = default;

  // Sums `n` floats of every rank into rank 0's `data` (ncclReduce, ncclSum); other ranks'
  // data are unchanged.
  virtual Status ReduceSumHost(float* data, size_t n, std::chrono::milliseconds timeout) = 0;
  // Rank 0's `n` floats to every rank (ncclBroadcast).
  virtual Status BroadcastHost(float* data, size_t n, std::chrono::milliseconds timeout) = 0;
  // Sums `n` floats of every rank into every rank's `data` (ncclAllReduce), for benchmarks.
  virtual Status AllReduceSumHost(float* data, size_t n, std::chrono::milliseconds timeout) = 0;
};

}  // namespace ps
