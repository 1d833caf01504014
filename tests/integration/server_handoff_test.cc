// SIGTERM on a server with --replicas=2 (a preemption notice): the server hands its shards
// to its backup before it exits (server/server_node.cc, HandOffShards), with nothing rolled
// back and no request failing. Real ps_coordinator, ps_server and ps_worker processes on
// 127.0.0.1 training a small MLP on Fashion-MNIST (skipped without the data).
//
// One worker under BSP, as in coordinator_restart_test: the training is the same
// computation whichever copy serves the shards, so a hand-off that loses no acknowledged
// push and applies none twice ends with the unfaulted run's model and test accuracy
// (tolerance 0.002: 20 of the 10,000 test images, for the float order of apply threads).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;
using itest::SteadyClock;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
constexpr std::chrono::seconds kJobTimeout{150};
constexpr int64_t kTermAtClock = 250;  // of about 940 in the epoch
constexpr double kAccuracyTolerance = 0.002;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t LatestClock(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  int64_t clock = -1;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "train") {
      clock = std::max(clock, j.value("clock", int64_t{-1}));
    }
  }
  return clock;
}

class ServerHandoffTest : public itest::JobTest {
 protected:
  // A whole job in `run_dir` (2 servers backing up each other, 1 worker); with `term`,
  // server 0 gets SIGTERM once the worker reported kTermAtClock. Returns summary.json.
  json RunJob(const std::string& run_dir, bool term) {
    const itest::Deadline deadline = itest::DeadlineIn(kJobTimeout);
    std::vector<std::string> flags = {"--num_servers=2",
                                      "--num_workers=1",
                                      "--epochs=1",
                                      "--mlp_layers=784,32,10",
                                      "--staleness=0",
                                      "--replicas=2",
                                      "--base_lr=0.1",
                                      "--report_every_seconds=0.2",
                                      "--heartbeat_timeout=2",
                                      "--run_dir=" + run_dir};
    std::string endpoint;
    Result<itest::ChildProcess> coordinator = StartCoordinator(flags, deadline, &endpoint);
    EXPECT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    if (!coordinator.ok()) return json();
    std::vector<itest::ChildProcess> servers;
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = StartServer(s, endpoint, {"--id=" + std::to_string(s)});
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return json();
      servers.push_back(std::move(p).value());
    }
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--register_timeout_ms=30000", "--id=0"};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    Result<itest::ChildProcess> w = itest::ChildProcess::Spawn(argv, dir_.Join("worker-0.log"));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return json();
    if (term) {
      while (LatestClock(run_dir) < kTermAtClock && SteadyClock::now() < deadline &&
             !coordinator->TryReap()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      EXPECT_GE(LatestClock(run_dir), kTermAtClock) << "the job did not reach the clock";
      termed_at_ = UnixNow();
      EXPECT_EQ(kill(servers[0].pid(), SIGTERM), 0);
      // 128 + SIGTERM: it handed its shards over (a launcher starts it again).
      Result<int> rc = servers[0].WaitExit(deadline);
      EXPECT_TRUE(rc.ok()) << rc.status().ToString();
      if (rc.ok()) {
        EXPECT_EQ(*rc, 128 + SIGTERM) << "server 0 after SIGTERM";
      }
      exited_after_ = UnixNow() - termed_at_;
    }
    ExpectCleanExit(*coordinator, "coordinator", deadline);
    ExpectCleanExit(*w, "worker", deadline);
    for (size_t s = term ? 1 : 0; s < servers.size(); ++s) {
      ExpectCleanExit(servers[s], "server " + std::to_string(s), deadline);
    }
    Result<std::string> text = itest::ReadFile(run_dir + "/summary.json");
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    return text.ok() ? json::parse(*text, nullptr, false) : json();
  }

  double termed_at_ = 0, exited_after_ = 0;
};

TEST_F(ServerHandoffTest, ASigtermedServerHandsItsShardsToItsBackupWithNothingLost) {
  if (access(kTrainImages, R_OK) != 0) GTEST_SKIP() << kTrainImages << " is not here";
  const auto start = SteadyClock::now();
  const json clean = RunJob(dir_.Join("clean"), false);
  ASSERT_TRUE(clean.is_object());
  ASSERT_EQ(clean.value("status", ""), "ok") << clean.dump();

  const json handed = RunJob(dir_.Join("handed"), true);
  ASSERT_TRUE(handed.is_object());
  EXPECT_EQ(handed.value("status", ""), "ok") << handed.dump();
  json left;
  for (const json& e : handed.value("failures", json::array())) {
    if (e.value("kind", "") == "server_left" && e.value("server", -1) == 0) left = e;
  }
  ASSERT_TRUE(left.is_object()) << "the hand-off is not listed: " << handed.dump();
  EXPECT_EQ(left.value("promoted", -1), 1) << left.dump();
  // Nothing rolled back, no push given up on, every example once.
  EXPECT_EQ(handed.value("pushes_lost", uint64_t{1}), 0u) << handed.dump();
  EXPECT_EQ(handed.value("pushes_rolled_back", uint64_t{1}), 0u) << handed.dump();
  EXPECT_EQ(handed["examples_per_epoch"], json(std::vector<uint64_t>{60000})) << handed.dump();
  ASSERT_EQ(handed["workers"].size(), 1u);
  EXPECT_EQ(handed["workers"][0].value("state", ""), "finished") << handed.dump();
  EXPECT_FALSE(handed["workers"][0].value("failed", true)) << handed.dump();
  EXPECT_EQ(handed["workers"][0].value("pushes_lost", uint64_t{1}), 0u) << handed.dump();
  const double clean_accuracy = clean.value("test_accuracy", 0.0);
  const double accuracy = handed.value("test_accuracy", 0.0);
  EXPECT_GT(clean_accuracy, 0.6) << "the model trained";
  EXPECT_NEAR(accuracy, clean_accuracy, kAccuracyTolerance);
  // The server waits only for its backup's acknowledgements and the promotion.
  EXPECT_LT(exited_after_, 5.0);
  std::printf(
      "server 0 SIGTERM'd at clock >= %lld: exited %.2f s later, backup promoted %.2f s after "
      "the signal; test accuracy %.4f (unfaulted %.4f); test %.1f s\n",
      static_cast<long long>(kTermAtClock), exited_after_,
      left.value("promoted_unix_time", 0.0) - termed_at_, accuracy, clean_accuracy,
      std::chrono::duration<double>(SteadyClock::now() - start).count());
}

}  // namespace
}  // namespace ps
