// Training in an all-reduce group (worker/group_comm.h).
//
// The leader (rank 0, the group's lowest worker id) is the group's only member of the SSP
// clock table and its only lessee of data: it leases a chunk, and each group step covers G
// batches of it, one per member (member r takes the r-th slice of the step's positions;
// every process computes the same epoch order). A step: the leader broadcasts the step
// (control words), pulls the parameters and broadcasts them, every member computes its
// batch's gradient, the leader sums them in rank order and pushes the SUM, then ticks its
// clock. The batches' loss and accuracy travel with the gradients, so the leader's
// progress reports cover the group (members send none). Sum, not mean: every push is a batch's mean
// gradient (times n / batch_size), so the sum of G of them moves the model as G ungrouped pushes
// would, and --base_lr and the schedule keep their meaning: the leader's clock ticks say that
// each of its clocks is G batches (KVClient::SetBatchesPerClock), so the servers' schedule
// and n-softsync's c count batches, not pushes.
//
// Failure: any group call that fails (a member not heard from within
// --group_timeout_seconds, a dead peer, a malformed message) dissolves the group. Nothing
// of the failed step is pushed (no partial sum). The leader tells the survivors (best
// effort), trains the step's examples again on its own and carries on alone; each
// survivor rejoins the clock table and leases data on its own like any ungrouped worker.
// A member whose leader is silent for the timeout does the same. While the leader waits
// for data (nothing left to lease) the members wait with it without a deadline.
//
// Thread model: the caller's thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "common/job_config.h"
#include "common/status.h"
#include "worker/group_comm.h"
#include "worker/kv_client.h"
#include "worker/model.h"

namespace ps {

// Control words from the leader: {kGroupStep, epoch, begin, count}, {kGroupIdle},
// {kGroupFinished}.
constexpr int64_t kGroupStep = 1;
constexpr int64_t kGroupIdle = 2;
constexpr int64_t kGroupFinished = 3;

// The positions [first, second) of a step of `count` positions that rank `rank` of `size`
// trains, relative to the step's first position: contiguous slices of ceil(count / size),
// the last ones shorter or empty.
std::pair<uint64_t, uint64_t> MemberSlice(uint64_t count, int rank, int size);

struct GroupMemberResult {
  bool dissolved = false;  // the group broke: train alone from here
  // This member's share of the group's steps (for its log: the leader counts every step
  // it pushed, so the job's totals are exact even when a step is redone after a failure).
  int64_t examples = 0;
  int64_t steps = 0;
};

// A member's (rank > 0) life in the group: leaves the clock table, then follows the
// leader's steps until it says the job is finished, or the group breaks (dissolved; the
// caller then rejoins the clock table and trains alone). Errors are the worker's own
// (a model error, a stop signal).
Result<GroupMemberResult> RunGroupMember(const JobConfig& config, KVClient* client,
                                         TrainableModel* model, GroupComm* group,
                                         const std::atomic<bool>& stop);

}  // namespace ps
