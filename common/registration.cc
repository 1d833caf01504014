#include "common/registration.h"

#include <kj/exception.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "common/wire.h"

namespace ps {

Result<Registration> RegisterWithCoordinator(Transport* transport,
                                             const std::string& coordinator_endpoint,
                                             const RegisterRequest& request,
                                             std::chrono::milliseconds timeout) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> socket,
                      transport->Connect(coordinator_endpoint));
  capnp::MallocMessageBuilder b;
  auto reg = NewHeader(b, 1, -1).getBody().initRegister();
  reg.setRole(request.is_server ? wire::Role::SERVER : wire::Role::WORKER);
  reg.setEndpoint(request.endpoint);
  reg.setDevice(request.device);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  reg.setHost(host);
  reg.setPid(static_cast<uint32_t>(getpid()));
  reg.setRequestedId(request.requested_id);
  reg.setGroup(request.group);
  Frames frames;
  frames.push_back(EncodeFrame(b));
  Result<CallReply> reply = Call(*socket, std::move(frames), timeout);
  if (!reply.ok()) {
    return reply.status().WithContext("registering with the coordinator at " +
                                      coordinator_endpoint);
  }
  Registration out;
  try {
    auto body = reply->header.get().getBody();
    if (body.which() != wire::Header::Body::REGISTER_REPLY) {
      return InvalidArgument("the coordinator answered registration with another message type");
    }
    auto r = body.getRegisterReply();
    out.id = static_cast<int>(r.getId());
    std::map<std::string, std::string> flags;
    for (auto kv : r.getConfig()) flags[kv.getKey().cStr()] = kv.getValue().cStr();
    Result<JobConfig> config = JobConfig::FromFlagMap(flags);
    if (!config.ok()) {
      // The coordinator validated these; failing here means the builds differ.
      return config.status().WithContext(
          "the coordinator's job config does not parse here (are the coordinator and this "
          "process built from the same version?)");
    }
    out.config = std::move(config).value();
    out.shard_map_version = r.getShardMap().getVersion();
    out.start_clock = r.getStartClock();
    out.start_epoch = std::max(1, static_cast<int>(r.getStartEpoch()));
    if (out.start_clock < 0) return InvalidArgument("the coordinator sent a negative start clock");
    out.replacement = r.getReplacement();
    out.restore_set = r.getRestoreSet().cStr();
    out.rejoin = r.getRejoin();
    for (uint32_t w : r.getEvictedWorkers()) out.evicted_workers.push_back(static_cast<int>(w));
    for (uint32_t w : r.getIdleWorkers()) out.idle_workers.push_back(static_cast<int>(w));
    for (auto s : r.getShardMap().getServers())
      out.server_endpoints.push_back(s.getEndpoint().cStr());
    if (r.hasGroup()) {
      auto g = r.getGroup();
      out.group.name = g.getName().cStr();
      out.group.rank = static_cast<int>(g.getRank());
      out.group.size = static_cast<int>(g.getSize());
      out.group.leader_endpoint = g.getLeaderEndpoint().cStr();
      for (uint32_t id : g.getMemberIds()) out.group.member_ids.push_back(static_cast<int>(id));
      if (out.group.size > 1 && (out.group.rank >= out.group.size ||
                                 static_cast<int>(out.group.member_ids.size()) != out.group.size)) {
        return InvalidArgument("the coordinator sent an inconsistent group assignment");
      }
    }
  } catch (const kj::Exception& e) {
    return InvalidArgument(std::string("malformed registration reply: ") +
                           e.getDescription().cStr());
  }
  if (static_cast<int>(out.server_endpoints.size()) != out.config.num_servers) {
    return InvalidArgument("the shard map lists " + std::to_string(out.server_endpoints.size()) +
                           " servers but the job has " + std::to_string(out.config.num_servers));
  }
  out.coordinator = std::move(socket);
  return out;
}

}  // namespace ps
