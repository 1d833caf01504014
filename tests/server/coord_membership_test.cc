// Membership: ids, registration limits, all-reduce groups, heartbeat expiry with a clock
// the test drives, and who evaluates.
#include "server/coord_membership.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Member M(const std::string& peer, int requested = -1, const std::string& device = "cpu: 2 threads",
         const std::string& host = "h1") {
  Member m;
  m.peer = peer;
  m.endpoint = "tcp://127.0.0.1:9000";
  m.device = device;
  m.host = host;
  m.pid = 100;
  m.requested_id = requested;
  return m;
}

MembershipOptions Options(int servers, int workers) {
  MembershipOptions o;
  o.num_servers = servers;
  o.num_workers = workers;
  o.heartbeat_timeout = seconds(4);
  o.group_endpoint_prefix = "ipc:///tmp/test-group-";
  return o;
}

TEST(CoordMembership, RequestedIdsFirstThenArrivalOrder) {
  std::vector<Member> members = {M("a"), M("b", 0), M("c", 7), M("d", 0)};
  AssignIds(members);
  ASSERT_EQ(members.size(), 4u);
  EXPECT_EQ(members[0].peer, "b");  // asked for 0
  EXPECT_EQ(members[1].peer, "a");  // the rest in arrival order
  EXPECT_EQ(members[2].peer, "c");  // 7 is out of range
  EXPECT_EQ(members[3].peer, "d");  // 0 was taken
}

TEST(CoordMembership, RefusesWhenFullAndBadEndpoints) {
  Membership m(Options(1, 1));
  Member bad = M("s0");
  bad.endpoint = "not an endpoint";
  EXPECT_FALSE(m.AddServer(bad).ok());
  EXPECT_TRUE(m.AddServer(M("s0")).ok());
  Status full = m.AddServer(M("s1"));
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(full.message().find("--num_servers"), std::string::npos);
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.AddWorker(M("w0")).ok());
  EXPECT_TRUE(m.complete());
  EXPECT_EQ(m.AddWorker(M("w1")).code(), StatusCode::kFailedPrecondition);
}

TEST(CoordMembership, GroupsBySizeAndRefusesMixedDevices) {
  MembershipOptions o = Options(1, 4);
  o.group_size = 2;
  Membership m(o);
  ASSERT_TRUE(m.AddServer(M("s0")).ok());
  for (const char* p : {"w0", "w1", "w2", "w3"}) ASSERT_TRUE(m.AddWorker(M(p)).ok());
  Result<std::vector<GroupPlan>> groups = m.Assemble(CoordClock::now());
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0].ids, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ((*groups)[1].ids, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ((*groups)[1].endpoint, "ipc:///tmp/test-group-1");
  EXPECT_EQ(m.workers()[3].group_formed, "size2-1");
  EXPECT_TRUE(m.assembled());

  Membership mixed(Options(1, 2));
  ASSERT_TRUE(mixed.AddServer(M("s0")).ok());
  Member gpu = M("w1", -1, "NVIDIA H200 (cuda:0)");
  gpu.group = "g";
  Member cpu = M("w0");
  cpu.group = "g";
  ASSERT_TRUE(mixed.AddWorker(cpu).ok());
  ASSERT_TRUE(mixed.AddWorker(gpu).ok());
  Result<std::vector<GroupPlan>> refused = mixed.Assemble(CoordClock::now());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("mixes devices"), std::string::npos);
}

