// The coordinator's side of its messages (common/protocol.capnp): what a registration
// says about its sender, and the replies' bodies built from the parts' decisions.
//
// Thread model: free functions on the caller's builders and readers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/job_config.h"
#include "common/wire.h"
#include "server/coord_leases.h"
#include "server/coord_membership.h"

namespace ps {

// The process a registration (request `rid` from `peer`) describes.
Member MemberFromRegistration(const std::string& peer, uint64_t rid, wire::Register::Reader reg);

// The job config and the shard map (the servers' endpoints now).
void SetConfigAndShardMap(wire::RegisterReply::Builder r, const JobConfig& config,
                          const std::vector<Member>& servers);
// A worker's all-reduce group, with its `rank` there.
void SetGroup(wire::RegisterReply::Builder r, const GroupPlan& plan, int rank);
// A replacement server: the set to restore ("": the initial values) and the workers that
// are gone (evicted) or done (idle).
void SetReplacement(wire::RegisterReply::Builder r, const std::string& restore_set,
                    const std::vector<uint32_t>& evicted, const std::vector<uint32_t>& idle);
void SetLeaseReply(wire::LeaseReply::Builder reply, const LeaseAnswer& a);
// Where dead servers' shards are served now: (id, endpoint).
void SetRedirects(wire::AliveReply::Builder reply,
                  const std::vector<std::pair<uint32_t, std::string>>& redirects);

}  // namespace ps
