#include "server/coordinator.h"

#include <glog/logging.h>
#include <kj/exception.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "common/lease_table.h"
#include "common/lr_policy.h"
#include "common/run_files.h"
#include "common/wire.h"
#include "server/checkpoint.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Member {
  std::string peer;  // routing identity of its registration socket
  std::string endpoint;
  std::string device;
  std::string host;
  uint32_t pid = 0;
  uint64_t register_request = 0;
  int requested_id = -1;
  std::string group;         // workers: --group=NAME
  std::string group_formed;  // workers: the all-reduce group they are in ("" for none)
  // Failures: when the coordinator last heard from it, and whether it is gone.
  Clock::time_point last_seen;
  bool dead = false;             // declared dead (silent past --heartbeat_timeout)
  bool left = false;             // left the job (SIGTERM)
  bool joined = false;           // joined the running job
  bool silent_reported = false;  // servers: a silence already listed in failures
};

// "cpu: 2 threads" -> "cpu", "NVIDIA H200 (cuda:0)" -> "cuda": what a group may not mix.
std::string DeviceKind(const std::string& device) {
  if (device.find("(cuda:") != std::string::npos) return "cuda";
  return device.substr(0, device.find_first_of(": "));
}

// One all-reduce group as the coordinator formed it.
struct GroupPlan {
  std::string name;
  std::vector<uint32_t> ids;  // worker ids, ascending: ids[0] leads
  std::string endpoint;
};

// Ids within a role: requested ids where valid and free, then arrival order.
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

struct WorkerResult {
  bool done = false;
  bool failed = false;
  std::string message;
  json totals = json::object();
  uint64_t done_request = 0;
};

class CoordinatorJob {
 public:
  CoordinatorJob(const JobConfig& config, const CoordinatorOptions& options, Transport* transport)
      : config_(config),
        options_(options),
        transport_(transport),
        leases_(config.epochs, static_cast<uint64_t>(config.chunk_examples)) {}

  Status Run(const std::atomic<bool>& stop) {
    PS_RETURN_IF_ERROR(MakeDirs(options_.run_dir));
    PS_RETURN_IF_ERROR(ResolveRestore());
    PS_ASSIGN_OR_RETURN(metrics_, MetricsLog::Open(options_.run_dir + "/metrics.jsonl"));
    PS_ASSIGN_OR_RETURN(socket_, transport_->Listen(options_.listen));
    LOG(INFO) << "coordinator listening on " << socket_->BoundEndpoint();
    if (!options_.endpoint_file.empty()) {
      PS_RETURN_IF_ERROR(WriteTextFile(options_.endpoint_file, socket_->BoundEndpoint() + "\n"));
    }
    job_start_ = Clock::now();
    Status outcome = Register(stop);
    if (!outcome.ok()) {
      // Tell whoever did register, so that no process waits on a job that will not start.
      for (const auto* group : {&servers_, &workers_}) {
        for (const Member& m : *group) ReplyError(m.peer, m.register_request, outcome);
      }
      servers_.clear();
    } else {
      outcome = Train(stop);
    }
    RecordWholeSet();  // the workers are done: a whole set waits on nobody
    for (const Member& m : waiting_servers_) {
      ReplyError(m.peer, m.register_request,
                 FailedPrecondition("the job ended with no dead server to replace"));
    }
    waiting_servers_.clear();
    json servers = json::array();
    // Servers are shut down whatever happened, so that no process outlives the job.
    Status shut = ShutdownServers(&servers);
    if (outcome.ok()) outcome = shut;
    Status written = WriteSummary(outcome, servers);
    if (outcome.ok()) outcome = written;
    return outcome;
  }

