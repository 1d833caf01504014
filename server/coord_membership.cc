#include "server/coord_membership.h"

#include <glog/logging.h>
#include <unistd.h>

#include <map>
#include <optional>

#include "common/transport.h"

namespace ps {

MembershipOptions MembershipOptions::ForJob(const JobConfig& config) {
  MembershipOptions o;
  o.num_servers = config.num_servers;
  o.num_workers = config.num_workers;
  o.group_size = config.group_size;
  o.heartbeat_timeout = std::chrono::duration<double>(config.heartbeat_timeout);
  // ipc paths are limited to ~100 bytes: the coordinator's pid, a start stamp and the
  // group's index keep them short and unique on the host.
  o.group_endpoint_prefix =
      "ipc:///tmp/ps-group-" + std::to_string(getpid()) + "-" +
      std::to_string(CoordClock::now().time_since_epoch().count() % 1000000007) + "-";
  return o;
}

std::string DeviceKind(const std::string& device) {
  if (device.find("(cuda:") != std::string::npos) return "cuda";
  return device.substr(0, device.find_first_of(": "));
}

void AssignIds(std::vector<Member>& members) {
  std::vector<std::optional<Member>> slots(members.size());
  std::vector<Member> rest;
  for (Member& m : members) {
    const int want = m.requested_id;
    if (want >= 0 && want < static_cast<int>(slots.size()) && !slots[static_cast<size_t>(want)]) {
      slots[static_cast<size_t>(want)] = std::move(m);
    } else {
      if (want >= 0) LOG(WARNING) << "requested id " << want << " is taken or out of range";
      rest.push_back(std::move(m));
    }
  }
  size_t next = 0;
  for (auto& slot : slots) {
    if (!slot) slot = std::move(rest[next++]);
  }
  members.clear();
  for (auto& slot : slots) members.push_back(std::move(*slot));
}

Status Membership::AddServer(Member m) {
  if (static_cast<int>(servers_.size()) >= options_.num_servers) {
    return FailedPrecondition("the job is full: it has all " +
                              std::to_string(options_.num_servers) +
                              " of its servers (--num_servers)");
  }
  PS_RETURN_IF_ERROR(ValidateEndpoint(m.endpoint));
  servers_.push_back(std::move(m));
  return Status::Ok();
}

Status Membership::AddWorker(Member m) {
  if (static_cast<int>(workers_.size()) >= options_.num_workers) {
    return FailedPrecondition("the job is full: it has all " +
                              std::to_string(options_.num_workers) +
                              " of its workers (--num_workers)");
  }
  workers_.push_back(std::move(m));
  return Status::Ok();
}

bool Membership::complete() const {
  return static_cast<int>(servers_.size()) >= options_.num_servers &&
         static_cast<int>(workers_.size()) >= options_.num_workers;
}

Result<std::vector<GroupPlan>> Membership::Assemble(CoordClock::time_point now) {
  AssignIds(servers_);
  AssignIds(workers_);
  PS_ASSIGN_OR_RETURN(std::vector<GroupPlan> groups, FormGroups());
  for (const GroupPlan& g : groups) {
    for (uint32_t id : g.ids) workers_[id].group_formed = g.name;
  }
  for (auto* group : {&servers_, &workers_}) {
    for (Member& m : *group) m.last_seen = now;
  }
  assembled_ = true;
  return groups;
}

void Membership::Restore(std::vector<Member> servers, std::vector<Member> workers,
                         CoordClock::time_point now) {
  servers_ = std::move(servers);
  workers_ = std::move(workers);
  for (auto* group : {&servers_, &workers_}) {
    for (Member& m : *group) m.last_seen = now;
  }
  assembled_ = true;
}

// All-reduce groups of two or more workers: by --group=NAME where a worker gave one, else
// by id under --group_size. The lowest id leads (so worker 0, which evaluates, always
// leads its group). A group must sit on one host (its channel is ipc) and hold one kind of
// device (one backend: NCCL or the CPU one).
Result<std::vector<GroupPlan>> Membership::FormGroups() const {
  std::map<std::string, std::vector<uint32_t>> by_name;
  for (uint32_t i = 0; i < workers_.size(); ++i) {
    std::string name = workers_[i].group;
    if (name.empty() && options_.group_size > 1) {
      name = "size" + std::to_string(options_.group_size) + "-" +
             std::to_string(i / static_cast<uint32_t>(options_.group_size));
    }
    if (!name.empty()) by_name[name].push_back(i);
  }
  std::vector<GroupPlan> plans;
  for (auto& [name, ids] : by_name) {
    if (ids.size() < 2) continue;  // a group of one is just a worker
    const Member& leader = workers_[ids[0]];
    for (uint32_t id : ids) {
      const Member& m = workers_[id];
      if (DeviceKind(m.device) != DeviceKind(leader.device)) {
        return InvalidArgument("all-reduce group '" + name + "' mixes devices: worker " +
                               std::to_string(ids[0]) + " has '" + leader.device + "' and worker " +
                               std::to_string(id) + " has '" + m.device +
                               "'; a group holds one kind of device (give each kind its own "
                               "--group)");
      }
      if (m.host != leader.host) {
        return InvalidArgument("all-reduce group '" + name + "' spans hosts: worker " +
                               std::to_string(ids[0]) + " is on " + leader.host + " and worker " +
                               std::to_string(id) + " on " + m.host +
                               "; a group reduces within one node");
      }
    }
    GroupPlan plan;
    plan.name = name;
    plan.ids = ids;
    plan.endpoint = options_.group_endpoint_prefix + std::to_string(plans.size());
    plans.push_back(std::move(plan));
  }
  return plans;
}

uint32_t Membership::Join(Member m, CoordClock::time_point now) {
  m.joined = true;
  m.last_seen = now;
  workers_.push_back(std::move(m));
  return static_cast<uint32_t>(workers_.size() - 1);
}

bool Membership::OnAlive(bool server, int id, uint32_t pid, CoordClock::time_point now) {
  std::vector<Member>& group = server ? servers_ : workers_;
  if (id < 0 || static_cast<size_t>(id) >= group.size()) return false;
  Member& m = group[static_cast<size_t>(id)];
  bool evicted = m.dead || m.left;
  // A server declared dead (stopped, say) that wakes after another process took its id:
  // its beats are not the replacement's, and it must stop.
  if (server && pid != 0 && pid != m.pid) evicted = true;
  if (!evicted) m.last_seen = now;
  return evicted;
}

void Membership::ForgiveStall(CoordClock::duration stall) {
  for (std::vector<Member>* role : {&servers_, &workers_}) {
    for (Member& m : *role) m.last_seen += stall;
  }
}

void Membership::Touch(int worker, CoordClock::time_point now) {
  workers_[static_cast<size_t>(worker)].last_seen = now;
}

std::vector<int> Membership::SilentWorkers(CoordClock::time_point now, int only) const {
  std::vector<int> silent;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (Gone(w) || (only >= 0 && static_cast<int>(w) != only)) continue;
    if (now - workers_[w].last_seen > options_.heartbeat_timeout) {
      silent.push_back(static_cast<int>(w));
    }
  }
  return silent;
}

