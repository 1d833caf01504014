// KVClient and ServerCore in process behind a fault-injecting transport (seeded drops,
// duplicates, delays and reorders of requests and replies): client retries and the
// servers' request-id table make every push count exactly once, so the model is exact.
#include "common/fault_injection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "server/server_core.h"
#include "server/server_node.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

// 10% of requests and replies dropped, 10% duplicated, 20% of requests delayed.
FaultOptions HeavyFaults() {
  FaultOptions f;
  f.seed = 424242;
  f.drop_request = 0.1;
  f.duplicate_request = 0.1;
  f.delay_request = 0.2;
  f.drop_reply = 0.1;
  f.duplicate_reply = 0.1;
  return f;
}

TEST(FaultInjectionTest, EveryPushCountsOnceDespiteDropsDuplicatesAndReorders) {
  Transport transport;
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "d:64:4:zeros"},
                                             {"num_servers", "2"},
                                             {"num_workers", "1"},
                                             {"staleness", "-1"},
                                             {"base_lr", "1"}})
                         .value();
  FaultOptions faults = HeavyFaults();
  faults.seed = 20261203;
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
      (void)ServeUntilShutdown(*sockets[s], *cores[s], stop,
                               {.poll_interval = std::chrono::milliseconds(10)});
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

// Servers behind fault-injecting sockets (or plain ones: `faults` null), served on threads
// until destroyed.
class FaultyCluster {
 public:
  FaultyCluster(Transport* transport, const JobConfig& config, const FaultOptions* faults,
                const std::string& name) {
    for (int s = 0; s < config.num_servers; ++s) {
      cores_.push_back(ServerCore::Create(config, s).value());
      auto inner = transport->Listen("inproc://" + name + std::to_string(s)).value();
      if (faults != nullptr) {
        FaultOptions f = *faults;
        f.seed += static_cast<uint64_t>(s);
        auto faulty = std::make_unique<FaultyServerSocket>(std::move(inner), f);
        faulty_.push_back(faulty.get());
        sockets_.push_back(std::move(faulty));
      } else {
        sockets_.push_back(std::move(inner));
      }
      endpoints_.push_back(sockets_.back()->BoundEndpoint());
    }
    for (size_t s = 0; s < cores_.size(); ++s) {
      threads_.emplace_back([this, s] {
        (void)ServeUntilShutdown(*sockets_[s], *cores_[s], stop_,
                                 {.poll_interval = std::chrono::milliseconds(10)});
      });
    }
  }
  ~FaultyCluster() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  uint64_t faults_injected() const {
    uint64_t n = 0;
    for (const FaultyServerSocket* f : faulty_) {
      const FaultStats& x = f->stats();
      n += x.dropped_requests + x.duplicated_requests + x.delayed_requests + x.dropped_replies +
           x.duplicated_replies;
    }
    return n;
  }

