// A short real-data test: scripts/launch_local.sh runs one epoch of the default job
// (configs/fashion_mnist_mlp.flags) with 2 servers and 2 workers, and the run directory
// must show a model that learned, every example seen once, and no process left behind.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/process.h"

namespace ps {
namespace {

using itest::ChildProcess;
using nlohmann::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
// The epoch takes well under a minute on two cores; the margin is for slow CI machines.
constexpr std::chrono::seconds kJobTimeout{240};

// The job's processes still alive: those of the script's process group, and any whose
// command line names the run directory or the coordinator's endpoint (the servers and
// workers carry only the endpoint). Zombies have exited and do not count.
std::vector<itest::ProcessInfo> LeftoverProcesses(pid_t group, const std::string& run_dir,
                                                  const std::string& endpoint) {
  std::vector<itest::ProcessInfo> out;
  for (const itest::ProcessInfo& p : itest::ScanProcesses()) {
    if (p.state == 'Z' || p.comm.rfind("ps_", 0) != 0) continue;
    bool ours = p.pgid == group || p.cmdline.find(run_dir) != std::string::npos ||
                (!endpoint.empty() && p.cmdline.find(endpoint) != std::string::npos);
    if (ours) out.push_back(p);
  }
  return out;
}

std::string Describe(const std::vector<itest::ProcessInfo>& ps) {
  std::ostringstream s;
  for (const itest::ProcessInfo& p : ps) s << "  pid " << p.pid << " " << p.cmdline << "\n";
  return s.str();
}

TEST(FashionMnistTest, OneEpochReachesEightyPercentAndCleansUp) {
  if (access(kTrainImages, R_OK) != 0) {
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh fetches it)";
  }
  itest::TempDir dir("ps_fashion_mnist_test_");
  const std::string run_dir = dir.Join("run");
  const std::string source = itest::SourceDir();
  // launch_local.sh finds the binaries through PS_BIN_DIR, which ctest sets; set it for a
  // direct run too, so the script never looks for a build of its own.
  const std::string bin_dir =
      std::filesystem::path(itest::BinaryPath("ps_coordinator")).parent_path().string();
  setenv("PS_BIN_DIR", bin_dir.c_str(), /*overwrite=*/0);

  Result<ChildProcess> job = ChildProcess::Spawn(
      {"/bin/bash", source + "/scripts/launch_local.sh",
       source + "/configs/fashion_mnist_mlp.flags", "--servers", "2", "--workers", "2",
       "--no_build", "--run_dir", run_dir, "--", "--epochs=1"},
      dir.Join("launch.log"),
      // Should this test die, the script gets SIGTERM, on which it stops its whole job.
      SIGTERM);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  Result<int> rc = job->WaitExit(itest::DeadlineIn(kJobTimeout));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // On failure, show what the job said (the script's console and every process's log).
  auto logs = [&] {
    std::string out = "---- launch_local.sh ----\n" + itest::TailOfFile(job->log_path(), 40);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(run_dir + "/logs", ec)) {
      out += "---- " + e.path().filename().string() + " ----\n" +
             itest::TailOfFile(e.path().string(), 20);
    }
    return out;
  };
  ASSERT_TRUE(rc.ok()) << rc.status().ToString() << "\n" << logs();
  ASSERT_EQ(*rc, 0) << "launch_local.sh failed\n" << logs();
  std::cout << "the job took " << seconds << " s\n";

  // Nothing the script started outlives it.
  Result<std::string> endpoint = itest::ReadFile(run_dir + "/coordinator.endpoint");
  std::string ep = endpoint.ok() ? *endpoint : "";
  while (!ep.empty() && (ep.back() == '\n' || ep.back() == '\r')) ep.pop_back();
  // The script reaps what it stops before it exits, so this needs no grace period.
  std::vector<itest::ProcessInfo> left = LeftoverProcesses(job->pid(), run_dir, ep);
  EXPECT_TRUE(left.empty()) << "still running after launch_local.sh exited:\n" << Describe(left);

  Result<std::string> text = itest::ReadFile(run_dir + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString() << "\n" << logs();
  json summary = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(summary.is_object()) << *text;
  EXPECT_EQ(summary.value("status", ""), "ok") << *text;
  EXPECT_GE(summary.value("test_accuracy", 0.0), 0.80) << *text;
  EXPECT_EQ(summary.value("epochs", 0), 1) << *text;
  ASSERT_TRUE(summary.contains("workers") && summary["workers"].is_array()) << *text;
  ASSERT_EQ(summary["workers"].size(), 2u) << *text;
  uint64_t examples = 0;
  for (const json& w : summary["workers"]) {
    uint64_t n = w.value("examples", uint64_t{0});
    EXPECT_GT(n, 0u) << w.dump();
    examples += n;
  }
  EXPECT_EQ(examples, 60000u) << "one epoch covers each training example once\n" << *text;
  EXPECT_EQ(summary.value("pushes_rejected", uint64_t{1}), 0u) << *text;

  Result<std::string> metrics = itest::ReadFile(run_dir + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  int train_lines = 0, eval_lines = 0;
  std::istringstream lines(*metrics);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "metrics.jsonl has a line that is not a JSON object: " << line;
    std::string kind = j.value("kind", "");
    train_lines += kind == "train";
    eval_lines += kind == "eval";
  }
  EXPECT_GE(train_lines, 1);
  EXPECT_GE(eval_lines, 1);
}

}  // namespace
}  // namespace ps
