// Joining a job: a server or worker connects to the coordinator, says who it is, and
// gets back its id, the job config and the shard map. The coordinator answers once every
// expected process has registered, so this call also waits for the job to assemble.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"
#include "common/transport.h"

namespace ps {

struct RegisterRequest {
  bool is_server = false;
  std::string endpoint;  // servers: where they listen
  std::string device;    // workers: device description
  // The id a launcher gave this process (so that worker-3.log is worker 3); -1 lets the
  // coordinator assign ids in registration order. A taken or out-of-range id is ignored.
  int requested_id = -1;
  // Workers: the all-reduce group to join by name (workers of one name form one group, on
  // one host); empty follows the job's --group_size.
  std::string group;
};

// A worker's place in an all-reduce group (worker/group_comm.h); size <= 1: no group.
struct GroupInfo {
  std::string name;
  int rank = 0;  // 0: the leader
  int size = 0;
  std::string leader_endpoint;  // where the leader's group socket listens
  std::vector<int> member_ids;  // worker ids by rank
};

struct Registration {
  int id = 0;  // within the role
  JobConfig config;
  std::vector<std::string> server_endpoints;  // by server id
  uint64_t shard_map_version = 0;
  GroupInfo group;  // workers
  // A job restored from a checkpoint (--restore): the clock its workers start at and the
  // epoch training resumes at; 0 and 1 for a fresh job.
  int64_t start_clock = 0;
  int start_epoch = 1;
  // Servers: this one replaces a dead server of the running job (--replicas=1): restore
  // `restore_set` ("" : start from the initial values), evict `evicted_workers` and take
  // `idle_workers` out of the clock table (see RegisterReply in common/protocol.capnp).
  bool replacement = false;
  std::string restore_set;
  std::vector<int> evicted_workers;
  std::vector<int> idle_workers;
  // Servers, --replicas=2: this one restarts a dead server whose backup serves its shards;
  // it starts empty and is sent them (RegisterReply.rejoin in common/protocol.capnp).
  bool rejoin = false;
  // Still connected to the coordinator, for reports and the end of the job.
  std::unique_ptr<ClientSocket> coordinator;
};

// Registers with the coordinator at `coordinator_endpoint`. Fails with DeadlineExceeded
// when the job has not assembled within `timeout`, or with the coordinator's error
// (e.g. version mismatch, job full).
Result<Registration> RegisterWithCoordinator(Transport* transport,
                                             const std::string& coordinator_endpoint,
                                             const RegisterRequest& request,
                                             std::chrono::milliseconds timeout);

}  // namespace ps