 private:
  std::vector<std::unique_ptr<ServerCore>> cores_;
  std::vector<std::unique_ptr<ServerSocket>> sockets_;
  std::vector<FaultyServerSocket*> faulty_;
  std::vector<std::string> endpoints_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

constexpr uint32_t kRows = 16, kWidth = 4;  // 64 weights of a linear regression

// Linear regression trained through the parameter server: each step pulls the weights,
// computes the mean squared error's gradient on the step's batch (the batch is chosen
// from `worker` and the step, so it is the same in every run), pushes it and ticks the
// clock. Returns the loss of the first and of the last batch, each before its update.
struct Losses {
  double first = 0, last = 0;
};
Result<Losses> TrainLinearRegression(KVClient& client, int worker, int steps) {
  constexpr int kFeatures = kRows * kWidth, kBatch = 8;
  std::vector<float> w(kFeatures), grad(kFeatures);
  double loss = 0;
  Losses losses;
  for (int step = 0; step < steps; ++step) {
    PS_RETURN_IF_ERROR(client.Wait(client.PullRange(0, RowRange{0, kRows}, w)));
    std::mt19937 rng(static_cast<uint32_t>(1000 * worker + step));
    std::uniform_real_distribution<float> x01(-1.0f, 1.0f);
    std::fill(grad.begin(), grad.end(), 0.0f);
    loss = 0;
    for (int b = 0; b < kBatch; ++b) {
      std::vector<float> x(kFeatures);
      float y = 0, pred = 0;
      for (int j = 0; j < kFeatures; ++j) {
        x[j] = x01(rng);
        y += x[j] * (static_cast<float>(j % 7) - 3.0f);  // the true weights
        pred += x[j] * w[j];
      }
      const float err = pred - y;
      loss += 0.5 * err * err / kBatch;
      for (int j = 0; j < kFeatures; ++j) grad[j] += err * x[j] / kBatch;
    }
    PS_RETURN_IF_ERROR(client.Wait(client.PushRange(0, RowRange{0, kRows}, grad)));
    PS_RETURN_IF_ERROR(client.Wait(client.Clock()));
    if (step == 0) losses.first = loss;
  }
  losses.last = loss;
  return losses;
}

JobConfig RegressionJob(int workers, int staleness) {
  return JobConfig::FromFlagMap(
             {{"model", "none"},
              {"tables", "w:" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ":zeros"},
              {"num_servers", "2"},
              {"num_workers", std::to_string(workers)},
              {"staleness", std::to_string(staleness)},
              {"base_lr", "0.05"}})
      .value();
}

// BSP with one worker is deterministic: the run through dropped, duplicated and reordered
// messages ends with the very weights of the run without faults.
TEST(FaultInjectionTest, BspTrainingEndsBitForBitAsWithoutFaults) {
  const JobConfig config = RegressionJob(1, 0);
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(60);
  o.retry_interval = std::chrono::milliseconds(50);
  auto train = [&](const FaultOptions* faults, const std::string& name, uint64_t* injected) {
    Transport transport;
    FaultyCluster cluster(&transport, config, faults, name);
    auto client = KVClient::Create(&transport, config, cluster.endpoints(), o).value();
    Result<Losses> loss = TrainLinearRegression(*client, 0, 60);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    std::vector<float> w(kRows * kWidth);
    EXPECT_TRUE(client->Wait(client->PullRange(0, RowRange{0, kRows}, w)).ok());
    if (injected != nullptr) *injected = cluster.faults_injected();
    return std::make_pair(w, loss.ok() ? *loss : Losses{});
  };
  const auto [clean, clean_loss] = train(nullptr, "bsp_clean_", nullptr);
  const FaultOptions faults = HeavyFaults();
  uint64_t injected = 0;
  const auto [faulty, faulty_loss] = train(&faults, "bsp_faulty_", &injected);
  EXPECT_GT(injected, 20u) << "the faults did happen";
  EXPECT_LT(clean_loss.last, clean_loss.first / 5) << "the model trained";
  EXPECT_EQ(faulty, clean) << "bit for bit";
  EXPECT_EQ(faulty_loss.last, clean_loss.last);
}

// SSP (staleness 2) with two workers through the same faults: both finish every step and
// the model still learns (not bit-exact: the interleaving of two workers varies).
TEST(FaultInjectionTest, SspTrainingWithTwoWorkersCompletes) {
  const JobConfig config = RegressionJob(2, 2);
  const FaultOptions faults = HeavyFaults();
  Transport transport;
  FaultyCluster cluster(&transport, config, &faults, "ssp_faulty_");
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(60);
  o.retry_interval = std::chrono::milliseconds(50);
  std::vector<Result<Losses>> losses(2, Result<Losses>(Internal("not run")));
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      KVClientOptions mine = o;
      mine.client_id = w;
      auto client = KVClient::Create(&transport, config, cluster.endpoints(), mine).value();
      losses[static_cast<size_t>(w)] = TrainLinearRegression(*client, w, 60);
    });
  }
  for (auto& t : workers) t.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(losses[w].ok()) << "worker " << w << ": " << losses[w].status().ToString();
    EXPECT_LT(losses[w]->last, losses[w]->first / 5) << "worker " << w << " trained";
  }
  EXPECT_GT(cluster.faults_injected(), 20u);
}

}  // namespace
}  // namespace ps
