// KVClient and ServerCore in process behind a fault-injecting transport (seeded drops,
// duplicates, delays and reorders of requests and replies): client retries and the
// servers' request-id table make every push count exactly once, so the model is exact.
#include "common/fault_injection.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "server/server_core.h"
#include "server/server_node.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

TEST(FaultInjectionTest, EveryPushCountsOnceDespiteDropsDuplicatesAndReorders) {
  Transport transport;
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "d:64:4:zeros"},
                                             {"num_servers", "2"},
                                             {"num_workers", "1"},
                                             {"staleness", "-1"},
                                             {"base_lr", "1"}})
                         .value();
  FaultOptions faults;
  faults.seed = 20261203;
  faults.drop_request = 0.1;
  faults.duplicate_request = 0.1;
  faults.delay_request = 0.2;
  faults.drop_reply = 0.1;
  faults.duplicate_reply = 0.1;
  std::vector<std::unique_ptr<ServerCore>> cores;
  std::vector<std::unique_ptr<FaultyServerSocket>> sockets;
  std::vector<std::string> endpoints;
  for (int s = 0; s < 2; ++s) {
    cores.push_back(ServerCore::Create(config, s).value());
    auto inner = transport.Listen("inproc://fault_injection_test_" + std::to_string(s)).value();
    faults.seed += 1;
    sockets.push_back(std::make_unique<FaultyServerSocket>(std::move(inner), faults));
    endpoints.push_back(sockets.back()->BoundEndpoint());
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      (void)ServeUntilShutdown(*sockets[s], *cores[s], stop, std::chrono::milliseconds(10));
    });
  }
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(60);
  o.retry_interval = std::chrono::milliseconds(50);
  auto client = KVClient::Create(&transport, config, endpoints, o).value();

  // Small integer gradients: float sums are exact in any order.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-3, 3);
  std::vector<float> expected(64 * 4, 0.0f);
  const int kPushes = 200;
  std::vector<Ticket> in_flight;
  for (int i = 0; i < kPushes; ++i) {
    std::vector<float> grad(64 * 4);
    for (size_t j = 0; j < grad.size(); ++j) {
      grad[j] = static_cast<float>(value(rng));
      expected[j] -= grad[j];  // SGD at lr 1
    }
    in_flight.push_back(client->PushRange(0, RowRange{0, 64}, grad));
    if (in_flight.size() == 8) {
      for (Ticket t : in_flight) ASSERT_TRUE(client->Wait(t).ok());
      in_flight.clear();
    }
  }
  for (Ticket t : in_flight) ASSERT_TRUE(client->Wait(t).ok());
  std::vector<float> model(64 * 4, -1.0f);
  ASSERT_TRUE(client->Wait(client->PullRange(0, RowRange{0, 64}, model)).ok());
  stop = true;
  for (auto& t : threads) t.join();

  EXPECT_EQ(model, expected) << "every push applied exactly once";
  uint64_t applied = 0, duplicate = 0;
  FaultStats f;
  for (int s = 0; s < 2; ++s) {
    applied += cores[s]->stats().pushes_applied;
    duplicate += cores[s]->stats().pushes_duplicate;
    const FaultStats& x = sockets[s]->stats();
    f.dropped_requests += x.dropped_requests;
    f.duplicated_requests += x.duplicated_requests;
    f.delayed_requests += x.delayed_requests;
    f.dropped_replies += x.dropped_replies;
    f.duplicated_replies += x.duplicated_replies;
  }
  EXPECT_EQ(applied, 2u * kPushes) << "one part per server per push";
  EXPECT_GT(duplicate, 0u);
  EXPECT_GT(client->stats().retries, 0u);
  // The faults did happen.
  EXPECT_GT(f.dropped_requests, 0u);
  EXPECT_GT(f.duplicated_requests, 0u);
  EXPECT_GT(f.delayed_requests, 0u);
  EXPECT_GT(f.dropped_replies, 0u);
  EXPECT_GT(f.duplicated_replies, 0u);
}

}  // namespace
}  // namespace ps