TEST(CoordMembership, HeartbeatExpiryWithAnInjectedClock) {
  Membership m(Options(2, 2));
  for (const char* p : {"s0", "s1"}) ASSERT_TRUE(m.AddServer(M(p)).ok());
  for (const char* p : {"w0", "w1"}) ASSERT_TRUE(m.AddWorker(M(p)).ok());
  const CoordClock::time_point t0 = CoordClock::now();
  ASSERT_TRUE(m.Assemble(t0).ok());
  EXPECT_TRUE(m.SilentWorkers(t0 + seconds(4)).empty());  // at the timeout, not past it
  EXPECT_FALSE(m.OnAlive(false, 1, 100, t0 + seconds(3)));
  m.Touch(0, t0 + milliseconds(500));
  EXPECT_FALSE(m.OnAlive(true, 1, 100, t0 + seconds(3)));
  // Past 4.5 s worker 0 is silent; worker 1 beat at 3 s.
  EXPECT_EQ(m.SilentWorkers(t0 + milliseconds(4600)), (std::vector<int>{0}));
  EXPECT_EQ(m.SilentWorkers(t0 + seconds(8)), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.SilentWorkers(t0 + seconds(8), 1), (std::vector<int>{1}));
  // Servers: reported once each.
  EXPECT_EQ(m.TakeSilentServers(t0 + seconds(5)), (std::vector<int>{0}));
  EXPECT_TRUE(m.TakeSilentServers(t0 + seconds(6)).empty());
  EXPECT_EQ(m.TakeSilentServers(t0 + seconds(8)), (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(m.SilentSeconds(m.servers()[1], t0 + seconds(8)), 5.0);
}

TEST(CoordMembership, TheCoordinatorsOwnStallIsNobodysSilence) {
  Membership m(Options(1, 2));
  ASSERT_TRUE(m.AddServer(M("s0")).ok());
  for (const char* p : {"w0", "w1"}) ASSERT_TRUE(m.AddWorker(M(p)).ok());
  const CoordClock::time_point t0 = CoordClock::now();
  ASSERT_TRUE(m.Assemble(t0).ok());
  m.Touch(1, t0 + seconds(2));
  // The coordinator waited 10 s on something at t0 + 3 s: the beats of then were not read.
  m.ForgiveStall(seconds(10));
  EXPECT_TRUE(m.SilentWorkers(t0 + seconds(13)).empty());
  EXPECT_TRUE(m.TakeSilentServers(t0 + seconds(13)).empty());
  // Silence after the stall counts as before: worker 0 last beat at t0 (+10 s forgiven).
  EXPECT_EQ(m.SilentWorkers(t0 + seconds(15)), (std::vector<int>{0}));
  EXPECT_EQ(m.TakeSilentServers(t0 + seconds(15)), (std::vector<int>{0}));
  EXPECT_EQ(m.SilentWorkers(t0 + seconds(17)), (std::vector<int>{0, 1}));
}

TEST(CoordMembership, GoneWorkersAreEvictedAndTheEvaluatorMoves) {
  Membership m(Options(1, 3));
  ASSERT_TRUE(m.AddServer(M("s0")).ok());
  for (const char* p : {"w0", "w1", "w2"}) ASSERT_TRUE(m.AddWorker(M(p)).ok());
  const CoordClock::time_point t0 = CoordClock::now();
  ASSERT_TRUE(m.Assemble(t0).ok());
  EXPECT_EQ(m.Evaluator(), 0);
  m.workers()[0].dead = true;
  m.workers()[1].left = true;
  EXPECT_EQ(m.Evaluator(), 2);
  EXPECT_TRUE(m.OnAlive(false, 0, 100, t0 + seconds(1)));          // dead: evicted
  EXPECT_FALSE(m.OnAlive(false, 2, 100, t0 + seconds(1)));         // live
  EXPECT_FALSE(m.OnAlive(false, 9, 100, t0));                      // unknown id: not evicted
  EXPECT_TRUE(m.SilentWorkers(t0 + seconds(60), -1).size() == 1);  // gone ones never
  EXPECT_EQ(m.Live(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(m.WorkerIndex("w2"), 2);
  EXPECT_EQ(m.ServerIndex("w2"), -1);
  // A server woken after another process (another pid) took its id is evicted.
  EXPECT_TRUE(m.OnAlive(true, 0, 555, t0));
  EXPECT_FALSE(m.OnAlive(true, 0, 100, t0));
}

TEST(CoordMembership, BarrierWaitsForEveryLiveWorkerAndJoinsGetTheNextId) {
  Membership m(Options(1, 2));
  ASSERT_TRUE(m.AddServer(M("s0")).ok());
  for (const char* p : {"w0", "w1"}) ASSERT_TRUE(m.AddWorker(M(p)).ok());
  const CoordClock::time_point t0 = CoordClock::now();
  ASSERT_TRUE(m.Assemble(t0).ok());
  EXPECT_FALSE(m.AllLiveDone());
  m.workers()[0].result.done = true;
  EXPECT_FALSE(m.AllLiveDone());
  EXPECT_EQ(m.Training(), (std::vector<bool>{false, true}));
  m.workers()[1].dead = true;  // the last one training is gone
  EXPECT_TRUE(m.AllLiveDone());
  EXPECT_EQ(m.Join(M("w2"), t0 + seconds(10)), 2u);
  EXPECT_TRUE(m.workers()[2].joined);
  EXPECT_FALSE(m.AllLiveDone());                              // the new one trains
  EXPECT_TRUE(m.SilentWorkers(t0 + seconds(13), 2).empty());  // it beat at 10 s
  m.workers()[0].dead = true;
  m.workers()[2].left = true;
  EXPECT_FALSE(m.AllLiveDone());  // nobody left: wait for a worker to join
}

}  // namespace
}  // namespace ps
