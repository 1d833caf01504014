// What a server tells ps_status and Prometheus: its held pulls and whom they wait on, its
// rows and shards (ServerStatusJson), and its counters as metrics (ServerMetrics).
#include <gtest/gtest.h>

#include "server/server_metrics.h"
#include "server/server_node.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ClockTick;
using testing::RangePull;
using testing::VersionedPush;

std::unique_ptr<ServerCore> MakeCore() {
  std::map<std::string, std::string> flags = {{"model", "none"},
                                              {"tables", "a:4:2:zeros,b:4:2:zeros"},
                                              {"num_servers", "1"},
                                              {"num_workers", "3"},
                                              {"staleness", "0"}};
  return ServerCore::Create(JobConfig::FromFlagMap(flags).value(), 0).value();
}

std::vector<Outgoing> Send(ServerCore& core, const std::string& peer, Frames f) {
  std::vector<Outgoing> out;
  ServerCore::After after;
  core.Handle(peer, f, &out, &after);
  return out;
}

TEST(ServerStatusTest, AHeldPullNamesTheSlowestWorker) {
  auto core = MakeCore();
  // Workers 0 and 1 finish clock 1; worker 2 has not: worker 0's pull at clock 1 waits on it.
  ASSERT_EQ(Send(*core, "w0", ClockTick(1, 0, 1)).size(), 1u);
  ASSERT_EQ(Send(*core, "w1", ClockTick(2, 1, 1)).size(), 1u);
  EXPECT_TRUE(Send(*core, "w0", RangePull(3, 0, 0, 4, 0, 1)).empty());
  const auto now = ServerCore::Clock::now();
  std::vector<ServerCore::HeldPullInfo> held = core->HeldPulls(now);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].worker, 0);
  EXPECT_EQ(held[0].waits_on, 2);
  EXPECT_GE(held[0].seconds, 0.0);

  nlohmann::json st = ServerStatusJson(*core, now);
  EXPECT_EQ(st["kind"], "server");
  EXPECT_EQ(st["queue_depth"], 1);
  EXPECT_EQ(st["shards"], 2);  // both tables have rows here
  EXPECT_EQ(st["rows"], 8);
  ASSERT_EQ(st["held"].size(), 1u);
  EXPECT_EQ(st["held"][0]["waits_on"], 2);

  // Worker 2 catches up: nothing is held, nobody waits.
  Send(*core, "w2", ClockTick(4, 2, 1));
  EXPECT_TRUE(core->HeldPulls(ServerCore::Clock::now()).empty());
}

TEST(ServerStatusTest, MetricsFollowTheCoreCounters) {
  auto core = MakeCore();
  auto metrics = Metrics::Start({});
  ASSERT_TRUE(metrics.ok());
  ServerMetrics sm(metrics->get());
  std::vector<float> grad(8, 1.0f);
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ(Send(*core, "w0", VersionedPush(10 + i, 0, 0, 4, grad, 0, 0, 0)).size(), 1u);
  }
  sm.Update(*core);
  sm.Update(*core);  // deltas: a second update adds nothing
  const std::string text = (*metrics)->Serialize();
  EXPECT_NE(text.find("ps_pushes_total 3"), std::string::npos) << text;
  EXPECT_NE(text.find("ps_rows 8"), std::string::npos) << text;
  // Staleness 0, 1, 2 (each push after the others, all computed from version 0).
  EXPECT_NE(text.find("ps_gradient_staleness_count 3"), std::string::npos) << text;
  EXPECT_NE(text.find("ps_gradient_staleness_sum 3"), std::string::npos) << text;
}

}  // namespace
}  // namespace ps
