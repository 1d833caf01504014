// Who is in a job: the registered servers and workers, their ids, whether each is alive
// (heartbeats), gone (declared dead, or left on SIGTERM) or done, the all-reduce groups and
// the evaluator. It decides; the coordinator's loop (server/coordinator.h) talks.
//
// Ids within a role: a requested id where it is valid and free, then arrival order. A
// worker that joins the running job gets the next id. The evaluator is the lowest live
// worker (worker 0 unless it is gone). A process is silent when its last message is older
// than the heartbeat timeout; every method that asks takes the time as `now`, so that
// tests drive the clock.
//
// Thread model: not thread-safe; the coordinator's one thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/job_config.h"
#include "common/status.h"

namespace ps {

using CoordClock = std::chrono::steady_clock;

// How a worker ended, from its `done` message.
struct WorkerResult {
  bool done = false;
  bool failed = false;
  std::string message;
  nlohmann::json totals = nlohmann::json::object();  // well-typed (else left empty)
  uint64_t done_request = 0;                         // the request the barrier answers
};

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
  CoordClock::time_point last_seen;
  bool dead = false;             // declared dead (silent past the heartbeat timeout)
  bool left = false;             // left the job (SIGTERM)
  bool joined = false;           // joined the running job
  bool silent_reported = false;  // servers: a silence already handled
  WorkerResult result;           // workers
};

// One all-reduce group as the coordinator formed it.
struct GroupPlan {
  std::string name;
  std::vector<uint32_t> ids;  // worker ids, ascending: ids[0] leads
  std::string endpoint;
};

struct MembershipOptions {
  // Processes in the job at the start (--num_servers, --num_workers).
  int num_servers = 1;
  int num_workers = 1;
  // Workers per all-reduce group by id (--group_size; 1: none unless --group=NAME).
  int group_size = 1;
  // A process silent for longer is declared dead (--heartbeat_timeout).
  std::chrono::duration<double> heartbeat_timeout{4.0};
  // The leader endpoint of group k is this followed by k (an ipc path unique on the host).
  std::string group_endpoint_prefix = "ipc:///tmp/ps-group-";

  // The job's settings, and a group prefix unique to this process and start.
  static MembershipOptions ForJob(const JobConfig& config);
};

// "cpu: 2 threads" -> "cpu", "NVIDIA H200 (cuda:0)" -> "cuda": what a group may not mix.
std::string DeviceKind(const std::string& device);

// Sorts members by id: requested ids where valid and free, then arrival order.
void AssignIds(std::vector<Member>& members);

class Membership {
 public:
  explicit Membership(MembershipOptions options) : options_(std::move(options)) {}

  // ---- registration ----
  // An error names why the process may not register (the job is full).
  Status AddServer(Member m);
  Status AddWorker(Member m);
  bool complete() const;  // every server and worker of the job registered
  // Everyone is here: assigns ids, forms the all-reduce groups (an error when a group
  // mixes devices or hosts) and starts every process's heartbeat clock at `now`.
  Result<std::vector<GroupPlan>> Assemble(CoordClock::time_point now);
  bool assembled() const { return assembled_; }

  // A restarted coordinator (server/coord_resume.h): the job's members as journaled, ids
  // by position. Every process's heartbeat clock starts at `now`; peers are learned again
  // as processes write (their routing identities changed with the coordinator's socket).
  void Restore(std::vector<Member> servers, std::vector<Member> workers,
               CoordClock::time_point now);

  // A worker joins the running job; returns its id.
  uint32_t Join(Member m, CoordClock::time_point now);

  // ---- heartbeats ----
  // A beat from `id` of a role; returns whether the sender is evicted (gone, or a server
  // whose id another process (`pid` differs) took since).
  bool OnAlive(bool server, int id, uint32_t pid, CoordClock::time_point now);
  void Touch(int worker, CoordClock::time_point now);
  // Live workers silent past the timeout (only `only` when >= 0), ascending.
  std::vector<int> SilentWorkers(CoordClock::time_point now, int only = -1) const;
  // Servers silent past the timeout not reported before; marks them reported.
  std::vector<int> TakeSilentServers(CoordClock::time_point now);
  double SilentSeconds(const Member& m, CoordClock::time_point now) const;
  // The coordinator itself read no heartbeat for `stall` (it waited on a server, e.g. a
  // re-replication, or was descheduled): that time does not count as anyone's silence.
  void ForgiveStall(CoordClock::duration stall);

  // ---- state ----
  bool Gone(size_t w) const { return workers_[w].dead || workers_[w].left; }
  // The lowest live worker, -1 when all are gone.
  int Evaluator() const;
  // Every live worker is done, and there is one.
  bool AllLiveDone() const;
  // Per worker: still training (neither done nor gone).
  std::vector<bool> Training() const;
  std::vector<bool> Live() const;
  // Workers that are gone (*evicted) and live ones that are done (*idle), ascending.
  void GoneAndIdle(std::vector<uint32_t>* evicted, std::vector<uint32_t>* idle) const;
  int WorkerIndex(const std::string& peer) const;
  int ServerIndex(const std::string& peer) const;

  std::vector<Member>& servers() { return servers_; }
  const std::vector<Member>& servers() const { return servers_; }
  std::vector<Member>& workers() { return workers_; }
  const std::vector<Member>& workers() const { return workers_; }

 private:
  Result<std::vector<GroupPlan>> FormGroups() const;

  MembershipOptions options_;
  std::vector<Member> servers_, workers_;
  bool assembled_ = false;
};

}  // namespace ps
