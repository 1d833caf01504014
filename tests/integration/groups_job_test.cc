// All-reduce groups in whole jobs: 4 workers in groups of 2 push about half the bytes of 4
// ungrouped workers and reach the same accuracy (scripts/launch_local.sh); a member stopped
// mid-training past the group timeout breaks the group, and both workers finish the job on
// their own with every example trained once (real processes).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "common/transport.h"
#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
constexpr std::chrono::seconds kJobTimeout{240};
constexpr int kGroupTimeoutSeconds = 2;
// One epoch of the default's global batch of 512 is only 117 updates; a quarter of it makes
// 469, so a one-epoch job learns enough to tell a working group from a broken one.
constexpr char kOneEpochBatch[] = "--global_batch_size=128";

json RunJob(const itest::TempDir& dir, const std::string& name, std::vector<std::string> flags) {
  std::vector<std::string> args = {itest::SourceDir() + "/configs/fashion_mnist_mlp.flags",
                                   "--servers",
                                   "2",
                                   "--workers",
                                   "4",
                                   "--",
                                   "--epochs=1",
                                   kOneEpochBatch};
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = itest::RunLaunchLocal(args, dir.Join(name), dir.Join(name + ".log"), kJobTimeout);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return json();
  EXPECT_EQ(r->exit_status, 0) << name << ": launch_local.sh failed\n" << r->logs;
  EXPECT_TRUE(r->leftovers.empty()) << itest::Describe(r->leftovers);
  return r->summary;
}

TEST(GroupsJobTest, GroupsOfTwoPushHalfTheBytesAtTheSameAccuracy) {
  if (access(kTrainImages, R_OK) != 0) GTEST_SKIP() << kTrainImages << " is not here";
  itest::TempDir dir("ps_groups_job_test_");
  const json alone = RunJob(dir, "alone", {});
  const json grouped = RunJob(dir, "grouped", {"--group_size=2"});
  ASSERT_TRUE(alone.is_object() && grouped.is_object());
  ASSERT_EQ(grouped.value("status", ""), "ok") << grouped.dump();
  const double bytes_alone = alone.value("bytes_pushed", 0.0);
  const double bytes_grouped = grouped.value("bytes_pushed", 0.0);
  ASSERT_GT(bytes_alone, 0);
  // The same examples; a group pushes one sum per 2 batches (chunk tails add a little).
  EXPECT_GT(bytes_grouped / bytes_alone, 0.40) << bytes_grouped << " vs " << bytes_alone;
  EXPECT_LT(bytes_grouped / bytes_alone, 0.60) << bytes_grouped << " vs " << bytes_alone;
  EXPECT_EQ(grouped["examples_per_epoch"], json::array({60000})) << grouped.dump();
  uint64_t examples = 0;
  for (const json& w : grouped["workers"]) examples += w.value("examples", uint64_t{0});
  EXPECT_EQ(examples, 60000u) << "every example once, whichever member trained it";
  const double acc_alone = alone.value("test_accuracy", 0.0);
  const double acc_grouped = grouped.value("test_accuracy", 0.0);
  EXPECT_GE(acc_grouped, 0.80) << grouped.dump();
  EXPECT_NEAR(acc_grouped, acc_alone, 0.03);
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Whether `path` (a job's metrics.jsonl) holds a train line for which `match` holds.
bool HasTrainLine(const std::string& path, const std::function<bool(const json&)>& match) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == "train" && match(j)) return true;
  }
  return false;
}

