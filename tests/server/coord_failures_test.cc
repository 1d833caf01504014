// The failure log: each kind's JSON, a restart's rollback, the pushes rolled back, and the
// first pull after a failover.
#include "server/coord_failures.h"

#include <gtest/gtest.h>

#include "common/transport.h"
#include "server/coord_failover.h"
#include "server/coord_membership.h"

namespace ps {
namespace {

using nlohmann::json;

TEST(CoordFailures, WorkerEntriesSayWhatHappened) {
  FailureLog log;
  FailureEntry lost;
  lost.kind = FailureKind::kWorkerLost;
  lost.id = 2;
  lost.pid = 4242;
  lost.host = "h1";
  lost.time = 12.5;
  lost.unix_time = 1000.0;
  lost.silent_seconds = 4.25;
  lost.leases_returned = 3;
  lost.recovered = "3 data leases back to the queue";
  EXPECT_EQ(log.Add(lost), 0u);
  FailureEntry failed;
  failed.kind = FailureKind::kWorkerFailed;
  failed.id = 1;
  failed.time = 20;
  failed.message = "out of memory";
  EXPECT_EQ(log.Add(failed), 1u);

  const json j = log.ToJson();
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0], json::parse(R"({"kind":"worker_lost","process":"worker-2","worker":2,
      "pid":4242,"host":"h1","time":12.5,"unix_time":1000.0,"silent_seconds":4.25,
      "leases_returned":3,"recovered":"3 data leases back to the queue"})"));
  EXPECT_EQ(j[1], json::parse(R"({"kind":"worker_failed","process":"worker-1","worker":1,
      "time":20.0,"message":"out of memory"})"));
  bool estimated = true;
  EXPECT_EQ(log.PushesRolledBack(&estimated), 0u);
  EXPECT_FALSE(estimated);
}

TEST(CoordFailures, LeftWorkerSaysWhetherItFinishedItsChunk) {
  FailureEntry left;
  left.kind = FailureKind::kWorkerLeft;
  left.id = 0;
  left.completed_chunk_before_leaving = true;
  const json j = left.ToJson();
  EXPECT_EQ(j["kind"], "worker_left");
  EXPECT_EQ(j["completed_chunk_before_leaving"], true);
  EXPECT_FALSE(j.contains("silent_seconds"));
}

TEST(CoordFailures, RollbackFromTheCheckpointTheDeadServerLastReported) {
  ServerLive before;
  before.pushes = 1000;
  before.clock = 50;
  before.pushes_at_checkpoint[40] = 800;
  Rollback r = ComputeRollback(40, std::string("/ckpt/clock-40"), 48, 52, before);
  EXPECT_EQ(r.clocks_rolled_back, 12);  // from the fastest worker's clock
  ASSERT_TRUE(r.pushes_since_checkpoint);
  EXPECT_EQ(*r.pushes_since_checkpoint, 200u);
  ASSERT_TRUE(r.pushes_since_checkpoint_estimate);
  EXPECT_EQ(*r.pushes_since_checkpoint_estimate, 240u);  // 1000 / 50 * 12

  // No set: the initial values; every push it reported is lost.
  Rollback initial = ComputeRollback(0, std::nullopt, 10, 9, before);
  EXPECT_EQ(initial.clocks_rolled_back, 10);
  EXPECT_EQ(initial.pushes_since_checkpoint.value_or(0), 1000u);
  // A set it never reported a count at: unknown.
  Rollback unknown = ComputeRollback(30, std::string("/ckpt/clock-30"), 48, 40, before);
  EXPECT_FALSE(unknown.pushes_since_checkpoint);

  FailureLog log;
  FailureEntry e;
  e.kind = FailureKind::kServerLost;
  e.id = 0;
  e.rollback = r;
  log.Add(e);
  e.rollback = unknown;
  log.Add(e);
  bool estimated = false;
  EXPECT_EQ(log.PushesRolledBack(&estimated), 240u + 360u);  // larger of count and estimate
  EXPECT_TRUE(estimated);
  const json j = log.ToJson()[1];
  EXPECT_EQ(j["kind"], "server_lost");
  EXPECT_EQ(j["process"], "server-0");
  EXPECT_EQ(j["server"], 0);
  EXPECT_TRUE(j["rollback"]["pushes_since_checkpoint"].is_null());
  EXPECT_EQ(j["rollback"]["set"], "/ckpt/clock-30");
  EXPECT_EQ(j["rollback"]["checkpoint_clock"], 30);
}

