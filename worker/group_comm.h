// All-reduce groups: workers on one node sum their gradients at the group's leader, which
// alone talks to the servers (it pushes the sum, pulls, and hands the parameters back).
//
// Backends behind one interface:
//   cpu:  ZeroMQ over ipc://, reduce-broadcast at the leader. Every member sends its
//         tensors to the leader in one multipart message; the leader adds them in rank
//         order (rank 0 + rank 1 + ...), so the sum is the same bit for bit on every run
//         whatever order the messages arrive in, and broadcasts by sending each member the
//         same frames. Why not a ring: a ring's advantage is spreading the reduction over
//         every member's links and cores; on one node with 2-16 cores the members share the
//         memory bus, ipc costs a copy per hop either way, and a ring needs 2(G-1) lockstep
//         hops per tensor where any straggler stalls everyone and a dead member is harder
//         to name. Reduce-broadcast is 2 hops, one socket per member, and deterministic.
//   nccl: NCCL (kernels/nccl_comm.h) moves the floats; the cpu channel above still carries
//         the control words and the unique id, and its timeouts detect dead members.
//
// Failure: every wait has the group timeout. A member that is not heard from in time makes
// the call fail (DeadlineExceeded naming the ranks missing); the leader's tensors are then
// left as they were, so a partial sum is never pushed. What the group does next (it
// dissolves and the survivors train on their own) is the training loop's business.
//
// Thread model: a GroupComm is used by one thread (the training loop's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport.h"

namespace ps {

struct GroupCommOptions {
  // This worker's rank in the group (0 leads) and the group's size (>= 1).
  int rank = 0;
  int size = 1;
  // Where the leader's socket listens (ipc:// on one node; tcp:// and inproc:// work too).
  // The leader binds it, the members connect.
  std::string leader_endpoint;
  // How long any wait for another member may take before the call fails.
  std::chrono::milliseconds timeout{60000};
  // "cpu", or "cuda:N" for the NCCL backend on GPU N.
  std::string device = "cpu";
};

class GroupComm {
 public:
  virtual ~GroupComm() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool leader() const { return rank_ == 0; }
  virtual std::string backend() const = 0;

  // Sums every rank's `tensors` (the same count and sizes everywhere) at the leader, in
  // rank order. Leader: tensors become the sum. Members: tensors are left unchanged. On an
  // error the leader's tensors are unchanged.
  virtual Status ReduceSum(const std::vector<std::span<float>>& tensors) = 0;
  // The leader's tensors to every member (members' tensors are overwritten).
  virtual Status Broadcast(const std::vector<std::span<float>>& tensors) = 0;
  // A few control words from the leader to every member: the leader sends *words, a member
  // receives into *words (any length up to 64). A member waits up to `timeout` (0: the
  // group timeout); one that timed out may call again for the same message. A member whose
  // leader dissolved the group gets Aborted.
  virtual Status BroadcastControl(std::vector<int64_t>* words,
                                  std::chrono::milliseconds timeout = {}) = 0;
  // Leader: tells every member, best effort, that the group is over (their next call
  // fails with Aborted). Members: nothing.
  virtual void Dissolve() = 0;

  // ReduceSum then Broadcast: every rank ends with the sum.
  Status AllReduceSum(const std::vector<std::span<float>>& tensors);

 protected:
  GroupComm(int rank, int size) : rank_(rank), size_(size) {}

 private:
  const int rank_;
  const int size_;
};

// Joins the group: the leader binds its endpoint and waits (up to the timeout) until every
// member has said hello; a member connects and says hello. Picks the backend from
// options.device: "cpu" the ZeroMQ one, "cuda..." NCCL (FailedPrecondition in a build without
// NCCL). InvalidArgument for a bad rank, size or endpoint.
Result<std::unique_ptr<GroupComm>> JoinGroup(Transport* transport, const GroupCommOptions& options);

// The cpu backend alone (also the nccl backend's control channel).
Result<std::unique_ptr<GroupComm>> JoinCpuGroup(Transport* transport,
                                                const GroupCommOptions& options);

}  // namespace ps