 private:
  static Status WriteTextFile(const std::string& path, const std::string& text) {
    std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) return Unavailable("cannot write " + tmp);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return Unavailable("cannot rename " + tmp);
    return Status::Ok();
  }

  Status Send(const std::string& peer, capnp::MallocMessageBuilder& b) {
    Frames f;
    f.push_back(EncodeFrame(b));
    return socket_->Send(peer, std::move(f));
  }

  void ReplyError(const std::string& peer, uint64_t request_id, const Status& error) {
    LOG(WARNING) << "coordinator: rejecting a request: " << error.ToString();
    Status s = socket_->Send(peer, ErrorReply(request_id, -1, error));
    if (!s.ok()) LOG(WARNING) << "coordinator: " << s.ToString();
  }

  // Decodes a request; on failure answers with an error and returns nullopt.
  std::optional<DecodedHeader> Decode(Incoming& in) {
    if (in.frames.empty()) return std::nullopt;
    Result<DecodedHeader> h = DecodedHeader::Decode(in.frames[0]);
    if (!h.ok()) {
      ReplyError(in.peer, 0, h.status());
      return std::nullopt;
    }
    Status v = CheckProtocolVersion(h->get());
    if (!v.ok()) {
      ReplyError(in.peer, h->get().getRequestId(), v);
      return std::nullopt;
    }
    return std::move(h).value();
  }

  // All-reduce groups of two or more workers: by --group=NAME where a worker gave one, else
  // by id under --group_size. The lowest id leads (so worker 0, which evaluates, always
  // leads its group). A group must sit on one host (its channel is ipc) and hold one kind of
  // device (one backend: NCCL or the CPU one).
  Result<std::vector<GroupPlan>> FormGroups() const {
    std::map<std::string, std::vector<uint32_t>> by_name;
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      std::string name = workers_[i].group;
      if (name.empty() && config_.group_size > 1) {
        name = "size" + std::to_string(config_.group_size) + "-" +
               std::to_string(i / static_cast<uint32_t>(config_.group_size));
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
                                 std::to_string(ids[0]) + " has '" + leader.device +
                                 "' and worker " + std::to_string(id) + " has '" + m.device +
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
      // ipc paths are limited to ~100 bytes: the coordinator's pid, a start stamp and the
      // group's index keep them short and unique on the host.
      plan.endpoint = "ipc:///tmp/ps-group-" + std::to_string(getpid()) + "-" +
                      std::to_string(job_start_.time_since_epoch().count() % 1000000007) + "-" +
                      std::to_string(plans.size());
      plans.push_back(std::move(plan));
    }
    return plans;
  }

  Status Register(const std::atomic<bool>& stop) {
    const auto deadline = Clock::now() + options_.register_timeout;
    std::printf("waiting for %d servers and %d workers to register on %s\n", config_.num_servers,
                config_.num_workers, socket_->BoundEndpoint().c_str());
    std::fflush(stdout);
    while (static_cast<int>(servers_.size()) < config_.num_servers ||
           static_cast<int>(workers_.size()) < config_.num_workers) {
      if (stop.load()) return Aborted("coordinator stopped by signal during registration");
      if (Clock::now() > deadline) {
        return DeadlineExceeded("only " + std::to_string(servers_.size()) + " of " +
                                std::to_string(config_.num_servers) + " servers and " +
                                std::to_string(workers_.size()) + " of " +
                                std::to_string(config_.num_workers) +
                                " workers registered within " +
                                std::to_string(options_.register_timeout.count()) + " ms");
      }
      Result<Incoming> in = socket_->Recv(options_.poll_interval);
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
        return in.status();
      }
      std::optional<DecodedHeader> h = Decode(*in);
      if (!h) continue;
      try {
        auto header = h->get();
        if (header.getBody().which() == wire::Header::Body::STATUS) {
          ReplyStatus(in->peer, header.getRequestId());
          continue;
        }
        if (header.getBody().which() != wire::Header::Body::REGISTER) {
          ReplyError(in->peer, header.getRequestId(),
                     FailedPrecondition("the job is still assembling: only registrations are "
                                        "accepted now"));
          continue;
        }
        auto reg = header.getBody().getRegister();
        Member m;
        m.peer = in->peer;
        m.endpoint = reg.getEndpoint().cStr();
        m.device = reg.getDevice().cStr();
        m.host = reg.getHost().cStr();
        m.pid = reg.getPid();
        m.register_request = header.getRequestId();
        m.requested_id = reg.getRequestedId();
        m.group = reg.getGroup().cStr();
        if (reg.getRole() == wire::Role::SERVER) {
          if (static_cast<int>(servers_.size()) >= config_.num_servers) {
            ReplyError(in->peer, m.register_request,
                       FailedPrecondition("the job is full: it has all " +
                                          std::to_string(config_.num_servers) +
                                          " of its servers (--num_servers)"));
            continue;
          }
          Status ep = ValidateEndpoint(m.endpoint);
          if (!ep.ok()) {
            ReplyError(in->peer, m.register_request, ep);
            continue;
          }
          LOG(INFO) << "server registered: " << m.endpoint << " (pid " << m.pid << " on " << m.host
                    << ")";
          servers_.push_back(std::move(m));
        } else if (reg.getRole() == wire::Role::WORKER) {
          if (static_cast<int>(workers_.size()) >= config_.num_workers) {
            ReplyError(in->peer, m.register_request,
                       FailedPrecondition("the job is full: it has all " +
                                          std::to_string(config_.num_workers) +
                                          " of its workers (--num_workers)"));
            continue;
          }
          LOG(INFO) << "worker registered: " << m.device << " (pid " << m.pid << " on " << m.host
                    << ")";
          workers_.push_back(std::move(m));
        } else {
          ReplyError(in->peer, m.register_request, InvalidArgument("unknown role"));
        }
      } catch (const kj::Exception& e) {
        ReplyError(
            in->peer, 0,
            InvalidArgument(std::string("malformed registration: ") + e.getDescription().cStr()));
      }
    }
    // Everyone is here: hand out ids, the config and the shard map.
    AssignIds(servers_);
    AssignIds(workers_);
    PS_ASSIGN_OR_RETURN(std::vector<GroupPlan> groups, FormGroups());
    std::vector<std::pair<int, int>> group_of(workers_.size(), {-1, 0});  // (group, rank)
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t r = 0; r < groups[g].ids.size(); ++r) {
        group_of[groups[g].ids[r]] = {static_cast<int>(g), static_cast<int>(r)};
        workers_[groups[g].ids[r]].group_formed = groups[g].name;
      }
    }
    for (uint32_t i = 0; i < servers_.size(); ++i) {
      PS_RETURN_IF_ERROR(ReplyRegistration(servers_[i], i));
    }
    for (uint32_t i = 0; i < workers_.size(); ++i) {
      const GroupPlan* plan =
          group_of[i].first >= 0 ? &groups[static_cast<size_t>(group_of[i].first)] : nullptr;
      PS_RETURN_IF_ERROR(ReplyRegistration(workers_[i], i, plan, group_of[i].second));
    }
    results_.resize(workers_.size());
    rates_.assign(workers_.size(), 0.0);
    worker_live_.resize(workers_.size());
    server_live_.resize(servers_.size());
    if (Metrics* m = options_.metrics; m != nullptr) {
      m->AddGauge("ps_workers", "workers in the job").Set(static_cast<double>(workers_.size()));
      m->AddGauge("ps_servers", "servers in the job").Set(static_cast<double>(servers_.size()));
      metrics_examples_ = m->AddCounter("ps_examples_total", "training examples processed");
      metrics_failures_ = m->AddCounter("ps_failures_total", "processes that failed");
      metrics_epoch_ = m->AddGauge("ps_epoch", "the epoch worker 0 is in");
      metrics_test_accuracy_ = m->AddGauge("ps_test_accuracy", "the last evaluation's accuracy");
      metrics_test_loss_ = m->AddGauge("ps_test_loss", "the last evaluation's loss");
      for (size_t i = 0; i < workers_.size(); ++i) {
        const MetricLabels w = {{"worker", std::to_string(i)}};
        metrics_workers_.push_back(
            {m->AddGauge("ps_worker_clock", "a worker's clock", w),
             m->AddGauge("ps_worker_clock_lag", "a worker's clock minus the slowest's", w),
             m->AddGauge("ps_worker_examples_per_second", "a worker's throughput", w),
             m->AddCounter("ps_worker_wait_seconds_total",
                           "seconds a worker was blocked by the staleness bound", w)});
      }
    }
    train_start_ = Clock::now();
    for (auto* group : {&servers_, &workers_}) {
      for (Member& m : *group) m.last_seen = train_start_;
    }
    train_start_unix_ = UnixSeconds();
    std::printf("job assembled: %d servers, %d workers; training %d epochs\n", config_.num_servers,
                config_.num_workers, config_.epochs);
    std::fflush(stdout);
    return Status::Ok();
  }

  // The job config and the shard map (servers' endpoints at registration; after a failover
  // or a restart the workers learn the new ones from their heartbeat replies).
  void SetConfigAndShardMap(wire::RegisterReply::Builder r) const {
    const std::map<std::string, std::string> flags = config_.ToFlagMap();
    auto cfg = r.initConfig(static_cast<unsigned>(flags.size()));
    unsigned i = 0;
    for (const auto& [k, v] : flags) {
      cfg[i].setKey(k);
      cfg[i].setValue(v);
      ++i;
    }
    auto map = r.initShardMap();
    map.setVersion(1);
    auto list = map.initServers(static_cast<unsigned>(servers_.size()));
    for (unsigned s = 0; s < servers_.size(); ++s) {
      list[s].setId(s);
      list[s].setEndpoint(servers_[s].endpoint);
    }
  }

  // Answers a registration: the id, the job config and the shard map.
  // `plan`: the all-reduce group a worker is in, with its `rank` there; null for none.
  Status ReplyRegistration(const Member& m, uint32_t id, const GroupPlan* plan = nullptr,
                           int rank = 0) {
    capnp::MallocMessageBuilder b;
    auto r = NewHeader(b, m.register_request, -1).getBody().initRegisterReply();
    r.setId(id);
    if (results_.empty()) {
      // The job's own processes (not those that join later): a restored job starts at
      // the checkpoint's clock and epoch.
      r.setStartClock(start_clock_);
      r.setStartEpoch(start_epoch_);
    }
    SetConfigAndShardMap(r);
    if (plan != nullptr) {
      auto g = r.initGroup();
      g.setName(plan->name);
      g.setRank(static_cast<uint32_t>(rank));
      g.setSize(static_cast<uint32_t>(plan->ids.size()));
      g.setLeaderEndpoint(plan->endpoint);
      auto ids = g.initMemberIds(static_cast<unsigned>(plan->ids.size()));
      for (unsigned k = 0; k < plan->ids.size(); ++k) ids.set(k, plan->ids[k]);
    }
    return Send(m.peer, b);
  }

  bool Gone(size_t w) const { return workers_[w].dead || workers_[w].left; }

  // The worker that evaluates the model: the lowest live one (worker 0 unless it is gone).
  int Evaluator() const {
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (!Gone(w)) return static_cast<int>(w);
    }
    return -1;
  }

  // A worker joins the running job: the next id, the config and the shard map. Its
  // parameters come from the servers with its first pull; it enters the clock table at
  // the slowest live clock (ServerCore) and leases data like the others.
  Status OnJoin(const std::string& peer, uint64_t rid, wire::Register::Reader reg) {
    if (reg.getRole() == wire::Role::SERVER && config_.replicas < 2) {
      return OnServerJoin(peer, rid, reg);
    }
    if (reg.getRole() != wire::Role::WORKER) {
      ReplyError(peer, rid,
                 FailedPrecondition("the job is running: only workers may join it (with "
                                    "--replicas=2 a server cannot be added or replaced)"));
      return Status::Ok();
    }
    if (final_eval_ || barrier_released_) {
      ReplyError(peer, rid, FailedPrecondition("the job is finishing: nothing left to train"));
      return Status::Ok();
    }
    Member m;
    m.peer = peer;
    m.device = reg.getDevice().cStr();
    m.host = reg.getHost().cStr();
    m.pid = reg.getPid();
    m.register_request = rid;
    m.joined = true;
    m.last_seen = Clock::now();
    const uint32_t id = static_cast<uint32_t>(workers_.size());
    workers_.push_back(m);
    results_.emplace_back();
    rates_.push_back(0.0);
    LOG(INFO) << "worker " << id << " joined: " << m.device << " (pid " << m.pid << " on " << m.host
              << ")";
    std::printf("worker %u joined (pid %u on %s)  %.1fs\n", id, m.pid, m.host.c_str(), Elapsed());
    std::fflush(stdout);
    joins_.push_back({{"worker", id}, {"pid", m.pid}, {"host", m.host}, {"time", Elapsed()}});
    return ReplyRegistration(workers_.back(), id);
  }

  // A heartbeat (common/heartbeat.h), on the sender's own connection.
  Status OnAlive(const std::string& peer, uint64_t rid, wire::Alive::Reader alive) {
    const int id = alive.getId();
    bool evicted = false;
    auto* group = alive.getRole() == wire::Role::SERVER ? &servers_ : &workers_;
    if (id >= 0 && static_cast<size_t>(id) < group->size()) {
      Member& m = (*group)[static_cast<size_t>(id)];
      evicted = m.dead || m.left;
      // A server declared dead (stopped, say) that wakes after another process took its id:
      // its beats are not the replacement's, and it must stop.
      if (alive.getRole() == wire::Role::SERVER && alive.getPid() != 0 && alive.getPid() != m.pid) {
        evicted = true;
      }
      if (!evicted) m.last_seen = Clock::now();
    }
    capnp::MallocMessageBuilder b;
    auto reply = NewHeader(b, rid, -1).getBody().initAliveReply();
    reply.setEvicted(evicted);
    if ((!promoted_.empty() || !replaced_.empty()) && alive.getRole() == wire::Role::WORKER) {
      // Failover: where the dead servers' shards are served now: by a promoted backup
      // (--replicas=2) or by a server that replaced the dead one (--replicas=1). The
      // worker's KVClient reconnects and resends what they had not answered; a redirect to
      // the endpoint it already uses changes nothing.
      auto list = reply.initRedirects(static_cast<unsigned>(promoted_.size() + replaced_.size()));
      unsigned i = 0;
      for (const auto& [dead, backup] : promoted_) {
        list[i].setId(static_cast<uint32_t>(dead));
        list[i].setEndpoint(servers_[static_cast<size_t>(backup)].endpoint);
        ++i;
      }
      for (int s : replaced_) {
        list[i].setId(static_cast<uint32_t>(s));
        list[i].setEndpoint(servers_[static_cast<size_t>(s)].endpoint);
        ++i;
      }
    }
    return Send(peer, b);
  }

  // The live server that serves server `s`'s shards: s itself, its promoted backup after a
  // failover, or -1 when they are lost.
  int ServedBy(int s) const {
    auto it = promoted_.find(s);
    if (it != promoted_.end()) return it->second;
    return servers_[static_cast<size_t>(s)].dead ? -1 : s;
  }

  // A request to server `s` (its socket is connected on first use and reset after a failed
  // call, so that a late reply cannot answer the next call).
  Result<CallReply> CallServer(int s, Frames f, std::chrono::milliseconds timeout) {
    if (server_sockets_.size() < servers_.size()) server_sockets_.resize(servers_.size());
    std::unique_ptr<ClientSocket>& sock = server_sockets_[static_cast<size_t>(s)];
    if (!sock) {
      PS_ASSIGN_OR_RETURN(sock, transport_->Connect(servers_[static_cast<size_t>(s)].endpoint));
    }
    Result<CallReply> reply = Call(*sock, std::move(f), timeout);
    if (!reply.ok()) sock.reset();
    return reply;
  }

  // Server `s` is dead and --replicas=2: its backup serves the copy of its shards from now
  // on (server/replication.h), and workers learn it from their heartbeat replies. Returns
  // the failure entry's fields.
  json PromoteBackup(int s, Clock::time_point last_seen) {
    json event;
    const int backup = (s + 1) % static_cast<int>(servers_.size());
    if (backup == s || servers_[static_cast<size_t>(backup)].dead) {
      event["recovered"] =
          "nothing: the backup, server " + std::to_string(backup) + ", is gone too";
      return event;
    }
    capnp::MallocMessageBuilder b;
    NewHeader(b, ++evict_request_, -1).getBody().initPromote().setPrimary(s);
    Frames f;
    f.push_back(EncodeFrame(b));
    Result<CallReply> reply = CallServer(backup, std::move(f), options_.evict_timeout);
    Status st = !reply.ok() ? reply.status()
                : reply->header.get().getBody().which() == wire::Header::Body::PROMOTE_REPLY
                    ? Status::Ok()
                    : Internal("server " + std::to_string(backup) + " refused the promotion");
    if (!st.ok()) {
      LOG(ERROR) << "promoting server " << backup << " for server " << s << ": " << st.ToString();
      event["recovered"] =
          "nothing: promoting server " + std::to_string(backup) + " failed: " + st.ToString();
      return event;
    }
    promoted_[s] = backup;
    const auto now_unix = std::chrono::system_clock::now().time_since_epoch();
    event["promoted"] = backup;
    event["promoted_unix_time"] = std::chrono::duration<double>(now_unix).count();
    // From the last heartbeat (the server died after it) to the promotion: an upper bound
    // of the time its shards could not be served.
    event["failover_seconds"] = std::chrono::duration<double>(Clock::now() - last_seen).count();
    event["recovered"] = "server " + std::to_string(backup) +
                         " serves its shards from its copy (every acknowledged push); they run "
                         "without a backup from now on";
    std::printf("server %d lost: server %d serves its shards now  %.1fs\n", s, backup, Elapsed());
    std::fflush(stdout);
    return event;
  }

  // Tells every server that worker `w` is gone: it leaves their clock tables and its later
  // requests are refused.
  void EvictOnServers(int w) {
    if (server_sockets_.size() < servers_.size()) server_sockets_.resize(servers_.size());
    for (size_t s = 0; s < servers_.size(); ++s) {
      const int to = ServedBy(static_cast<int>(s));
      if (to < 0) continue;  // its shards are lost: nobody to tell
      if (to != static_cast<int>(s)) {
        // A failed-over server's shards: its promoted backup drops the worker there too.
        capnp::MallocMessageBuilder b;
        auto h = NewHeader(b, ++evict_request_, -1);
        h.setTargetServer(static_cast<int32_t>(s));
        h.getBody().initEvict().setWorker(w);
        Frames f;
        f.push_back(EncodeFrame(b));
        Result<CallReply> reply = CallServer(to, std::move(f), options_.evict_timeout);
        if (!reply.ok()) {
          LOG(ERROR) << "server " << to << " did not confirm the eviction of worker " << w
                     << " from the shards of server " << s << ": " << reply.status().ToString();
        }
        continue;
      }
      if (!server_sockets_[s]) {
        Result<std::unique_ptr<ClientSocket>> sock = transport_->Connect(servers_[s].endpoint);
        if (!sock.ok()) {
          LOG(ERROR) << "cannot reach server " << s << ": " << sock.status().ToString();
          continue;
        }
        server_sockets_[s] = std::move(sock).value();
      }
      capnp::MallocMessageBuilder b;
      NewHeader(b, ++evict_request_, -1).getBody().initEvict().setWorker(w);
      Frames f;
      f.push_back(EncodeFrame(b));
      Result<CallReply> reply = Call(*server_sockets_[s], std::move(f), options_.evict_timeout);
      if (!reply.ok()) {
        LOG(ERROR) << "server " << s << " did not confirm the eviction of worker " << w << ": "
                   << reply.status().ToString();
        // A late reply on this socket would confuse the next call: start afresh.
        server_sockets_[s].reset();
      }
    }
  }

  // Worker `w` is gone (dead: silent too long; or left on SIGTERM): its leases go back to
  // the queue, the servers drop it, and the event is listed in summary.json.
  Status RemoveWorker(int w, bool dead, json event) {
    Member& m = workers_[static_cast<size_t>(w)];
    const double silent = std::chrono::duration<double>(Clock::now() - m.last_seen).count();
    (dead ? m.dead : m.left) = true;
    const int returned = leases_.Release(w);
    for (auto it = held_leases_.begin(); it != held_leases_.end();) {
      it = it->worker == w ? held_leases_.erase(it) : it + 1;
    }
    EvictOnServers(w);
    event["kind"] = dead ? "worker_lost" : "worker_left";
    event["process"] = "worker-" + std::to_string(w);
    event["worker"] = w;
    event["pid"] = m.pid;
    event["host"] = m.host;
    event["time"] = Elapsed();
    // Wall-clock time of the detection, so that a test can measure it from the kill.
    event["unix_time"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (dead) event["silent_seconds"] = silent;
    event["leases_returned"] = returned;
    event["recovered"] = std::to_string(returned) +
                         " data leases back to the queue; removed from the servers' clock tables";
    LOG(WARNING) << "worker " << w << (dead ? " declared dead" : " left") << ": " << event.dump();
    if (dead) {
      std::printf("worker %d lost: silent for %.1f s; %d leases back to the queue  %.1fs\n", w,
                  silent, returned, Elapsed());
    } else {
      std::printf("worker %d left; %d leases back to the queue  %.1fs\n", w, returned, Elapsed());
    }
    std::fflush(stdout);
    metrics_failures_.Increment();
    failures_.push_back(std::move(event));
    if (barrier_released_ && w == final_evaluator_) {
      return Internal("worker " + std::to_string(w) +
                      " was lost during the final evaluation; the others have finished");
    }
    PS_RETURN_IF_ERROR(AnswerHeldLeases());
    return MaybeReleaseBarrier();
  }

  // The fields of a `server_lost` failure entry common to failover and restart.
  json ServerLostEvent(size_t s, Clock::time_point now) const {
    const Member& m = servers_[s];
    return {{"kind", "server_lost"},
            {"process", "server-" + std::to_string(s)},
            {"server", s},
            {"pid", m.pid},
            {"time", Elapsed()},
            {"silent_seconds", std::chrono::duration<double>(now - m.last_seen).count()},
            // Wall-clock time of the detection, so that a test can measure it from the kill.
            {"unix_time", UnixSeconds()}};
  }

  // Declares dead every live worker silent for longer than --heartbeat_timeout; lists
  // silent servers. With --replicas=2 a silent server is declared dead and its backup
  // promoted (PromoteBackup); without, it cannot be replaced: the job then fails on its own.
  Status CheckHeartbeats() {
    const auto now = Clock::now();
    const auto timeout = std::chrono::duration<double>(config_.heartbeat_timeout);
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (Gone(w) || (barrier_released_ && static_cast<int>(w) != final_evaluator_)) continue;
      if (now - workers_[w].last_seen > timeout) {
        PS_RETURN_IF_ERROR(RemoveWorker(static_cast<int>(w), true, json::object()));
      }
    }
    for (size_t s = 0; s < servers_.size(); ++s) {
      Member& m = servers_[s];
      if (m.silent_reported || now - m.last_seen <= timeout) continue;
      m.silent_reported = true;
      LOG(ERROR) << "server " << s << " is silent (no heartbeat for " << config_.heartbeat_timeout
                 << " s)";
      if (config_.replicas >= 2) {
        // Failover: the server is dead to the job (not shut down, not asked again).
        m.dead = true;
        json event = PromoteBackup(static_cast<int>(s), m.last_seen);
        event.update(ServerLostEvent(s, now));
        LOG(WARNING) << "server " << s << " declared dead: " << event.dump();
        metrics_failures_.Increment();
        failures_.push_back(std::move(event));
        continue;
      }
      // --replicas=1: the server is dead to the job; its slot waits for a replacement
      // (OnServerJoin), which restores the latest recorded checkpoint set.
      m.dead = true;
      json event = ServerLostEvent(s, now);
      // Where the workers stood: the slowest live clock the server last reported, and the
      // fastest worker's clock in the workers' last reports.
      event["clock_at_loss"] = server_live_[s].clock;
      int64_t fastest = -1;
      for (size_t w = 0; w < worker_live_.size(); ++w) {
        if (!Gone(w) && worker_live_[w].reported)
          fastest = std::max(fastest, worker_live_[w].clock);
      }
      event["workers_clock_at_loss"] = fastest;
      event["recovered"] = "nothing yet: waiting for a replacement ps_server (--replicas=1)";
      LOG(WARNING) << "server " << s << " declared dead: " << event.dump();
      std::printf("server %d lost: waiting for a replacement server  %.1fs\n", static_cast<int>(s),
                  Elapsed());
      std::fflush(stdout);
      metrics_failures_.Increment();
      lost_live_[static_cast<int>(s)] = server_live_[s];
      lost_event_[static_cast<int>(s)] = failures_.size();
      failures_.push_back(std::move(event));
      PS_RETURN_IF_ERROR(AssignWaitingServers());
    }
    return Status::Ok();
  }

  // A ps_server registered while the job runs (--replicas=1): it replaces a dead server,
  // or waits (its registration unanswered) until one is declared dead, so that a server
  // restarted before the coordinator noticed the death is not turned away.
  Status OnServerJoin(const std::string& peer, uint64_t rid, wire::Register::Reader reg) {
    Member m;
    m.peer = peer;
    m.endpoint = reg.getEndpoint().cStr();
    m.device = reg.getDevice().cStr();
    m.host = reg.getHost().cStr();
    m.pid = reg.getPid();
    m.register_request = rid;
    m.requested_id = reg.getRequestedId();
    if (Status ep = ValidateEndpoint(m.endpoint); !ep.ok()) {
      ReplyError(peer, rid, ep);
      return Status::Ok();
    }
    for (Member& w : waiting_servers_) {
      if (w.peer == peer) {
        w = std::move(m);  // the same process asking again
        return AssignWaitingServers();
      }
    }
    LOG(INFO) << "server registered while the job runs: " << m.endpoint << " (pid " << m.pid
              << "); it replaces the next dead server";
    waiting_servers_.push_back(std::move(m));
    return AssignWaitingServers();
  }

  // Gives each dead server's slot (not failed over) to a waiting replacement: the one that
  // asked for that id, else the first to come.
  Status AssignWaitingServers() {
    for (size_t s = 0; s < servers_.size() && !waiting_servers_.empty(); ++s) {
      if (!servers_[s].dead || promoted_.count(static_cast<int>(s)) > 0) continue;
      auto pick = waiting_servers_.begin();
      for (auto it = waiting_servers_.begin(); it != waiting_servers_.end(); ++it) {
        if (it->requested_id == static_cast<int>(s)) {
          pick = it;
          break;
        }
      }
      Member m = std::move(*pick);
      waiting_servers_.erase(pick);
      PS_RETURN_IF_ERROR(ReplaceServer(static_cast<int>(s), std::move(m)));
    }
    return Status::Ok();
  }

  // The latest checkpoint set recorded by this job (or the one it restored from) whose
  // files are whole; null when there is none.
  json LatestJobSet() const {
    for (auto it = job_sets_.rbegin(); it != job_sets_.rend(); ++it) {
      Status whole = ValidateCheckpointSet((*it)["set"].get<std::string>(), config_.num_servers);
      if (whole.ok()) return *it;
      LOG(WARNING) << "recorded checkpoint " << (*it)["set"]
                   << " is damaged, skipped: " << whole.ToString();
    }
    return json();
  }

  // Server `s` is dead (--replicas=1) and `m` takes its place: same id, its shards from the
  // latest recorded checkpoint set. The updates to those shards after the set's clock are
  // lost (a bounded rollback: the workers go on from their current clocks, since the other
  // servers' shards hold their updates and cannot be rolled back with them); the failure
  // entry says how many clocks and pushes.
  Status ReplaceServer(int s, Member m) {
    const size_t i = static_cast<size_t>(s);
    const json set = LatestJobSet();
    const int64_t restored = set.is_object() ? set["clock"].get<int64_t>() : 0;
    json& event = failures_[lost_event_[s]];
    const ServerLive& before = lost_live_[s];
    json rollback;
    rollback["checkpoint_clock"] = restored;
    rollback["set"] = set.is_object() ? set["set"] : json(nullptr);
    rollback["clock_at_loss"] = event["clock_at_loss"];
    rollback["workers_clock_at_loss"] = event["workers_clock_at_loss"];
    const int64_t at_loss = std::max(event.value("clock_at_loss", int64_t{-1}),
                                     event.value("workers_clock_at_loss", int64_t{-1}));
    rollback["clocks_rolled_back"] = at_loss >= restored ? at_loss - restored : 0;
    // Pushes the dead server applied after that checkpoint, as of its last status report
    // (so at least this many; the ones after that report are not known).
    auto base = before.pushes_at_checkpoint.find(restored);
    if (restored == 0 && base == before.pushes_at_checkpoint.end()) {
      rollback["pushes_since_checkpoint"] = before.pushes;
    } else if (base != before.pushes_at_checkpoint.end() && before.pushes >= base->second) {
      rollback["pushes_since_checkpoint"] = before.pushes - base->second;
    } else {
      rollback["pushes_since_checkpoint"] = nullptr;
    }
    // An estimate of all of them: the clocks rolled back at the pushes per clock the dead
    // server had served on average.
    if (before.clock > 0 && rollback["clocks_rolled_back"].get<int64_t>() > 0) {
      rollback["pushes_since_checkpoint_estimate"] = static_cast<uint64_t>(
          std::llround(static_cast<double>(before.pushes) / static_cast<double>(before.clock) *
                       static_cast<double>(rollback["clocks_rolled_back"].get<int64_t>())));
    }
    event["rollback"] = rollback;
    event["restarted_at"] = Elapsed();
    event["restarted_unix_time"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    event["new_pid"] = m.pid;
    event["new_endpoint"] = m.endpoint;
    event["recovered"] =
        set.is_object()
            ? "restarted (pid " + std::to_string(m.pid) + ") from the checkpoint at clock " +
                  std::to_string(restored) +
                  ": the updates to its shards after that clock are "
                  "lost (a rollback of " +
                  std::to_string(rollback["clocks_rolled_back"].get<int64_t>()) +
                  " clocks); the workers go on from their clocks"
            : "restarted (pid " + std::to_string(m.pid) +
                  ") from the initial values: no checkpoint set was recorded, so every update "
                  "to its shards is lost";
    LOG(WARNING) << "server " << s << " replaced: " << event.dump();
    std::printf("server %d restarted (pid %u) from %s  %.1fs\n", s, m.pid,
                set.is_object() ? ("the checkpoint at clock " + std::to_string(restored)).c_str()
                                : "the initial values",
                Elapsed());
    std::fflush(stdout);

    m.last_seen = Clock::now();
    servers_[i] = std::move(m);
    server_live_[i] = ServerLive{};
    if (i < server_sockets_.size()) server_sockets_[i].reset();
    replaced_.insert(s);
    awaiting_first_report_[s] = lost_event_[s];

    capnp::MallocMessageBuilder b;
    auto r = NewHeader(b, servers_[i].register_request, -1).getBody().initRegisterReply();
    r.setId(static_cast<uint32_t>(s));
    SetConfigAndShardMap(r);
    r.setReplacement(true);
    r.setRestoreSet(set.is_object() ? set["set"].get<std::string>() : std::string());
    std::vector<uint32_t> evicted, idle;
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (Gone(w)) {
        evicted.push_back(static_cast<uint32_t>(w));
      } else if (results_[w].done) {
        idle.push_back(static_cast<uint32_t>(w));
      }
    }
    auto ev = r.initEvictedWorkers(static_cast<unsigned>(evicted.size()));
    for (unsigned j = 0; j < evicted.size(); ++j) ev.set(j, evicted[j]);
    auto id = r.initIdleWorkers(static_cast<unsigned>(idle.size()));
    for (unsigned j = 0; j < idle.size(); ++j) id.set(j, idle[j]);
    if (Status sent = Send(servers_[i].peer, b); !sent.ok()) {
      LOG(ERROR) << "server " << s << "'s replacement: " << sent.ToString();
    }
    return Status::Ok();
  }

  // The first status report of a replacement: it restored and serves. Completes its
  // failure entry.
  void OnReplacementServing(int s, const json& report) {
    auto it = awaiting_first_report_.find(s);
    if (it == awaiting_first_report_.end()) return;
    json& event = failures_[it->second];
    awaiting_first_report_.erase(it);
    event["restore_seconds"] = report.value("restore_seconds", 0.0);
    event["serving_unix_time"] =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    LOG(INFO) << "server " << s << "'s replacement serves (restore took "
              << event["restore_seconds"] << " s)";
  }

  // Once every live worker is done: answers their `done` (the barrier before the final
  // evaluation). The evaluator is worker 0, or the lowest live worker when 0 is gone: that
  // one gets `evaluateFinal` instead of `doneReply`.
  Status MaybeReleaseBarrier() {
    if (barrier_released_) return Status::Ok();
    bool any = false;
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (Gone(w)) continue;
      if (!results_[w].done) return Status::Ok();
      any = true;
    }
    if (!any) return Status::Ok();  // everyone is gone: wait for a worker to join
    barrier_released_ = true;
    barrier_time_ = Clock::now();
    const int evaluator = Evaluator();
    final_evaluator_ = evaluator;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (Gone(i)) continue;
      capnp::MallocMessageBuilder b;
      auto body = NewHeader(b, results_[i].done_request, -1).getBody();
      if (static_cast<int>(i) == evaluator && evaluator != 0) {
        body.setEvaluateFinal();
      } else {
        body.setDoneReply();
      }
      Status s = Send(workers_[i].peer, b);
      if (!s.ok()) LOG(WARNING) << "worker " << i << ": " << s.ToString();
    }
    if (results_[static_cast<size_t>(evaluator)].failed) {
      return Internal("worker " + std::to_string(evaluator) +
                      " failed, so there is no final evaluation: " +
                      results_[static_cast<size_t>(evaluator)].message);
    }
    return Status::Ok();
  }

  // Workers' JSON is input from the network: every field the coordinator reads must have
  // the type it reads it as, or nlohmann::json would throw.
  static Status CheckReportFields(const json& j) {
    for (const char* key : {"examples", "loss", "accuracy", "examples_per_sec", "clock", "epoch",
                            "epoch_fraction", "test_loss", "test_accuracy", "test_auc", "seconds",
                            "steps", "wait_seconds", "compute_seconds", "batch_size", "worker"}) {
      if (j.contains(key) && !j[key].is_number()) {
        return InvalidArgument(std::string("report field '") + key + "' must be a number");
      }
    }
    for (const char* key : {"kind", "device"}) {
      if (j.contains(key) && !j[key].is_string()) {
        return InvalidArgument(std::string("report field '") + key + "' must be a string");
      }
    }
    if (j.contains("final") && !j["final"].is_boolean()) {
      return InvalidArgument("report field 'final' must be true or false");
    }
    return Status::Ok();
  }

  int ServerIndex(const std::string& peer) const {
    for (size_t i = 0; i < servers_.size(); ++i) {
      if (servers_[i].peer == peer) return static_cast<int>(i);
    }
    return -1;
  }

  // --restore: which set the servers load (config_.restore becomes its directory, so that
  // every server loads the same one) and where the workers resume: the clock and epoch of
  // the coordinator's record of that set; without a record, the set's clock and epoch 1.
  Status ResolveRestore() {
    if (config_.restore.empty()) return Status::Ok();
    json record;
    if (!config_.checkpoint_dir.empty()) {
      PS_ASSIGN_OR_RETURN(record, ReadCheckpointRecord());
    }
    std::string set;
    json entry;
    if (config_.restore == "latest") {
      if (config_.checkpoint_dir.empty()) {
        return InvalidArgument("--restore=latest needs --checkpoint_dir");
      }
      // The latest recorded set whose files are still whole; an unrecorded set (being
      // written, or written after the coordinator died) is never used while there is one.
      for (auto it = record["sets"].rbegin(); it != record["sets"].rend(); ++it) {
        Status whole = ValidateCheckpointSet((*it)["set"].get<std::string>(), config_.num_servers);
        if (whole.ok()) {
          entry = *it;
          break;
        }
        LOG(WARNING) << "recorded checkpoint " << (*it)["set"]
                     << " is damaged, skipped: " << whole.ToString();
      }
      if (entry.is_null()) {
        PS_ASSIGN_OR_RETURN(set,
                            LatestCompleteCheckpoint(config_.checkpoint_dir, config_.num_servers));
      } else {
        set = entry["set"].get<std::string>();
      }
    } else {
      set = config_.restore;
      const std::filesystem::path want = std::filesystem::weakly_canonical(set);
      for (const json& e : record["sets"]) {
        if (std::filesystem::weakly_canonical(e["set"].get<std::string>()) == want) entry = e;
      }
      PS_RETURN_IF_ERROR(ValidateCheckpointSet(set, config_.num_servers));
    }
    if (entry.is_object()) {
      start_clock_ = entry["clock"].get<int64_t>();
      start_epoch_ = entry["epoch"].get<int>();
    } else {
      // No record of the workers' position: the set's clock (from its name), epoch 1.
      const std::string name = std::filesystem::path(set).filename().string();
      if (name.rfind("clock-", 0) != 0) {
        return InvalidArgument("--restore=" + set + " is not a clock-<C> checkpoint directory");
      }
      start_clock_ = std::strtoll(name.c_str() + 6, nullptr, 10);
      start_epoch_ = 1;
      LOG(WARNING) << "no record of checkpoint " << set
                   << " in checkpoints.json: training restarts at epoch 1 from clock "
                   << start_clock_;
    }
    config_.restore = set;
    recorded_clock_ = start_clock_;
    leases_.StartAtEpoch(start_epoch_);
    epoch_ = std::min(start_epoch_, config_.epochs);
    job_sets_.push_back({{"set", set}, {"clock", start_clock_}, {"epoch", start_epoch_}});
    restored_ = {{"set", set},
                 {"clock", start_clock_},
                 {"epoch", start_epoch_},
                 {"recorded", entry.is_object()}};
    LOG(INFO) << "restoring " << set << ": workers resume at clock " << start_clock_ << ", epoch "
              << start_epoch_;
    std::printf("restoring %s: clock %lld, epoch %d of %d\n", set.c_str(),
                static_cast<long long>(start_clock_), start_epoch_, config_.epochs);
    return Status::Ok();
  }

  // checkpoints.json, or {"sets": []} when there is none yet.
  Result<json> ReadCheckpointRecord() const {
    const std::string path = CheckpointRecordFile(config_.checkpoint_dir);
    json record = {{"sets", json::array()}};
    std::ifstream in(path);
    if (!in) return record;
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("sets") || !j["sets"].is_array()) {
      return InvalidArgument(path + " is not a checkpoint record");
    }
    for (const json& e : j["sets"]) {
      if (!e.is_object() || !e.contains("set") || !e["set"].is_string() || !e.contains("clock") ||
          !e["clock"].is_number_integer() || !e.contains("epoch") ||
          !e["epoch"].is_number_integer()) {
        return InvalidArgument(path + " has a malformed entry: " + e.dump());
      }
    }
    return j;
  }

  // Server `s` committed its checkpoint file at `clock`. Once every server has, the set is
  // whole: it goes into checkpoints.json with where the workers stand at that clock.
  void OnServerCheckpoint(size_t s, int64_t clock) {
    if (config_.checkpoint_dir.empty() || clock <= recorded_clock_) return;
    committed_.resize(servers_.size());
    if (s >= committed_.size()) return;
    committed_[s].insert(clock);
    while (committed_[s].size() > 64) committed_[s].erase(committed_[s].begin());
    for (const std::set<int64_t>& c : committed_) {
      if (c.count(clock) == 0) return;
    }
    for (std::set<int64_t>& c : committed_) c.erase(c.begin(), c.upper_bound(clock));
    whole_clock_ = std::max(whole_clock_, clock);
    RecordWholeSet();
  }

  // Records the latest whole set once every worker still training has asked for a lease at
  // or past its clock: chunks end with a lease request, so by then the coordinator knows
  // which epochs were wholly trained by that clock.
  void RecordWholeSet() {
    const int64_t clock = whole_clock_;
    if (clock <= recorded_clock_) return;
    for (size_t w = 0; w < lease_clock_.size() && w < results_.size(); ++w) {
      if (!results_[w].done && !Gone(w) && lease_clock_[w] < clock) return;
    }
    // The epoch training resumes at: the first one not wholly trained by this clock. The
    // part of it trained before the checkpoint is trained again after a restore (chunks
    // are not tied to clocks); at an epoch boundary nothing is.
    int epoch = start_epoch_;
    while (epoch <= config_.epochs) {
      auto it = epoch_done_clock_.find(epoch);
      if (it == epoch_done_clock_.end() || it->second > clock) break;
      ++epoch;
    }
    const int64_t iteration = clock * config_.num_workers;
    json entry = {{"clock", clock},
                  {"set", CheckpointSetDir(config_.checkpoint_dir, clock)},
                  {"epoch", epoch},
                  {"epochs_completed", epoch - 1},
                  {"resume", "at the start of epoch " + std::to_string(epoch)},
                  {"lr_iteration", iteration},
                  {"num_servers", config_.num_servers},
                  {"num_workers", config_.num_workers},
                  {"time", UnixSeconds()}};
    if (Result<LrPolicy> lr = LrPolicy::Create(config_); lr.ok()) {
      entry["learning_rate"] = lr->ScheduleRate(iteration);
    }
    Result<json> record = ReadCheckpointRecord();
    if (!record.ok()) {
      LOG(ERROR) << "checkpoint at clock " << clock
                 << " not recorded: " << record.status().ToString();
      return;
    }
    (*record)["sets"].push_back(entry);
    // The job's settings, for ps_export (server/model_export.h) to load the sets.
    (*record)["config"] = config_.ToFlagMap();
    Status w = WriteJsonFile(CheckpointRecordFile(config_.checkpoint_dir), *record);
    if (!w.ok()) {
      LOG(ERROR) << "checkpoint at clock " << clock << " not recorded: " << w.ToString();
      return;
    }
    recorded_clock_ = clock;
    ++checkpoints_recorded_;
    job_sets_.push_back(entry);
    LOG(INFO) << "checkpoint set at clock " << clock << " complete (resumes at epoch " << epoch
              << ")";
  }

  // A server's periodic status (server/server_node.h: ServerStatusJson). Kept for
  // ps_status only; a malformed one is ignored (it changes nothing but the view).
  void OnServerReport(int s, const char* text) {
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return;
    for (const char* key : {"shards", "rows", "rows_spilled", "pushes", "pulls", "queue_depth"}) {
      if (j.contains(key) && !j[key].is_number()) return;
    }
    if (j.contains("held")) {
      if (!j["held"].is_array()) return;
      for (const json& h : j["held"]) {
        if (!h.is_object()) return;
        for (const char* key : {"worker", "waits_on", "seconds"}) {
          if (h.contains(key) && !h[key].is_number()) return;
        }
      }
    }
    for (const char* key : {"pushes_since_checkpoint", "restore_seconds"}) {
      if (j.contains(key) && !j[key].is_number()) return;
    }
    if (j.contains("promoted_first_pull_unix_time") &&
        j["promoted_first_pull_unix_time"].is_object()) {
      NoteFirstPullsAfterFailover(j["promoted_first_pull_unix_time"]);
    }
    ServerLive& live = server_live_[static_cast<size_t>(s)];
    if (j.contains("checkpoint_clock") && j["checkpoint_clock"].is_number_integer()) {
      live.checkpoint_clock = j["checkpoint_clock"].get<int64_t>();
      OnServerCheckpoint(static_cast<size_t>(s), live.checkpoint_clock);
    }
    const double now = Elapsed();
    const uint64_t pushes = j.value("pushes", uint64_t{0});
    if (live.checkpoint_clock >= 0 && j.contains("pushes_since_checkpoint")) {
      // Its push count at that checkpoint: what a restart from it would roll back to.
      const uint64_t since = j.value("pushes_since_checkpoint", uint64_t{0});
      if (since <= pushes) live.pushes_at_checkpoint[live.checkpoint_clock] = pushes - since;
      while (live.pushes_at_checkpoint.size() > 64) {
        live.pushes_at_checkpoint.erase(live.pushes_at_checkpoint.begin());
      }
    }
    OnReplacementServing(s, j);
    if (live.time > 0 && now > live.time && pushes >= live.pushes) {
      live.pushes_per_sec = static_cast<double>(pushes - live.pushes) / (now - live.time);
    }
    live.pushes = pushes;
    if (j.contains("clock") && j["clock"].is_number_integer()) {
      const int64_t clock = j["clock"].get<int64_t>();
      if (live.time > 0 && now > live.time && live.clock >= 0 && clock >= live.clock) {
        live.clocks_per_sec = static_cast<double>(clock - live.clock) / (now - live.time);
      }
      live.clock = clock;
    }
    live.time = now;
    live.report = std::move(j);
    MaybeNameCheckpointClock(now);
  }

  // The job was asked to stop (SIGTERM, e.g. a preempted VM or Ctrl-C in the launcher).
  // Without a checkpoint directory, or with nobody training: Aborted at once. Otherwise the
  // first call names a clock for a last checkpoint set, and training goes on until that set
  // is recorded (then Aborted: `--restore=latest` resumes there) or until
  // options_.stop_checkpoint_timeout passed (Aborted, saying the set is missing). OK means:
  // keep training.
  Status StopWithCheckpoint() {
    bool training = false;
    for (size_t w = 0; w < workers_.size() && w < results_.size(); ++w) {
      training |= !results_[w].done && !Gone(w);
    }
    if (config_.checkpoint_dir.empty() || options_.stop_checkpoint_timeout.count() <= 0 ||
        !training || barrier_released_) {
      return Aborted("coordinator stopped by signal");
    }
    const auto now = Clock::now();
    if (!stop_checkpoint_deadline_) {
      stop_checkpoint_deadline_ = now + options_.stop_checkpoint_timeout;
      // A set already named and not yet passed by every server is the stop set; otherwise
      // name one now, as --checkpoint_every=<N>s would.
      bool pending = checkpoint_at_ > recorded_clock_;
      for (const ServerLive& live : server_live_) pending &= live.clock < checkpoint_at_;
      if (!pending) NameCheckpointClock(Elapsed());
      stop_checkpoint_at_ = checkpoint_at_;
      std::printf("stopping: training on until the checkpoint set at clock %lld is written\n",
                  static_cast<long long>(stop_checkpoint_at_));
      std::fflush(stdout);
    }
    if (stop_checkpoint_at_ > 0 && recorded_clock_ >= stop_checkpoint_at_) {
      std::printf("stopped at the checkpoint set at clock %lld: --restore=latest resumes there\n",
                  static_cast<long long>(recorded_clock_));
      std::fflush(stdout);
      return Aborted("coordinator stopped by signal after the checkpoint set at clock " +
                     std::to_string(recorded_clock_));
    }
    if (now > *stop_checkpoint_deadline_) {
      return Aborted("coordinator stopped by signal; the checkpoint set at clock " +
                     std::to_string(stop_checkpoint_at_) + " was not complete within " +
                     std::to_string(options_.stop_checkpoint_timeout.count()) +
                     " ms (the latest recorded set is at clock " + std::to_string(recorded_clock_) +
                     ")");
    }
    return Status::Ok();
  }

  // --checkpoint_every=<N>s: every N seconds, name a clock every server will write its
  // checkpoint at. It must lie ahead of every server's slowest live clock when the answer
  // reaches it (up to a report interval later, and then the tick that completes it), so it
  // is the fastest server's clock plus kCheckpointLeadSeconds at the fastest clock rate
  // seen. A server already past it refuses it (the set stays incomplete and unrecorded);
  // the next period, once every server passed it, names another.
  static constexpr double kCheckpointLeadSeconds = 3;
  void MaybeNameCheckpointClock(double now) {
    if (config_.checkpoint_dir.empty()) return;
    if (stop_checkpoint_deadline_) {
      // Stopping: only the stop set counts; a refused one is named again at once.
      DropAbandonedCheckpointSet(now);
      if (abandoned_checkpoint_at_ == stop_checkpoint_at_) {
        NameCheckpointClock(now);
        stop_checkpoint_at_ = checkpoint_at_;
      }
      return;
    }
    if (config_.checkpoint_every_seconds <= 0) return;
    if (next_checkpoint_time_ < 0) {
      next_checkpoint_time_ = now + config_.checkpoint_every_seconds;
      return;
    }
    DropAbandonedCheckpointSet(now);
    if (now < next_checkpoint_time_) return;
    // One named clock at a time: a server holds one, and a new name before every server
    // passed the old one would leave the old set half-written.
    for (const ServerLive& live : server_live_) {
      if (live.clock < checkpoint_at_) return;
    }
    NameCheckpointClock(now);
  }

  // Names the next checkpoint set's clock (checkpoint_at_; servers learn it from the
  // replies to their reports): ahead of the fastest server by kCheckpointLeadSeconds at
  // the fastest clock rate seen. Nothing before the first server report.
  void NameCheckpointClock(double now) {
    int64_t fastest = -1;
    double rate = 0;
    for (const ServerLive& live : server_live_) {
      fastest = std::max(fastest, live.clock);
      rate = std::max(rate, live.clocks_per_sec);
    }
    if (fastest < 0) return;
    const int64_t at = std::max({fastest + 2 + static_cast<int64_t>(rate * kCheckpointLeadSeconds),
                                 recorded_clock_ + 1, checkpoint_at_ + 1});
    checkpoint_at_ = at;
    next_checkpoint_time_ = now + config_.checkpoint_every_seconds;
    LOG(INFO) << "next checkpoint set at clock " << at << " (servers at up to " << fastest << ", "
              << rate << " clocks/s)";
  }

  // Failover: a promoted backup reports when it served the first pull of the dead
  // server's shards; the failure entry gets it once, with the time from the dead server's
  // last heartbeat (an upper bound of the time from its death).
  void NoteFirstPullsAfterFailover(const json& served) {
    for (json& e : failures_) {
      if (e.value("kind", "") != "server_lost" || e.contains("first_pull_served_unix_time")) {
        continue;
      }
      const std::string server = std::to_string(e.value("server", -1));
      if (!served.contains(server) || !served[server].is_number()) continue;
      const double t = served[server].get<double>();
      e["first_pull_served_unix_time"] = t;
      const double last_heartbeat = e.value("unix_time", 0.0) - e.value("silent_seconds", 0.0);
      e["first_pull_served_seconds"] = t - last_heartbeat;
    }
  }

  // A named set that some server refused (its workers passed the clock before the name
  // reached it) never completes. Once every server is past the clock, the servers that did
  // write their part are done with it: the half-written directory is removed, so that
  // every set directory on disk is whole or still being written, and the next clock is
  // named at once instead of a period later.
  void DropAbandonedCheckpointSet(double now) {
    if (checkpoint_at_ <= 0 || checkpoint_at_ <= recorded_clock_ ||
        checkpoint_at_ == abandoned_checkpoint_at_) {
      return;
    }
    int refused = -1;
    for (size_t s = 0; s < server_live_.size(); ++s) {
      const ServerLive& live = server_live_[s];
      if (live.clock < checkpoint_at_) return;  // may still write it
      if (live.checkpoint_clock < checkpoint_at_) refused = static_cast<int>(s);
    }
    if (refused < 0) return;  // whole: RecordWholeSet records it
    abandoned_checkpoint_at_ = checkpoint_at_;
    const std::string set = CheckpointSetDir(config_.checkpoint_dir, checkpoint_at_);
    std::error_code ec;
    std::filesystem::remove_all(set, ec);
    LOG(WARNING) << "checkpoint set at clock " << checkpoint_at_ << " abandoned: server " << refused
                 << " passed the clock before it was named there; removed " << set
                 << (ec ? " (failed: " + ec.message() + ")" : std::string());
    next_checkpoint_time_ = now;
  }

  // The job as ps_status shows it: one JSON object (see server/status_main.cc).
  json StatusJson() const {
    json st;
    st["phase"] = results_.empty() ? "registering" : "training";
    st["elapsed_seconds"] = results_.empty() ? 0.0 : Elapsed();
    st["epoch"] = epoch_;
    st["epochs"] = config_.epochs;
    st["epoch_fraction"] = epoch_fraction_;
    st["staleness"] = config_.staleness;
    st["examples"] = examples_total_;
    st["registered_servers"] = servers_.size();
    st["registered_workers"] = workers_.size();
    // The slowest worker still in the clock table: the one SSP makes the others wait on.
    int slowest = -1;
    int64_t min_clock = INT64_MAX;
    for (size_t i = 0; i < worker_live_.size(); ++i) {
      const WorkerLive& l = worker_live_[i];
      if (results_[i].done || !l.reported) continue;
      if (l.clock < min_clock) {
        min_clock = l.clock;
        slowest = static_cast<int>(i);
      }
    }
    json workers = json::array();
    for (size_t i = 0; i < worker_live_.size(); ++i) {
      const WorkerLive& l = worker_live_[i];
      // Who this worker waits on: a server holding its pull says so; else, a worker that
      // was blocked in its last report interval waits on the slowest one.
      int waits_on = -1;
      for (const ServerLive& s : server_live_) {
        if (!s.report.contains("held")) continue;
        for (const json& h : s.report["held"]) {
          if (h.is_object() && h.value("worker", -1) == static_cast<int>(i)) {
            waits_on = h.value("waits_on", -1);
          }
        }
      }
      const bool blocked =
          l.interval_wait > 0.05 * std::max(l.interval_seconds, 1e-9) && l.interval_wait > 0.01;
      if (waits_on < 0 && blocked && config_.staleness >= 0 && slowest != static_cast<int>(i)) {
        waits_on = slowest;
      }
      if (results_[i].done) waits_on = -1;
      workers.push_back(
          {{"id", i},
           {"device", workers_[i].device},
           {"host", workers_[i].host},
           {"state", results_[i].failed ? "failed"
                     : results_[i].done ? "done"
                                        : "training"},
           {"epoch", l.epoch},
           {"clock", l.clock},
           {"clock_lag", slowest >= 0 && !results_[i].done ? l.clock - min_clock : 0},
           {"examples", l.examples},
           {"examples_per_sec", l.examples_per_sec},
           {"wait_seconds", l.wait_seconds},
           {"blocked_fraction", l.interval_seconds > 0 ? l.interval_wait / l.interval_seconds : 0},
           {"waits_on", waits_on},
           {"report_age_seconds", l.reported ? Elapsed() - l.time : -1.0}});
    }
    st["workers"] = workers;
    json servers = json::array();
    for (size_t s = 0; s < servers_.size(); ++s) {
      json e = {{"id", s}, {"endpoint", servers_[s].endpoint}, {"host", servers_[s].host}};
      if (s < server_live_.size() && server_live_[s].report.is_object()) {
        const json& r = server_live_[s].report;
        for (const char* key :
             {"shards", "rows", "rows_spilled", "pushes", "pulls", "queue_depth"}) {
          e[key] = r.value(key, uint64_t{0});
        }
        e["pushes_per_sec"] = server_live_[s].pushes_per_sec;
        e["report_age_seconds"] = Elapsed() - server_live_[s].time;
      }
      servers.push_back(e);
    }
    st["servers"] = servers;
    st["failures"] = failures_;
    return st;
  }

  // Answers a status request. An asker that left (ps_status gave up) changes nothing.
  void ReplyStatus(const std::string& peer, uint64_t rid) {
    capnp::MallocMessageBuilder b;
    NewHeader(b, rid, -1).getBody().initStatusReply().setJson(StatusJson().dump());
    Status s = Send(peer, b);
    if (!s.ok()) LOG(WARNING) << "coordinator: status reply: " << s.ToString();
  }

  int WorkerIndex(const std::string& peer) const {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].peer == peer) return static_cast<int>(i);
    }
    return -1;
  }

  Status Train(const std::atomic<bool>& stop) {
    while (!final_eval_) {
      if (stop.load()) {
        Status stopped = StopWithCheckpoint();
        if (!stopped.ok()) return stopped;
      }
      PS_RETURN_IF_ERROR(CheckHeartbeats());
      if (barrier_released_ && Clock::now() - barrier_time_ > options_.final_eval_timeout) {
        return DeadlineExceeded("worker 0 sent no final evaluation within " +
                                std::to_string(options_.final_eval_timeout.count()) + " ms");
      }
      Result<Incoming> in = socket_->Recv(options_.poll_interval);
      if (!in.ok()) {
        if (in.status().code() == StatusCode::kDeadlineExceeded) continue;
        return in.status();
      }
      std::optional<DecodedHeader> h = Decode(*in);
      if (!h) continue;
      int w = WorkerIndex(in->peer);
      try {
        auto header = h->get();
        uint64_t rid = header.getRequestId();
        const auto which = header.getBody().which();
        if (which == wire::Header::Body::STATUS) {
          ReplyStatus(in->peer, rid);
          continue;
        }
        if (w < 0 && which == wire::Header::Body::REPORT) {
          if (int srv = ServerIndex(in->peer); srv >= 0) {
            // A server declared dead (stopped, now awake) changes nothing any more.
            if (!servers_[static_cast<size_t>(srv)].dead) {
              OnServerReport(srv, header.getBody().getReport().getJson().cStr());
            }
            capnp::MallocMessageBuilder b;
            NewHeader(b, rid, -1).getBody().initReportReply().setCheckpointAt(checkpoint_at_);
            // The server may be gone by now; that is for its own failure to tell.
            if (Status s = Send(in->peer, b); !s.ok())
              LOG(WARNING) << "server " << srv << ": " << s.ToString();
            continue;
          }
        }
        if (which == wire::Header::Body::ALIVE) {
          PS_RETURN_IF_ERROR(OnAlive(in->peer, rid, header.getBody().getAlive()));
          continue;
        }
        if (w < 0 && which == wire::Header::Body::REGISTER) {
          PS_RETURN_IF_ERROR(OnJoin(in->peer, rid, header.getBody().getRegister()));
          continue;
        }
        if (w >= 0 && Gone(static_cast<size_t>(w))) {
          ReplyError(in->peer, rid,
                     FailedPrecondition("worker " + std::to_string(w) +
                                        (workers_[static_cast<size_t>(w)].dead
                                             ? " was declared dead (silent for more than "
                                               "--heartbeat_timeout); its work went to others"
                                             : " has left the job")));
          continue;
        }
        if (w >= 0) workers_[static_cast<size_t>(w)].last_seen = Clock::now();
        if (w < 0) {
          ReplyError(in->peer, rid,
                     FailedPrecondition("the job is running and full; this peer "
                                        "is not one of its workers"));
          continue;
        }
        ++messages_during_training_;
        switch (header.getBody().which()) {
          case wire::Header::Body::REPORT: {
            json report = json::parse(header.getBody().getReport().getJson().cStr(), nullptr,
                                      /*allow_exceptions=*/false);
            if (!report.is_object()) {
              ReplyError(in->peer, rid, InvalidArgument("a report must be one JSON object"));
              continue;
            }
            report["worker"] = w;
            Status fields = CheckReportFields(report);
            if (!fields.ok()) {
              ReplyError(in->peer, rid, fields);
              continue;
            }
            OnReport(report);
            capnp::MallocMessageBuilder b;
            NewHeader(b, rid, -1).getBody().initReportReply();
            PS_RETURN_IF_ERROR(Send(in->peer, b));
            break;
          }
          case wire::Header::Body::DONE: {
            auto done = header.getBody().getDone();
            WorkerResult& r = results_[static_cast<size_t>(w)];
            r.done = true;
            r.failed = done.getFailed();
            r.message = done.getMessage().cStr();
            r.done_request = rid;
            json totals = json::parse(done.getJson().cStr(), nullptr, false);
            if (totals.is_object() && CheckReportFields(totals).ok()) {
              r.totals = totals;
            } else {
              LOG(WARNING) << "worker " << w << " sent malformed totals; they are left out";
            }
            if (r.failed) {
              LOG(ERROR) << "worker " << w << " failed: " << r.message;
              metrics_failures_.Increment();
              failures_.push_back({{"kind", "worker_failed"},
                                   {"process", "worker-" + std::to_string(w)},
                                   {"worker", w},
                                   {"time", Elapsed()},
                                   {"message", r.message}});
              // Its unfinished chunks go back to the queue for the others.
              int returned = leases_.Release(w);
              if (returned > 0) {
                LOG(INFO) << "returned " << returned << " chunks of worker " << w;
                PS_RETURN_IF_ERROR(AnswerHeldLeases());
              }
            }
            if (barrier_released_) {
              // A worker that joined late and found nothing left to train.
              capnp::MallocMessageBuilder b;
              NewHeader(b, rid, -1).getBody().setDoneReply();
              PS_RETURN_IF_ERROR(Send(in->peer, b));
            }
            PS_RETURN_IF_ERROR(MaybeReleaseBarrier());
            break;
          }
          case wire::Header::Body::HEARTBEAT: {
            capnp::MallocMessageBuilder b;
            NewHeader(b, rid, -1).getBody().setHeartbeatReply();
            PS_RETURN_IF_ERROR(Send(in->peer, b));
            break;
          }
          case wire::Header::Body::LEASE:
            PS_RETURN_IF_ERROR(OnLease(in->peer, w, rid, header.getBody().getLease()));
            break;
          default:
            ReplyError(in->peer, rid,
                       InvalidArgument("the coordinator does not handle this "
                                       "message type during training"));
        }
      } catch (const kj::Exception& e) {
        ReplyError(in->peer, 0,
                   InvalidArgument(std::string("malformed request: ") + e.getDescription().cStr()));
      }
      PrintProgress(false);
    }
    for (size_t i = 0; i < results_.size(); ++i) {
      if (results_[i].failed) {
        return Internal("worker " + std::to_string(i) + " failed: " + results_[i].message);
      }
    }
    return Status::Ok();
  }

  // A worker finished a chunk and/or wants the next one.
  Status OnLease(const std::string& peer, int w, uint64_t rid, wire::LeaseRequest::Reader req) {
    Status size = leases_.SetDatasetSize(req.getDatasetSize());
    if (!size.ok()) {
      ReplyError(peer, rid, size);
      return Status::Ok();
    }
    if (static_cast<size_t>(w) >= lease_clock_.size()) lease_clock_.resize(w + 1, 0);
    lease_clock_[static_cast<size_t>(w)] =
        std::max(lease_clock_[static_cast<size_t>(w)], req.getClock());
    if (req.getCompletedEpoch() > 0) {
      Status done = leases_.Complete(w, req.getCompletedEpoch(), req.getCompletedChunk());
      if (!done.ok()) {
        ReplyError(peer, rid, done);
        return Status::Ok();
      }
      int64_t& last = epoch_last_clock_[req.getCompletedEpoch()];
      last = std::max(last, req.getClock());
      for (int e : leases_.TakeCompletedEpochs()) {
        if (e < config_.epochs) evaluations_.push_back(e);  // the last one is the final eval
        // Every chunk of epoch e was trained by clock epoch_done_clock_[e] of its workers.
        epoch_done_clock_[e] = epoch_last_clock_[e];
      }
    }
    RecordWholeSet();
    if (req.getExamplesPerSec() > 0) rates_[static_cast<size_t>(w)] = req.getExamplesPerSec();
    if (req.getLeave()) {
      // The worker leaves (SIGTERM); it flushed its pushes and left the clock tables.
      capnp::MallocMessageBuilder b;
      auto reply = NewHeader(b, rid, -1).getBody().initLeaseReply();
      reply.setFinished();
      PS_RETURN_IF_ERROR(Send(peer, b));
      json event = {{"completed_chunk_before_leaving", req.getCompletedEpoch() > 0}};
      return RemoveWorker(w, false, event);
    }
    held_leases_.push_back(HeldLease{peer, rid, w, req.getWait()});
    return AnswerHeldLeases();
  }

  // Answers every lease request that can be answered now: with a chunk, with `finished`
  // once every epoch is done, or (for a request that may not wait) with `wait`.
  Status AnswerHeldLeases() {
    for (auto it = held_leases_.begin(); it != held_leases_.end();) {
      capnp::MallocMessageBuilder b;
      auto reply = NewHeader(b, it->request_id, -1).getBody().initLeaseReply();
      reply.setBatchSize(BatchSizeFor(it->worker));
      if (it->worker == Evaluator() && !evaluations_.empty()) {
        reply.setEvaluateEpoch(evaluations_.front());
        evaluations_.erase(evaluations_.begin());
      }
      if (std::optional<LeaseTable::Lease> lease = leases_.Acquire(it->worker)) {
        auto chunk = reply.initChunk();
        chunk.setEpoch(lease->epoch);
        chunk.setIndex(lease->chunk);
        chunk.setBegin(lease->begin);
        chunk.setEnd(lease->end);
      } else if (leases_.AllDone()) {
        reply.setFinished();
      } else if (!it->may_wait) {
        reply.setWait();
      } else {
        ++it;  // held until a chunk comes back or the job is done
        continue;
      }
      PS_RETURN_IF_ERROR(Send(it->peer, b));
      it = held_leases_.erase(it);
    }
    return Status::Ok();
  }

  // --batch_size=auto: batches proportional to the workers' throughput, batch_size on
  // average, so that every worker's clock ticks at about the same pace.
  uint32_t BatchSizeFor(int w) const {
    const double base = config_.batch_size;
    if (!config_.auto_batch) return static_cast<uint32_t>(base);
    double sum = 0;
    int known = 0;
    int live = 0;
    for (size_t i = 0; i < rates_.size(); ++i) {
      if (Gone(i)) continue;
      ++live;
      if (rates_[i] > 0) {
        sum += rates_[i];
        ++known;
      }
    }
    const double mine = rates_[static_cast<size_t>(w)];
    if (known < live || mine <= 0 || sum <= 0) {
      return static_cast<uint32_t>(base);
    }
    const double b = base * known * mine / sum;
    return static_cast<uint32_t>(std::clamp(b, 1.0, base * known));
  }

  void OnReport(const json& report) {
    metrics_->Append(report);
    std::string kind = report.value("kind", "");
    if (kind == "train") {
      uint64_t n = report.value("examples", uint64_t{0});
      const int w = report.value("worker", -1);
      if (w >= 0 && static_cast<size_t>(w) < worker_live_.size()) {
        WorkerLive& l = worker_live_[static_cast<size_t>(w)];
        l.reported = true;
        l.time = Elapsed();
        l.epoch = report.value("epoch", l.epoch);
        if (report.contains("clock") && report["clock"].is_number()) {
          l.clock = report["clock"].get<int64_t>();
        }
        l.examples += n;
        l.examples_per_sec = report.value("examples_per_sec", 0.0);
        l.interval_wait = report.value("wait_seconds", 0.0);
        l.interval_seconds = l.examples_per_sec > 0 ? n / l.examples_per_sec : 0.0;
        l.wait_seconds += l.interval_wait;
        if (static_cast<size_t>(w) < metrics_workers_.size()) {
          const WorkerMetricHandles& m = metrics_workers_[static_cast<size_t>(w)];
          int64_t min_clock = l.clock;
          for (size_t i = 0; i < worker_live_.size(); ++i) {
            if (worker_live_[i].reported && !results_[i].done) {
              min_clock = std::min(min_clock, worker_live_[i].clock);
            }
          }
          m.clock.Set(static_cast<double>(l.clock));
          m.clock_lag.Set(static_cast<double>(l.clock - min_clock));
          m.examples_per_sec.Set(l.examples_per_sec);
          m.wait_seconds.Increment(l.interval_wait);
        }
      }
      metrics_examples_.Increment(static_cast<double>(n));
      accuracy_sum_since_print_ += report.value("accuracy", 0.0) * static_cast<double>(n);
      examples_total_ += n;
      loss_sum_since_print_ += report.value("loss", 0.0) * static_cast<double>(n);
      loss_examples_since_print_ += n;
      if (report.value("worker", -1) == Evaluator()) {  // worker 0 unless it is gone
        metrics_epoch_.Set(report.value("epoch", epoch_));
        epoch_ = report.value("epoch", epoch_);
        epoch_fraction_ = report.value("epoch_fraction", epoch_fraction_);
      }
    } else if (kind == "eval") {
      last_eval_ = report;
      metrics_test_accuracy_.Set(report.value("test_accuracy", 0.0));
      metrics_test_loss_.Set(report.value("test_loss", 0.0));
      bool final_eval = report.value("final", false);
      int epoch = report.value("epoch", 0);
      double elapsed = Elapsed();
      double train_loss =
          loss_examples_since_print_ > 0
              ? loss_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
              : 0.0;
      double rate = examples_total_ / std::max(elapsed, 1e-9);
      std::string auc =
          report.contains("test_auc")
              ? "  test_auc " + std::to_string(report.value("test_auc", 0.0)).substr(0, 6)
              : "";
      const double train_acc =
          loss_examples_since_print_ > 0
              ? accuracy_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
              : 0.0;
      std::printf(
          "epoch %d/%d  train_loss %.4f  train_acc %.4f  test_loss %.4f  test_acc %.4f%s  %.0f "
          "ex/s  %.1fs%s\n",
          epoch, config_.epochs, train_loss, train_acc, report.value("test_loss", 0.0),
          report.value("test_accuracy", 0.0), auc.c_str(), rate, elapsed,
          final_eval
              ? "  (final)"
              : ("  ETA " + Eta(static_cast<double>(epoch) / config_.epochs, elapsed)).c_str());
      std::fflush(stdout);
      accuracy_sum_since_print_ = 0;
      loss_sum_since_print_ = 0;
      loss_examples_since_print_ = 0;
      last_print_time_ = elapsed;
      examples_at_last_print_ = examples_total_;
      if (final_eval) final_eval_ = report;
    }
  }

  void PrintProgress(bool force) {
    if (options_.progress_every_seconds <= 0) return;
    double now = Elapsed();
    if (!force && now - last_print_time_ < options_.progress_every_seconds) return;
    double dt = now - last_print_time_;
    double rate = dt > 0 ? (examples_total_ - examples_at_last_print_) / dt : 0;
    double loss = loss_examples_since_print_ > 0
                      ? loss_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
                      : 0.0;
    const double acc =
        loss_examples_since_print_ > 0
            ? accuracy_sum_since_print_ / static_cast<double>(loss_examples_since_print_)
            : 0.0;
    const double done = (epoch_ - 1 + epoch_fraction_) / std::max(config_.epochs, 1);
    std::printf(
        "  epoch %d/%d %3.0f%%  %.0f ex/s  train_loss %.4f  train_acc %.4f  %.1fs  ETA %s\n",
        epoch_, config_.epochs, 100.0 * epoch_fraction_, rate, loss, acc, now,
        Eta(done, now).c_str());
    std::fflush(stdout);
    last_print_time_ = now;
    examples_at_last_print_ = examples_total_;
  }

  Status ShutdownServers(json* out) {
    Status first_error;
    for (size_t s = 0; s < servers_.size(); ++s) {
      json entry = {{"id", s}, {"endpoint", servers_[s].endpoint}};
      if (servers_[s].dead) {
        // Failed over (--replicas=2): nothing to shut down; its counters died with it.
        entry["state"] = "lost";
        entry["served_by"] = ServedBy(static_cast<int>(s));
        out->push_back(entry);
        continue;
      }
      Result<CallReply> reply = Unavailable("not contacted");
      Result<std::unique_ptr<ClientSocket>> sock = transport_->Connect(servers_[s].endpoint);
      if (sock.ok()) {
        capnp::MallocMessageBuilder b;
        NewHeader(b, 1, -1).getBody().setShutdown();
        Frames f;
        f.push_back(EncodeFrame(b));
        reply = Call(**sock, std::move(f), options_.shutdown_timeout);
      } else {
        reply = sock.status();
      }
      if (reply.ok() &&
          reply->header.get().getBody().which() == wire::Header::Body::SHUTDOWN_REPLY) {
        auto st = reply->header.get().getBody().getShutdownReply();
        entry["pushes_applied"] = st.getPushesApplied();
        entry["pushes_rejected"] = st.getPushesRejected();
        entry["pulls_served"] = st.getPullsServed();
        entry["bytes_pushed"] = st.getBytesPushed();
        entry["bytes_pulled"] = st.getBytesPulled();
        entry["rows_held"] = st.getRowsHeld();
        entry["pushes_dropped"] = st.getPushesDropped();
        entry["pulls_held"] = st.getPullsHeld();
        entry["max_clock_lag"] = st.getMaxClockLag();
        entry["staleness_sum"] = st.getStalenessSum();
        entry["staleness_max"] = st.getStalenessMax();
        entry["rows_in_memory"] = st.getRowsInMemory();
        entry["rows_spilled"] = st.getRowsSpilled();
        entry["cache_hits"] = st.getCacheHits();
        entry["cache_misses"] = st.getCacheMisses();
        entry["spill_bytes_read"] = st.getSpillBytesRead();
        entry["spill_bytes_written"] = st.getSpillBytesWritten();
        entry["peak_rss_bytes"] = st.getPeakRssBytes();
        entry["pushes_duplicate"] = st.getPushesDuplicate();
        entry["workers_evicted"] = st.getWorkersEvicted();
        json hist = json::array();
        for (uint64_t c : st.getStalenessHistogram()) hist.push_back(c);
        entry["staleness_histogram"] = hist;
      } else {
        Status e = reply.ok() ? Internal("unexpected reply to shutdown") : reply.status();
        LOG(ERROR) << "server " << s << " did not shut down cleanly: " << e.ToString();
        entry["error"] = e.ToString();
        if (first_error.ok()) first_error = e.WithContext("server " + std::to_string(s));
      }
      out->push_back(entry);
    }
    return first_error;
  }

  Status WriteSummary(const Status& outcome, const json& servers) {
    double wall = std::chrono::duration<double>(Clock::now() - job_start_).count();
    double train_seconds = results_.empty() ? 0.0 : Elapsed();
    json summary;
    summary["status"] = outcome.ok() ? "ok" : "failed";
    if (!outcome.ok()) summary["error"] = outcome.ToString();
    const json& eval = final_eval_ ? *final_eval_ : last_eval_;
    summary["test_accuracy"] = eval.is_object() ? eval.value("test_accuracy", 0.0) : 0.0;
    summary["test_loss"] = eval.is_object() ? eval.value("test_loss", 0.0) : 0.0;
    if (eval.is_object() && eval.contains("test_auc")) summary["test_auc"] = eval["test_auc"];
    summary["epochs"] = config_.epochs;
    if (restored_.is_object()) summary["restored"] = restored_;
    if (!config_.checkpoint_dir.empty()) {
      summary["checkpoints_recorded"] = checkpoints_recorded_;
      summary["last_recorded_checkpoint_clock"] = recorded_clock_;
    }
    summary["wall_seconds"] = wall;
    summary["train_seconds"] = train_seconds;
    summary["train_start_time"] = train_start_unix_;
    {
      // What the coordinator costs: its CPU time over the whole job, and the requests it
      // answered while workers trained (reports, leases, done), per second.
      rusage u{};
      getrusage(RUSAGE_SELF, &u);
      const double cpu = u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
                         u.ru_stime.tv_usec / 1e6;
      summary["coordinator_cpu_seconds"] = cpu;
      summary["coordinator_messages_per_sec"] =
          train_seconds > 0 ? messages_during_training_ / train_seconds : 0.0;
    }
    uint64_t examples = 0;
    json workers = json::array();
    for (size_t i = 0; i < workers_.size(); ++i) {
      const json& t = i < results_.size() ? results_[i].totals : json::object();
      uint64_t n = t.value("examples", uint64_t{0});
      examples += n;
      double secs = t.value("seconds", 0.0);
      workers.push_back({{"id", i},
                         {"device", workers_[i].device},
                         {"host", workers_[i].host},
                         {"examples", n},
                         {"steps", t.value("steps", int64_t{0})},
                         {"seconds", secs},
                         {"wait_seconds", t.value("wait_seconds", 0.0)},
                         {"compute_seconds", t.value("compute_seconds", 0.0)},
                         {"batch_size", t.value("batch_size", 0)},
                         {"examples_per_sec", secs > 0 ? n / secs : 0.0},
                         {"failed", i < results_.size() && results_[i].failed},
                         {"group", workers_[i].group_formed},
                         {"state", workers_[i].dead   ? "lost"
                                   : workers_[i].left ? "left"
                                                      : "finished"},
                         {"joined", workers_[i].joined},
                         {"pushes_lost", t.value("pushes_lost", uint64_t{0})}});
      // Where the worker's time went (input from the network: copied only when well-typed).
      for (const char* key : {"step_seconds", "pull_wait_ms"}) {
        if (!t.contains(key) || !t[key].is_object()) continue;
        json numbers = json::object();
        for (const auto& [k, v] : t[key].items()) {
          if (v.is_number()) numbers[k] = v;
        }
        workers.back()[key] = numbers;
      }
      if (t.contains("prefetch") && t["prefetch"].is_boolean()) {
        workers.back()["prefetch"] = t["prefetch"];
      }
    }
    summary["examples"] = examples;
    summary["examples_per_epoch"] = leases_.examples_per_epoch();
    summary["batch_size"] = config_.auto_batch ? json("auto") : json(config_.batch_size);
    summary["examples_per_sec"] = train_seconds > 0 ? examples / train_seconds : 0.0;
    // A counter summed over the servers (or workers), and a maximum over the servers.
    auto sum = [](const json& entries, const char* key) {
      uint64_t total = 0;
      for (const json& e : entries) total += e.value(key, uint64_t{0});
      return total;
    };
    auto max_of = [&servers]<typename T>(const char* key, T zero) {
      T m = zero;
      for (const json& s : servers) m = std::max(m, s.value(key, zero));
      return m;
    };
    const uint64_t applied = sum(servers, "pushes_applied");
    std::vector<uint64_t> histogram;
    for (const json& s : servers) {
      if (s.contains("staleness_histogram")) {
        const json& h = s["staleness_histogram"];
        if (histogram.size() < h.size()) histogram.resize(h.size(), 0);
        for (size_t i = 0; i < h.size(); ++i) histogram[i] += h[i].get<uint64_t>();
      }
    }
    summary["pushes_applied"] = applied;
    summary["pushes_rejected"] = sum(servers, "pushes_rejected");
    summary["pushes_dropped"] = sum(servers, "pushes_dropped");
    summary["pulls_held"] = sum(servers, "pulls_held");
    summary["staleness"] = config_.staleness;
    summary["max_clock_lag_seen"] = max_of("max_clock_lag", int64_t{0});
    summary["max_staleness_seen"] = max_of("staleness_max", uint64_t{0});
    summary["mean_staleness"] =
        applied > 0 ? static_cast<double>(sum(servers, "staleness_sum")) / applied : 0.0;
    {
      // p99 of the gradients' staleness, from the servers' merged histograms.
      uint64_t total = 0, seen = 0;
      for (uint64_t c : histogram) total += c;
      size_t p99 = 0;
      for (size_t i = 0; i < histogram.size(); ++i) {
        seen += histogram[i];
        if (seen * 100 >= total * 99) {
          p99 = i;
          break;
        }
      }
      summary["p99_staleness"] = p99;
    }
    double wait_total = 0;
    for (const json& w : workers) wait_total += w.value("wait_seconds", 0.0);
    summary["wait_seconds"] = wait_total;
    summary["bytes_pushed"] = sum(servers, "bytes_pushed");
    summary["bytes_pulled"] = sum(servers, "bytes_pulled");
    // The spill tier (server/row_store.h), over all servers.
    const uint64_t hits = sum(servers, "cache_hits"), misses = sum(servers, "cache_misses");
    summary["rows_in_memory"] = sum(servers, "rows_in_memory");
    summary["rows_spilled"] = sum(servers, "rows_spilled");
    summary["cache_hit_rate"] =
        hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 1.0;
    summary["spill_bytes_read"] = sum(servers, "spill_bytes_read");
    summary["spill_bytes_written"] = sum(servers, "spill_bytes_written");
    summary["max_server_peak_rss_bytes"] = max_of("peak_rss_bytes", uint64_t{0});
    summary["workers"] = workers;
    // Failures survived: workers lost (silent past --heartbeat_timeout) or gone on SIGTERM,
    // what was recovered; workers that joined. pushes_lost: pushes a worker gave up on
    // (not acknowledged after its retries); acknowledged pushes are never lost.
    summary["failures"] = failures_;
    summary["joins"] = joins_;
    summary["heartbeat_timeout"] = config_.heartbeat_timeout;
    // pushes_lost also counts the acknowledged pushes a restarted server rolled back
    // (--replicas=1): per rollback the larger of the count the dead server reported since
    // the checkpoint (a lower bound: the pushes after its last status report, sent every
    // second, are not known) and the estimate from the clocks rolled back; so it is an
    // estimate then (pushes_lost_estimated). pushes_lost_by_workers and pushes_rolled_back
    // give the two parts.
    uint64_t rolled_back = 0;
    bool estimated = false;
    for (const json& f : failures_) {
      if (!f.contains("rollback")) continue;
      estimated = true;
      uint64_t n = 0;
      for (const char* key : {"pushes_since_checkpoint", "pushes_since_checkpoint_estimate"}) {
        const json& v = f["rollback"].value(key, json());
        if (v.is_number_unsigned()) n = std::max(n, v.get<uint64_t>());
      }
      rolled_back += n;
    }
    summary["pushes_lost_by_workers"] = sum(workers, "pushes_lost");
    summary["pushes_rolled_back"] = rolled_back;
    summary["pushes_lost_estimated"] = estimated;
    summary["pushes_lost"] = sum(workers, "pushes_lost") + rolled_back;
    summary["pushes_duplicate"] = sum(servers, "pushes_duplicate");
    summary["servers"] = servers;
    summary["config"] = config_.ToFlagMap();
    std::string path = options_.run_dir + "/summary.json";
    PS_RETURN_IF_ERROR(WriteJsonFile(path, summary));
    std::printf("%s: test_acc %.4f  test_loss %.4f  %.0f ex/s  %.1fs wall  -> %s\n",
                outcome.ok() ? "done" : "FAILED", summary["test_accuracy"].get<double>(),
                summary["test_loss"].get<double>(), summary["examples_per_sec"].get<double>(), wall,
                path.c_str());
    std::fflush(stdout);
    return Status::Ok();
  }

  // The time left when `fraction` of the job took `elapsed` seconds, as 1h02m, 3m05s or 42s.
  static std::string Eta(double fraction, double elapsed) {
    if (!(fraction > 0.001) || fraction >= 1) return fraction >= 1 ? "0s" : "?";
    const long left = std::lround(elapsed * (1 - fraction) / fraction);
    char buf[32];
    if (left >= 3600) {
      std::snprintf(buf, sizeof buf, "%ldh%02ldm", left / 3600, left / 60 % 60);
    } else if (left >= 60) {
      std::snprintf(buf, sizeof buf, "%ldm%02lds", left / 60, left % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lds", left);
    }
    return buf;
  }

  double Elapsed() const {
    return std::chrono::duration<double>(Clock::now() - train_start_).count();
  }

  JobConfig config_;
  CoordinatorOptions options_;
  Transport* transport_;
  std::unique_ptr<ServerSocket> socket_;
  std::unique_ptr<MetricsLog> metrics_;
  std::vector<Member> servers_, workers_;
  std::vector<WorkerResult> results_;
  Clock::time_point job_start_, train_start_;
  double train_start_unix_ = 0;  // metrics lines' "time" minus this: seconds into training
  uint64_t messages_during_training_ = 0;  // requests from workers while the job ran

  // Data leases.
  struct HeldLease {
    std::string peer;
    uint64_t request_id;
    int worker;
    bool may_wait;
  };
  LeaseTable leases_;
  std::vector<HeldLease> held_leases_;
  std::vector<double> rates_;     // workers' compute throughput, examples/s
  std::vector<int> evaluations_;  // epochs worker 0 should evaluate

  // Failures and joins.
  std::vector<std::unique_ptr<ClientSocket>> server_sockets_;  // for evictions, by server id
  std::map<int, int> promoted_;  // failover: dead server -> the backup serving its shards
  // --replicas=1: servers replaced by a restarted process (their new endpoint is theirs),
  // processes waiting for a dead server to replace, and per dead server its failure entry
  // (index in failures_) and its last status.
  std::set<int> replaced_;
  std::vector<Member> waiting_servers_;
  std::map<int, size_t> lost_event_;
  std::map<int, size_t> awaiting_first_report_;
  json job_sets_ = json::array();  // checkpoint sets of this job, oldest first
  uint64_t evict_request_ = 0;
  json failures_ = json::array();
  json joins_ = json::array();
  bool barrier_released_ = false;
  int final_evaluator_ = -1;
  Clock::time_point barrier_time_;

  // Progress, from workers' reports.
  uint64_t examples_total_ = 0;
  uint64_t examples_at_last_print_ = 0;
  double loss_sum_since_print_ = 0;
  uint64_t loss_examples_since_print_ = 0;
  double last_print_time_ = 0;
  int epoch_ = 1;
  // Checkpoints: where a restored job starts, and the record of complete sets.
  int64_t start_clock_ = 0;
  int start_epoch_ = 1;
  json restored_;               // null unless --restore
  int64_t recorded_clock_ = 0;  // no set is taken at clock 0
  // --checkpoint_every=<N>s: the clock named for the next set (-1: none yet) and when to
  // name the one after (seconds since the job started; -1: at the first server report).
  int64_t checkpoint_at_ = -1;
  int64_t abandoned_checkpoint_at_ = -1;  // the named clock whose set was dropped
  // Stopping (StopWithCheckpoint): the set waited for, and until when.
  int64_t stop_checkpoint_at_ = -1;
  std::optional<Clock::time_point> stop_checkpoint_deadline_;
  double next_checkpoint_time_ = -1;
  uint64_t checkpoints_recorded_ = 0;
  int64_t whole_clock_ = 0;                   // the latest set every server committed
  std::vector<int64_t> lease_clock_;          // per worker: its clock at its latest lease request
  std::vector<std::set<int64_t>> committed_;  // per server: clocks of its committed files
  std::map<int, int64_t> epoch_last_clock_;   // epoch -> largest clock a chunk of it ended at
  std::map<int, int64_t> epoch_done_clock_;   // epoch -> that clock, once the epoch is done
  double epoch_fraction_ = 0;
  std::optional<json> final_eval_;
  json last_eval_;
  double accuracy_sum_since_print_ = 0;

  // Live status for ps_status: the latest of each worker's and server's reports.
  struct WorkerLive {
    bool reported = false;
    double time = 0;  // Elapsed() at the last report
    int epoch = 0;
    int64_t clock = 0;
    uint64_t examples = 0;
    double examples_per_sec = 0;
    double wait_seconds = 0;      // blocked by the staleness bound, in total
    double interval_wait = 0;     // ... in the last report's interval
    double interval_seconds = 0;  // that interval's length
  };
  struct ServerLive {
    json report;  // the last ServerStatusJson
    double time = 0;
    uint64_t pushes = 0;
    double pushes_per_sec = 0;
    int64_t clock = -1;  // the slowest live worker's clock there
    double clocks_per_sec = 0;
    int64_t checkpoint_clock = -1;                     // the latest checkpoint it committed
    std::map<int64_t, uint64_t> pushes_at_checkpoint;  // its push count at each checkpoint
  };
  std::map<int, ServerLive> lost_live_;  // a dead server's last status
  std::vector<WorkerLive> worker_live_;
  std::vector<ServerLive> server_live_;

  // Prometheus metrics (no-ops without options_.metrics).
  struct WorkerMetricHandles {
    Gauge clock, clock_lag, examples_per_sec;
    Counter wait_seconds;
  };
  std::vector<WorkerMetricHandles> metrics_workers_;
  Counter metrics_examples_, metrics_failures_;
  Gauge metrics_epoch_, metrics_test_accuracy_, metrics_test_loss_;
};

}  // namespace

Status RunCoordinator(const JobConfig& config, const CoordinatorOptions& options,
                      Transport* transport, const std::atomic<bool>& stop) {
  if (options.run_dir.empty()) return InvalidArgument("the coordinator needs a run directory");
  CoordinatorJob job(config, options, transport);
  return job.Run(stop);
}

}  // namespace ps