TEST(CoordFailures, FirstPullAfterFailoverIsNotedOnce) {
  FailureLog log;
  FailureEntry e;
  e.kind = FailureKind::kServerLost;
  e.id = 1;
  e.unix_time = 110.0;
  e.silent_seconds = 4.0;
  log.Add(e);
  log.NoteFirstPullsAfterFailover(json{{"0", 200.0}});  // another server's shards
  EXPECT_FALSE(log.entries()[0].first_pull_served_unix_time);
  log.NoteFirstPullsAfterFailover(json{{"1", 107.5}});
  log.NoteFirstPullsAfterFailover(json{{"1", 300.0}});  // later reports change nothing
  const json j = log.ToJson()[0];
  EXPECT_DOUBLE_EQ(j["first_pull_served_unix_time"].get<double>(), 107.5);
  EXPECT_DOUBLE_EQ(j["first_pull_served_seconds"].get<double>(), 1.5);  // from 106.0
}

TEST(CoordFailures, JoinsAreListed) {
  FailureLog log;
  log.AddJoin({3, 77, "h2", 9.5});
  EXPECT_EQ(log.JoinsJson(), json::parse(R"([{"worker":3,"pid":77,"host":"h2","time":9.5}])"));
}

// A membership of `servers` servers (and one worker, never registered).
MembershipOptions ServersOnly(int servers) {
  MembershipOptions o;
  o.num_servers = servers;
  o.num_workers = 1;
  return o;
}

// Registers `n` servers, ids 0 to n-1, at endpoints nobody listens on.
void AddServers(Membership& members, int n) {
  for (int s = 0; s < n; ++s) {
    Member m;
    m.peer = "s" + std::to_string(s);
    m.endpoint = "ipc:///tmp/ps-failover-test-" + std::to_string(s);
    ASSERT_TRUE(members.AddServer(m).ok());
  }
}

// A lost server's counters died with it; summary.json keeps what it last reported.
TEST(CoordFailures, ALostServersLastCountersAreInTheSummary) {
  Membership members(ServersOnly(2));
  ASSERT_NO_FATAL_FAILURE(AddServers(members, 2));
  for (Member& m : members.servers()) m.dead = true;  // neither is contacted
  Transport transport;
  Failover failover(FailoverOptions{}, &transport, &members);
  ServerLive last;
  last.Apply(json{{"kind", "server"},
                  {"server", 0},
                  {"pushes", 1234},
                  {"pulls", 1300},
                  {"bytes_pushed", 5000000},
                  {"rows", 64},
                  {"clock", 17},
                  {"held", json::array()}},
             42.5);
  failover.OnServerLost(0, 0, last);
  failover.OnServerLost(1, 1, ServerLive{});  // lost before its first report

  std::vector<ServerSummary> out;
  ASSERT_TRUE(failover.ShutdownServers(&out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].state, "lost");
  ASSERT_TRUE(out[0].before_loss.has_value());
  EXPECT_EQ(*out[0].before_loss, json::parse(R"({"seconds":42.5,"pushes":1234,"pulls":1300,
      "bytes_pushed":5000000,"rows":64,"clock":17})"));
  EXPECT_FALSE(out[1].before_loss.has_value());
  EXPECT_EQ(out[1].state, "lost");
}

// ps_status's view of each server: serving, lost (and who serves its shards), and a
// promoted backup's extra shards.
TEST(CoordFailures, StatusSaysWhoServesALostServersShards) {
  Membership members(ServersOnly(3));
  ASSERT_NO_FATAL_FAILURE(AddServers(members, 3));
  members.servers()[0].dead = true;  // failed over to 1 (below)
  members.servers()[2].dead = true;  // dead, nobody serves its shards
  Transport transport;
  Failover failover(FailoverOptions{}, &transport, &members);
  failover.RestoreState(
      json{{"promoted", json::array({json::array({0, 1})})}, {"replaced", json::array()}});
  EXPECT_EQ(failover.StatusOf(0), json::parse(R"({"state":"lost","served_by":1})"));
  EXPECT_EQ(failover.StatusOf(1), json::parse(R"({"state":"serving","serves_for":[0]})"));
  EXPECT_EQ(failover.StatusOf(2), json::parse(R"({"state":"lost","served_by":-1})"));
  EXPECT_EQ(failover.StatusOf(3), json::parse(R"({"state":"unknown"})"));  // not a server
  EXPECT_EQ(failover.StatusOf(-1), json::parse(R"({"state":"unknown"})"));
}

}  // namespace
}  // namespace ps
