// ps_status against a running job (through scripts/launch_local.sh): with a straggler under
// BSP, the status shows the other worker waiting on it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// Runs ps_status once with `flags` and returns its exit status and output.
struct StatusRun {
  int exit_status = -1;
  std::string output;
};
Result<StatusRun> RunStatus(const std::vector<std::string>& flags, const std::string& log,
                            itest::Deadline deadline) {
  std::vector<std::string> argv = {itest::BinaryPath("ps_status")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  unlink(log.c_str());
  PS_ASSIGN_OR_RETURN(itest::ChildProcess p, itest::ChildProcess::Spawn(argv, log));
  StatusRun r;
  PS_ASSIGN_OR_RETURN(r.exit_status, p.WaitExit(deadline));
  PS_ASSIGN_OR_RETURN(r.output, itest::ReadFile(log));
  return r;
}

TEST(StatusTest, NoCoordinatorIsAnErrorNamingIt) {
  itest::TempDir dir("ps_status_test_");
  auto r = RunStatus({"--coordinator=tcp://127.0.0.1:1", "--timeout_ms=300", "--insecure"},
                     dir.Join("s.log"), itest::DeadlineIn(std::chrono::seconds(20)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_status, 1) << r->output;
  EXPECT_NE(r->output.find("tcp://127.0.0.1:1"), std::string::npos) << r->output;
  auto bad = RunStatus({"--coordinator=http://x", "--insecure"}, dir.Join("b.log"),
                       itest::DeadlineIn(std::chrono::seconds(20)));
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_EQ(bad->exit_status, 2) << bad->output;
}

// Worker 1 is 8x slower under BSP: worker 0 spends most of its time blocked, and ps_status
// names worker 1 as the one it waits on; the servers report their rows and pushes.
TEST(StatusTest, StatusShowsWorkersWaitingOnTheStraggler) {
  if (access(kTrainImages, R_OK) != 0) {
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)";
  }
  itest::TempDir dir("ps_status_test_");
  const std::string run_dir = dir.Join("run");
  const std::string bin_dir =
      std::filesystem::path(itest::BinaryPath("ps_coordinator")).parent_path().string();
  setenv("PS_BIN_DIR", bin_dir.c_str(), /*overwrite=*/0);
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(90));
  auto job = itest::ChildProcess::Spawn(
      {"/bin/bash", itest::SourceDir() + "/scripts/launch_local.sh", "--no_build", "--run_dir",
       run_dir, "--slow_worker", "1:8", "--", "--epochs=1", "--staleness=0"},
      dir.Join("launch.log"), SIGTERM);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  Status ep_ready = itest::WaitForFile(run_dir + "/coordinator.endpoint", deadline, &*job);
  ASSERT_TRUE(ep_ready.ok()) << ep_ready.ToString()
                             << itest::TailOfFile(dir.Join("launch.log"), 30);
  auto ep_text = itest::ReadFile(run_dir + "/coordinator.endpoint");
  // ps_status asks with the job's worker key, which launch_local.sh made.
  const std::string keys = "--keys_dir=" + run_dir + "/keys";
  ASSERT_TRUE(ep_text.ok());
  std::string endpoint = *ep_text;
  while (!endpoint.empty() && endpoint.back() == '\n') endpoint.pop_back();

  // Ask until the straggler shows (the first reports come a second into training).
  json last;
  bool seen_waiting = false;
  while (!seen_waiting && itest::SteadyClock::now() < deadline) {
    auto r =
        RunStatus({"--coordinator=" + endpoint, "--json", keys}, dir.Join("status.log"), deadline);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->exit_status, 0) << r->output;
    last = json::parse(r->output, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(last.is_object()) << r->output;
    if (last.value("phase", "") != "training" || last["workers"].size() != 2) continue;
    const json& w0 = last["workers"][0];
    const json& w1 = last["workers"][1];
    seen_waiting = w0.value("waits_on", -1) == 1 && w1.value("waits_on", -1) == -1 &&
                   w0.value("clock", 0) > 0 && last["servers"][0].contains("rows");
  }
  ASSERT_TRUE(seen_waiting) << "never saw worker 0 waiting on worker 1: " << last.dump(1);
  EXPECT_EQ(last["servers"].size(), 2u);
  uint64_t rows = 0;
  for (const json& s : last["servers"]) rows += s.value("rows", uint64_t{0});
  // The MLP 784-256-128-10: weights and biases split over the two servers.
  EXPECT_EQ(rows, 784u + 1 + 256 + 1 + 128 + 1) << last.dump(1);
  EXPECT_TRUE(last["failures"].is_array() && last["failures"].empty()) << last.dump(1);
  EXPECT_GT(last["workers"][0].value("wait_seconds", 0.0), 0.0) << last.dump(1);

  // --watch keeps printing while the job runs, and ends (0) once the coordinator is gone.
  auto watch = itest::ChildProcess::Spawn(
      {itest::BinaryPath("ps_status"), "--coordinator=" + endpoint, keys, "--watch", "--json",
       "--interval_seconds=0.2", "--timeout_ms=1000"},
      dir.Join("watch.log"));
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();

  // The table form names the worker waited on: asked until a snapshot catches worker 0
  // waiting (bounded), since between two steps it is not.
  std::string table_output;
  for (bool named = false; !named;) {
    ASSERT_LT(itest::SteadyClock::now(), deadline)
        << "the table never named the worker waited on:\n"
        << table_output;
    auto table = RunStatus({"--coordinator=" + endpoint, keys}, dir.Join("table.log"), deadline);
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    ASSERT_EQ(table->exit_status, 0) << table->output;
    table_output = table->output;
    named = table_output.find("worker 1") != std::string::npos;
  }
  EXPECT_NE(table_output.find("pushes/s"), std::string::npos) << table_output;
  // Until the watch has shown the straggler too (bounded), then the job ends.
  for (bool shown = false; !shown && itest::SteadyClock::now() < deadline;) {
    auto so_far = itest::ReadFile(dir.Join("watch.log"));
    shown = so_far.ok() && so_far->find("\"waits_on\":1") != std::string::npos;
    if (!shown) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  job->Kill();
  auto watched = watch->WaitExit(deadline);
  ASSERT_TRUE(watched.ok()) << watched.status().ToString();
  auto watch_output = itest::ReadFile(dir.Join("watch.log"));
  ASSERT_TRUE(watch_output.ok());
  EXPECT_EQ(*watched, 0) << *watch_output;
  EXPECT_NE(watch_output->find("\"waits_on\":1"), std::string::npos) << *watch_output;
  EXPECT_NE(watch_output->find("the job has ended"), std::string::npos) << *watch_output;
}

}  // namespace
}  // namespace ps
