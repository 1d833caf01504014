// --model=network through scripts/launch_local.sh: the CNN config learns on Fashion-MNIST
// with two workers, and a bad network is refused by the coordinator before anything starts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

std::string CnnConfig() { return itest::SourceDir() + "/configs/fashion_mnist_cnn.flags"; }

TEST(NetworkJobTest, TheCnnLearnsFashionMnistInOneEpochWithTwoWorkers) {
  if (access(kTrainImages, R_OK) != 0) GTEST_SKIP() << kTrainImages << " is not here";
  itest::TempDir dir("ps_network_job_test_");
  // One epoch with a cosine schedule over that epoch; a few minutes on two loaded cores.
  auto r = itest::RunLaunchLocal(
      {CnnConfig(), "--servers", "2", "--workers", "2", "--", "--epochs=1", "--max_iter=938"},
      dir.Join("run"), dir.Join("launch.log"), std::chrono::seconds(420));
  ASSERT_NO_FATAL_FAILURE(itest::ExpectFinishedOk(r));
  const json& summary = r->summary;
  // One epoch of this CNN reaches about 0.85 (the first epoch of the full job did); a
  // network that does not learn stays near 0.10.
  EXPECT_GE(summary.value("test_accuracy", 0.0), 0.83) << summary.dump();
  std::cout << "one epoch: test_accuracy " << summary.value("test_accuracy", 0.0) << ", "
            << summary.value("examples_per_sec", 0.0) << " examples/s\n";
  EXPECT_EQ(summary["examples_per_epoch"], json::array({60000})) << summary.dump();
  EXPECT_EQ(summary.value("pushes_rejected", uint64_t{1}), 0u) << summary.dump();
}

// Each bad network is refused by ps_coordinator with a message naming the layer: the launch
// fails, no server or worker is started, and no training report is ever written.
TEST(NetworkJobTest, ABadNetworkIsRefusedAtStartAndNothingTrains) {
  struct Case {
    const char* network;
    const char* message;
  };
  const Case cases[] = {
      {"input:1x28x28,conv2d:8:3,pool:2,flatten,dense:10,softmax_ce",
       "layer 2 (pool 'pool:2'): unknown layer kind 'pool'"},
      {"input:1x28x28,conv2d:8:3,dense:10,softmax_ce",
       "layer 2 (dense 'dense:10'): the input 8x26x26 is not flat"},
      {"input:1x28x28,conv2d:8,flatten,dense:10,softmax_ce",
       "layer 1 (conv2d 'conv2d:8'): missing field KERNEL"},
  };
  for (const Case& c : cases) {
    itest::TempDir dir("ps_network_job_test_");
    const std::string run_dir = dir.Join("run");
    auto r = itest::RunLaunchLocal(
        {CnnConfig(), "--workers", "2", "--", std::string("--network=") + c.network}, run_dir,
        dir.Join("launch.log"), std::chrono::seconds(60));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    itest::ExpectRefusedBeforeAnythingStarted(*r, run_dir, c.network, c.message);
  }
}

}  // namespace
}  // namespace ps
