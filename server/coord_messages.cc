#include "server/coord_messages.h"

#include <map>

namespace ps {

Member MemberFromRegistration(const std::string& peer, uint64_t rid, wire::Register::Reader reg) {
  Member m;
  m.peer = peer;
  m.endpoint = reg.getEndpoint().cStr();
  m.device = reg.getDevice().cStr();
  m.host = reg.getHost().cStr();
  m.pid = reg.getPid();
  m.register_request = rid;
  m.requested_id = reg.getRequestedId();
  m.group = reg.getGroup().cStr();
  return m;
}

void SetConfigAndShardMap(wire::RegisterReply::Builder r, const JobConfig& config,
                          const std::vector<Member>& servers) {
  const std::map<std::string, std::string> flags = config.ToFlagMap();
  auto cfg = r.initConfig(static_cast<unsigned>(flags.size()));
  unsigned i = 0;
  for (const auto& [k, v] : flags) {
    cfg[i].setKey(k);
    cfg[i].setValue(v);
    ++i;
  }
  auto map = r.initShardMap();
  map.setVersion(1);
  auto list = map.initServers(static_cast<unsigned>(servers.size()));
  for (unsigned s = 0; s < servers.size(); ++s) {
    list[s].setId(s);
    list[s].setEndpoint(servers[s].endpoint);
  }
}

void SetGroup(wire::RegisterReply::Builder r, const GroupPlan& plan, int rank) {
  auto g = r.initGroup();
  g.setName(plan.name);
  g.setRank(static_cast<uint32_t>(rank));
  g.setSize(static_cast<uint32_t>(plan.ids.size()));
  g.setLeaderEndpoint(plan.endpoint);
  auto ids = g.initMemberIds(static_cast<unsigned>(plan.ids.size()));
  for (unsigned k = 0; k < plan.ids.size(); ++k) ids.set(k, plan.ids[k]);
}

void SetReplacement(wire::RegisterReply::Builder r, const std::string& restore_set,
                    const std::vector<uint32_t>& evicted, const std::vector<uint32_t>& idle) {
  r.setReplacement(true);
  r.setRestoreSet(restore_set);
  auto ev = r.initEvictedWorkers(static_cast<unsigned>(evicted.size()));
  for (unsigned j = 0; j < evicted.size(); ++j) ev.set(j, evicted[j]);
  auto id = r.initIdleWorkers(static_cast<unsigned>(idle.size()));
  for (unsigned j = 0; j < idle.size(); ++j) id.set(j, idle[j]);
}

void SetLeaseReply(wire::LeaseReply::Builder reply, const LeaseAnswer& a) {
  reply.setBatchSize(a.batch_size);
  if (a.evaluate_epoch) reply.setEvaluateEpoch(*a.evaluate_epoch);
  if (a.chunk) {
    auto chunk = reply.initChunk();
    chunk.setEpoch(a.chunk->epoch);
    chunk.setIndex(a.chunk->chunk);
    chunk.setBegin(a.chunk->begin);
    chunk.setEnd(a.chunk->end);
  } else if (a.finished) {
    reply.setFinished();
  } else {
    reply.setWait();
  }
}

void SetRedirects(wire::AliveReply::Builder reply,
                  const std::vector<std::pair<uint32_t, std::string>>& redirects) {
  auto list = reply.initRedirects(static_cast<unsigned>(redirects.size()));
  for (unsigned i = 0; i < redirects.size(); ++i) {
    list[i].setId(redirects[i].first);
    list[i].setEndpoint(redirects[i].second);
  }
}

}  // namespace ps
