// KVClient's clock messages (Clock, Leave, Rejoin) against real servers, and which calls
// on_request_done reports.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

#include "tests/worker/in_process_cluster.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

JobConfig TwoWorkersTwoServers() {
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:10:2:zeros"},
                                 {"num_servers", "2"},
                                 {"num_workers", "2"}})
      .value();
}

std::unique_ptr<KVClient> NewClient(Transport* transport, const JobConfig& config,
                                    const testing::InProcessCluster& cluster, int id,
                                    KVClientOptions o = {}) {
  o.client_id = id;
  o.request_timeout = std::chrono::seconds(20);
  return KVClient::Create(transport, config, cluster.endpoints(), o).value();
}

TEST(KVClientClockTest, RejoinAfterLeaveAdoptsTheSlowestLiveClockAndNotBefore) {
  Transport transport;
  const JobConfig config = TwoWorkersTwoServers();
  testing::InProcessCluster cluster(&transport, config);
  auto fast = NewClient(&transport, config, cluster, 0);
  auto slow = NewClient(&transport, config, cluster, 1);
  ASSERT_TRUE(slow->Wait(slow->Clock()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(fast->Wait(fast->Clock()).ok());
  EXPECT_EQ(fast->clock(), 3);
  EXPECT_EQ(slow->clock(), 1);
  // Still in the clock table: the slowest live clock is its own, so a rejoin moves nothing.
  ASSERT_TRUE(slow->Wait(slow->Rejoin()).ok());
  EXPECT_EQ(slow->clock(), 1);
  // Out of the table, then back: it starts at the slowest live worker's clock, on every
  // server, so that a pull at its next clock is served without waiting on clocks it skipped.
  ASSERT_TRUE(slow->Wait(slow->Leave()).ok());
  ASSERT_TRUE(slow->Wait(slow->Rejoin()).ok());
  EXPECT_EQ(slow->clock(), 3);
  ASSERT_TRUE(slow->Wait(slow->Clock()).ok());
  EXPECT_EQ(slow->clock(), 4);
  std::vector<float> rows(10 * 2);
  EXPECT_TRUE(slow->Wait(slow->PullRange(0, RowRange{0, 10}, rows)).ok());
}

TEST(KVClientClockTest, OnRequestDoneReportsPushesAndPullsOnly) {
  Transport transport;
  const JobConfig config = TwoWorkersTwoServers();
  testing::InProcessCluster cluster(&transport, config);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<bool, bool>> done;  // (push, ok)
  KVClientOptions o;
  o.on_request_done = [&](bool push, double seconds, bool ok) {
    EXPECT_GE(seconds, 0.0);
    std::lock_guard<std::mutex> lock(mu);
    done.emplace_back(push, ok);
    cv.notify_all();
  };
  auto client = NewClient(&transport, config, cluster, 0, o);
  std::vector<float> grads(4, 1.0f), rows(4);
  // Clock ticks and calls refused before sending are not reported.
  ASSERT_TRUE(client->Wait(client->Clock()).ok());
  EXPECT_EQ(client->Wait(client->PushRange(7, RowRange{0, 2}, grads)).code(),
            StatusCode::kNotFound);
  ASSERT_TRUE(client->Wait(client->PushRange(0, RowRange{4, 6}, grads)).ok());
  ASSERT_TRUE(client->Wait(client->Pull(0, std::vector<uint64_t>{1, 8}, rows)).ok());
  // Reported on the I/O thread, in completion order, possibly after Wait returned.
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return done.size() >= 2; }));
  EXPECT_EQ(done, (std::vector<std::pair<bool, bool>>{{true, true}, {false, true}}));
}

}  // namespace
}  // namespace ps