// Waits until HasTrainLine(path, match) (the job writes the file as it runs); false at the
// deadline.
bool WaitForTrainLine(const std::string& path, const std::function<bool(const json&)>& match,
                      itest::Deadline deadline) {
  while (!HasTrainLine(path, match)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

class GroupFailureTest : public itest::JobTest {};

// Worker 1 (the member) is stopped (SIGSTOP) mid-training for longer than
// --group_timeout_seconds: the leader's sum times out, nothing of that step is pushed, the
// leader dissolves the group and trains on alone. Resumed, the member hears that the group
// is gone, rejoins the clock table and leases data on its own. The job completes: every
// example once, both workers done, nothing hung.
TEST_F(GroupFailureTest, AStalledMemberBreaksTheGroupAndBothFinishAlone) {
  if (access(kTrainImages, R_OK) != 0) GTEST_SKIP() << kTrainImages << " is not here";
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(200));
  std::string endpoint;
  auto coordinator = StartCoordinator(
      {"--flagfile=" + itest::SourceDir() + "/configs/fashion_mnist_mlp.flags", "--epochs=1",
       kOneEpochBatch, "--num_servers=1", "--num_workers=2", "--group_size=2",
       "--group_timeout_seconds=" + std::to_string(kGroupTimeoutSeconds)},
      deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<itest::ChildProcess> workers;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--id=" + std::to_string(i)};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    auto w = itest::ChildProcess::Spawn(argv, dir_.Join("worker-" + std::to_string(i) + ".log"));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    workers.push_back(std::move(w).value());
  }
  // Training in the group: the leader's first progress report (members send none).
  const std::string metrics = RunDir() + "/metrics.jsonl";
  ASSERT_TRUE(WaitForTrainLine(
      metrics, [](const json& j) { return j.value("worker", -1) == 0; }, deadline));
  const double stopped_at = UnixNow();
  ASSERT_EQ(kill(workers[1].pid(), SIGSTOP), 0);
  // The leader trains alone: a report of its received (its "time") more than the group
  // timeout after the stop. Until the timeout it waits for the stopped member in the step
  // under way and reports nothing; a report sent before that would have to lie unread at
  // the coordinator for seconds.
  const bool broke = WaitForTrainLine(
      metrics,
      [&](const json& j) {
        return j.value("worker", -1) == 0 &&
               j.value("time", 0.0) > stopped_at + kGroupTimeoutSeconds;
      },
      deadline);
  ASSERT_EQ(kill(workers[1].pid(), SIGCONT), 0);
  ASSERT_TRUE(broke) << "the leader never trained on without the stalled member";
  ExpectCleanExit(workers[0], "worker 0", deadline);
  ExpectCleanExit(workers[1], "worker 1", deadline);
  ExpectCleanExit(*coordinator, "coordinator", deadline);
  ExpectCleanExit(*server, "server", deadline);
  // Resumed, the member trained alone: it reports for itself (a member in a group does not).
  EXPECT_TRUE(HasTrainLine(metrics, [](const json& j) { return j.value("worker", -1) == 1; }))
      << "worker 1 never trained alone";
  auto summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ((*summary)["examples_per_epoch"], json::array({60000})) << summary->dump();
  uint64_t examples = 0;
  for (const json& w : (*summary)["workers"]) {
    EXPECT_NE(w.value("group", std::string()), "") << "the group had formed: " << w.dump();
    EXPECT_GT(w.value("examples", uint64_t{0}), 0u) << w.dump();
    examples += w.value("examples", uint64_t{0});
  }
  EXPECT_EQ(examples, 60000u) << "a step the group broke in is trained once, by the leader";
  EXPECT_GE(summary->value("test_accuracy", 0.0), 0.75) << summary->dump();
}

// A group holds one kind of device: a CPU and a GPU worker put in one group are refused at
// registration, both told why, and the job does not start.
TEST_F(GroupFailureTest, AGroupMixingDevicesIsRefused) {
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(60));
  std::string endpoint;
  auto coordinator = StartCoordinator({"--num_servers=1", "--num_workers=2", "--group_size=2"},
                                      deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Transport transport(ClientTransportOptions());
  std::vector<Status> outcomes(2);
  std::vector<std::thread> workers;
  const char* devices[] = {"cpu: 1 threads", "NVIDIA H200 (cuda:0)"};
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      RegisterRequest req;
      req.device = devices[i];
      req.requested_id = i;
      outcomes[i] =
          RegisterWithCoordinator(&transport, endpoint, req, itest::TimeLeft(deadline)).status();
    });
  }
  for (auto& t : workers) t.join();
  for (const Status& s : outcomes) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("mixes devices"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("NVIDIA H200 (cuda:0)"), std::string::npos) << s.ToString();
  }
  Result<int> rc = coordinator->WaitExit(deadline);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_NE(*rc, 0) << "the job must not start";
}

}  // namespace
}  // namespace ps