std::vector<int> Membership::TakeSilentServers(CoordClock::time_point now) {
  std::vector<int> silent;
  for (size_t s = 0; s < servers_.size(); ++s) {
    Member& m = servers_[s];
    if (m.silent_reported || now - m.last_seen <= options_.heartbeat_timeout) continue;
    m.silent_reported = true;
    silent.push_back(static_cast<int>(s));
  }
  return silent;
}

double Membership::SilentSeconds(const Member& m, CoordClock::time_point now) const {
  return std::chrono::duration<double>(now - m.last_seen).count();
}

int Membership::Evaluator() const {
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!Gone(w)) return static_cast<int>(w);
  }
  return -1;
}

bool Membership::AllLiveDone() const {
  bool any = false;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (Gone(w)) continue;
    if (!workers_[w].result.done) return false;
    any = true;
  }
  return any;
}

std::vector<bool> Membership::Training() const {
  std::vector<bool> training(workers_.size());
  for (size_t w = 0; w < workers_.size(); ++w) {
    training[w] = !workers_[w].result.done && !Gone(w);
  }
  return training;
}

std::vector<bool> Membership::Live() const {
  std::vector<bool> live(workers_.size());
  for (size_t w = 0; w < workers_.size(); ++w) live[w] = !Gone(w);
  return live;
}

void Membership::GoneAndIdle(std::vector<uint32_t>* evicted, std::vector<uint32_t>* idle) const {
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (Gone(w)) {
      evicted->push_back(static_cast<uint32_t>(w));
    } else if (workers_[w].result.done) {
      idle->push_back(static_cast<uint32_t>(w));
    }
  }
}

int Membership::WorkerIndex(const std::string& peer) const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].peer == peer) return static_cast<int>(i);
  }
  return -1;
}

int Membership::ServerIndex(const std::string& peer) const {
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i].peer == peer) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace ps
