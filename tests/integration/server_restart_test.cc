// A server that dies with --replicas=1 is replaced by a new ps_server process, which
// restores its shards from the latest recorded checkpoint set (server/coordinator.h): real
// ps_coordinator, ps_server and ps_worker processes on 127.0.0.1 training a small MLP on
// Fashion-MNIST (skipped without the data). The test asserts that the death is detected
// within a stated time, that the replacement serves soon after, that the job completes with
// every epoch covering every example once, and that summary.json says what was rolled back.
// Detection, kill-to-serving time and the rollback are printed, for the record.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;
using itest::SteadyClock;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
constexpr double kHeartbeatTimeout = 2.0;
// Detection may lag the timeout by one heartbeat check of the coordinator's loop and by
// scheduling on a loaded machine.
constexpr double kDetectionSlack = 3.0;
constexpr int kCheckpointEvery = 100;  // clocks
constexpr std::chrono::seconds kJobTimeout{120};

#define SKIP_WITHOUT_FASHION_MNIST()                                                      \
  if (access(kTrainImages, R_OK) != 0) {                                                  \
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)"; \
  }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class ServerRestartTest : public itest::JobTest {
 protected:
  // The job's flags: 2 servers without backups, 2 workers under SSP, a checkpoint set
  // every kCheckpointEvery clocks into `checkpoint_dir` (default: the test's checkpoints).
  std::vector<std::string> JobFlags(std::string checkpoint_dir = "") {
    if (checkpoint_dir.empty()) checkpoint_dir = dir_.Join("checkpoints");
    return {"--num_servers=2",
            "--num_workers=2",
            "--epochs=2",
            "--mlp_layers=784,32,10",
            "--staleness=2",
            "--replicas=1",
            "--chunk_examples=2048",
            "--base_lr=0.1",
            "--report_every_seconds=0.2",
            "--checkpoint_every=" + std::to_string(kCheckpointEvery),
            "--checkpoint_dir=" + checkpoint_dir,
            "--heartbeat_timeout=" + std::to_string(kHeartbeatTimeout)};
  }

  Result<itest::ChildProcess> SpawnServer(int id, const std::string& log_name) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_server"), "--coordinator=" + endpoint_,
                                     "--listen=tcp://127.0.0.1:*", "--register_timeout_ms=30000",
                                     "--id=" + std::to_string(id)};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    return itest::ChildProcess::Spawn(argv, dir_.Join(log_name));
  }

  void StartWorker(int id) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint_,
                                     "--register_timeout_ms=30000", "--id=" + std::to_string(id)};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    Result<itest::ChildProcess> p =
        itest::ChildProcess::Spawn(argv, dir_.Join("worker-" + std::to_string(id) + ".log"));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    workers_.push_back(std::move(p).value());
  }

  // Waits until checkpoints.json records a set (a server dying now has one to restore),
  // then until a worker reports a clock `past` clocks beyond it (so that some updates are
  // rolled back).
  bool WaitForRecordedCheckpoint(int64_t past) {
    const std::string path = dir_.Join("checkpoints") + "/checkpoints.json";
    int64_t recorded = -1;
    while (SteadyClock::now() < deadline_) {
      if (recorded < 0) {
        std::ifstream in(path);
        json j = json::parse(in, nullptr, false);
        if (j.is_object() && j.contains("sets") && j["sets"].is_array() && !j["sets"].empty()) {
          recorded = j["sets"].back().value("clock", int64_t{0});
        }
      }
      if (recorded >= 0) {
        std::ifstream in(RunDir() + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
          json j = json::parse(line, nullptr, false);
          if (j.is_object() && j.value("kind", "") == "train" &&
              j.value("clock", int64_t{0}) >= recorded + past) {
            return true;
          }
        }
      }
      if (coordinator_->TryReap()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // The coordinator, two servers and two workers of JobFlags().
  void StartJob() {
    Result<itest::ChildProcess> c = StartCoordinator(JobFlags(), deadline_, &endpoint_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_.emplace(std::move(c).value());
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = SpawnServer(s, "server-" + std::to_string(s) + ".log");
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      servers_.push_back(std::move(p).value());
    }
    for (int w = 0; w < 2; ++w) ASSERT_NO_FATAL_FAILURE(StartWorker(w));
  }

  itest::Deadline deadline_;
  std::string endpoint_;
  std::optional<itest::ChildProcess> coordinator_;
  std::vector<itest::ChildProcess> servers_;
  std::vector<itest::ChildProcess> workers_;
};

// kill -9 server 0 after a checkpoint set was recorded, and start a new ps_server with the
// same flags at once (as by hand, or as launch_local.sh --restart_servers does): it waits
// until the coordinator declares server 0 dead, takes its id, restores the set, and the
// workers are redirected to it. The updates to server 0's shards after the set's clock are
// rolled back; the job completes.
TEST_F(ServerRestartTest, AKilledServerIsReplacedAndRestoresTheLatestCheckpoint) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto test_start = SteadyClock::now();
  deadline_ = itest::DeadlineIn(kJobTimeout);
  ASSERT_NO_FATAL_FAILURE(StartJob());

  ASSERT_TRUE(WaitForRecordedCheckpoint(kCheckpointEvery * 3 / 4))
      << "no checkpoint set was recorded, or training did not go on past it";
  const double killed_at = UnixNow();
  ASSERT_EQ(kill(servers_[0].pid(), SIGKILL), 0);
  Result<itest::ChildProcess> replacement = SpawnServer(0, "server-0-restarted.log");
  ASSERT_TRUE(replacement.ok()) << replacement.status().ToString();

  ExpectCleanExit(*coordinator_, "coordinator", deadline_);
  for (auto& w : workers_) ExpectCleanExit(w, "worker", deadline_);
  ExpectCleanExit(servers_[1], "server 1", deadline_);
  ExpectCleanExit(*replacement, "the replacement of server 0", deadline_);
  Result<json> read = ReadSummary();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  const json& summary = *read;
  EXPECT_EQ(summary.value("status", ""), "ok") << summary.dump();

  json f;
  for (const json& e : summary.value("failures", json::array())) {
    if (e.value("kind", "") == "server_lost" && e.value("server", -1) == 0) f = e;
  }
  ASSERT_TRUE(f.is_object()) << "server 0's death is not listed: " << summary.dump();
  const double detection = f.value("unix_time", 0.0) - killed_at;
  const double serving = f.value("serving_unix_time", 0.0) - killed_at;
  ASSERT_TRUE(f.contains("rollback")) << f.dump();
  const json& rollback = f["rollback"];
  std::printf(
      "server kill -9 (--replicas=1): detected after %.2f s (heartbeat_timeout %.1f s), "
      "replacement serving %.2f s after the kill (restore %.3f s); restored clock %lld, "
      "lost at clock %lld: %lld clocks and %s pushes (estimate %s) rolled back; test "
      "accuracy %.4f; test %.1f s\n",
      detection, kHeartbeatTimeout, serving, f.value("restore_seconds", -1.0),
      static_cast<long long>(rollback.value("checkpoint_clock", int64_t{-1})),
      static_cast<long long>(rollback.value("clock_at_loss", int64_t{-1})),
      static_cast<long long>(rollback.value("clocks_rolled_back", int64_t{-1})),
      rollback["pushes_since_checkpoint"].dump().c_str(),
      rollback.value("pushes_since_checkpoint_estimate", json()).dump().c_str(),
      summary.value("test_accuracy", 0.0),
      std::chrono::duration<double>(SteadyClock::now() - test_start).count());
  EXPECT_GT(detection, 0);
  EXPECT_LE(detection, kHeartbeatTimeout + kDetectionSlack);
  // The replacement was already waiting: it serves as soon as the death is declared.
  EXPECT_GE(serving, detection - 0.5);
  EXPECT_LE(serving, kHeartbeatTimeout + kDetectionSlack + 3.0);
  EXPECT_EQ(f.value("new_pid", 0u), static_cast<uint32_t>(replacement->pid())) << f.dump();
  EXPECT_GE(f.value("restore_seconds", -1.0), 0.0) << f.dump();
  EXPECT_TRUE(f.contains("restarted_at")) << f.dump();

  // What was lost: the updates after a recorded checkpoint, a bounded number of clocks (the
  // workers wait on the dead server's shards, so they hardly advance past the loss).
  const int64_t restored = rollback.value("checkpoint_clock", int64_t{-1});
  EXPECT_GT(restored, 0) << rollback.dump();
  EXPECT_EQ(restored % kCheckpointEvery, 0) << rollback.dump();
  EXPECT_GE(rollback.value("clock_at_loss", int64_t{-1}), restored) << rollback.dump();
  EXPECT_GE(rollback.value("clocks_rolled_back", int64_t{-1}), 0) << rollback.dump();
  EXPECT_LE(rollback.value("clocks_rolled_back", int64_t{-1}), 4 * kCheckpointEvery)
      << rollback.dump();
  ASSERT_TRUE(rollback["pushes_since_checkpoint"].is_number_unsigned()) << rollback.dump();
  // pushes_lost counts the rolled-back pushes (and no push a worker gave up on).
  EXPECT_EQ(summary.value("pushes_lost_by_workers", uint64_t{1}), 0u);
  const uint64_t reported = rollback["pushes_since_checkpoint"].get<uint64_t>();
  const uint64_t estimate = rollback.value("pushes_since_checkpoint_estimate", uint64_t{0});
  EXPECT_EQ(summary.value("pushes_rolled_back", uint64_t{0}), std::max(reported, estimate));
  EXPECT_TRUE(summary.value("pushes_lost_estimated", false));
  if (rollback.value("clocks_rolled_back", int64_t{0}) > 0) {
    EXPECT_GT(summary.value("pushes_rolled_back", uint64_t{0}), 0u) << rollback.dump();
  }
  EXPECT_EQ(summary.value("pushes_lost", uint64_t{0}),
            summary.value("pushes_rolled_back", uint64_t{1}));

  // The job went on: every epoch covered once, the model trained, the replacement served
  // to the end and wrote checkpoints at the clocks the other server did (a set recorded
  // after the restored one).
  EXPECT_EQ(summary["examples_per_epoch"], json(std::vector<uint64_t>(2, 60000))) << summary.dump();
  EXPECT_GT(summary.value("test_accuracy", 0.0), 0.6) << "the model trained";
  EXPECT_GT(summary["servers"][0].value("pushes_applied", uint64_t{0}), 0u)
      << summary["servers"].dump();
  EXPECT_GT(summary.value("last_recorded_checkpoint_clock", int64_t{0}), restored)
      << "no checkpoint set was completed after the restart";
  // Each worker was redirected to the replacement: one that was not would have lost its
  // pushes to server 0's shards (unanswered at the dead endpoint) instead of finishing.
  ASSERT_EQ(summary["workers"].size(), 2u) << summary.dump();
  for (const json& w : summary["workers"]) {
    EXPECT_EQ(w.value("state", ""), "finished") << w.dump();
    EXPECT_FALSE(w.value("failed", true)) << w.dump();
    EXPECT_EQ(w.value("pushes_lost", uint64_t{1}), 0u) << w.dump();
    EXPECT_GT(w.value("examples", uint64_t{0}), 0u) << w.dump();
  }
}

// launch_local.sh restarts a server that dies (--restart_servers, on by default with
// --replicas=1 and a --checkpoint_dir): kill -9 server 0 of a launched job; the script
// starts it again with the same flags, and the job completes with the rollback listed.
TEST_F(ServerRestartTest, TheLauncherRestartsADeadServer) {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string run_dir = dir_.Join("launched");
  const std::string ckpt = dir_.Join("launched-checkpoints");
  // The launcher's --servers/--workers set the job's counts; the rest are JobFlags'.
  std::vector<std::string> args = {"--servers", "2", "--workers", "2", "--"};
  for (std::string& f : JobFlags(ckpt)) args.push_back(std::move(f));
  // Kills server 0 once a checkpoint set is recorded (from a thread: the script runs the
  // job in the foreground).
  const itest::Deadline deadline = itest::DeadlineIn(kJobTimeout);
  pid_t killed = 0;
  double killed_at = 0;
  std::thread killer([&] {
    while (SteadyClock::now() < deadline) {
      std::ifstream in(ckpt + "/checkpoints.json");
      json j = json::parse(in, nullptr, false);
      Result<std::string> ep = itest::ReadFile(run_dir + "/coordinator.endpoint");
      if (j.is_object() && j.contains("sets") && j["sets"].is_array() && !j["sets"].empty() &&
          ep.ok()) {
        std::string endpoint = *ep;
        while (!endpoint.empty() && endpoint.back() == '\n') endpoint.pop_back();
        for (const itest::ProcessInfo& p : itest::ScanProcesses()) {
          if (p.comm == "ps_server" && p.state != 'Z' &&
              p.cmdline.find(endpoint) != std::string::npos &&
              p.cmdline.find("--id=0") != std::string::npos) {
            killed_at = UnixNow();
            if (kill(p.pid, SIGKILL) == 0) killed = p.pid;
            return;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  Result<itest::LaunchResult> r =
      itest::RunLaunchLocal(args, run_dir, dir_.Join("launch.log"), kJobTimeout);
  killer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(killed, 0) << "server 0 was not found to kill\n" << r->logs;
  EXPECT_EQ(r->exit_status, 0) << r->logs;
  EXPECT_TRUE(r->leftovers.empty()) << itest::Describe(r->leftovers);
  ASSERT_TRUE(r->summary.is_object()) << r->logs;
  EXPECT_EQ(r->summary.value("status", ""), "ok") << r->summary.dump();
  json f;
  for (const json& e : r->summary.value("failures", json::array())) {
    if (e.value("kind", "") == "server_lost" && e.value("server", -1) == 0) f = e;
  }
  ASSERT_TRUE(f.is_object()) << r->summary.dump();
  const double serving = f.value("serving_unix_time", 0.0) - killed_at;
  std::printf(
      "launch_local.sh: server 0 killed, restarted by the script, serving %.2f s after "
      "the kill; %s\n",
      serving, f["rollback"].dump().c_str());
  // A new process took server 0's id: the test started none, so the script did.
  EXPECT_NE(f.value("new_pid", 0u), static_cast<uint32_t>(killed));
  EXPECT_GT(f.value("new_pid", 0u), 0u);
  EXPECT_LE(serving, kHeartbeatTimeout + kDetectionSlack + 3.0);
  EXPECT_GT(f["rollback"].value("checkpoint_clock", int64_t{-1}), 0) << f.dump();
  EXPECT_EQ(r->summary["examples_per_epoch"], json(std::vector<uint64_t>(2, 60000)));
}

// A server that was only stopped (SIGSTOP) past the timeout is declared dead and replaced;
// when it wakes, its heartbeat reply says another process holds its id, and it exits
// (nothing it does reaches the model any more). The job completes on the replacement.
TEST_F(ServerRestartTest, AStoppedServerThatWakesAfterItsReplacementExits) {
  SKIP_WITHOUT_FASHION_MNIST();
  deadline_ = itest::DeadlineIn(kJobTimeout);
  ASSERT_NO_FATAL_FAILURE(StartJob());
  ASSERT_TRUE(WaitForRecordedCheckpoint(0)) << "no checkpoint set was recorded";
  ASSERT_EQ(kill(servers_[0].pid(), SIGSTOP), 0);
  Result<itest::ChildProcess> replacement = SpawnServer(0, "server-0-restarted.log");
  ASSERT_TRUE(replacement.ok()) << replacement.status().ToString();
  // Wait until the replacement took the id (server 0's failure entry names its pid).
  const uint32_t new_pid = static_cast<uint32_t>(replacement->pid());
  Result<json> replaced = WaitForFailure(
      endpoint_, *coordinator_,
      [&](const json& f) {
        return f.value("kind", "") == "server_lost" && f.value("server", -1) == 0 &&
               f.value("new_pid", 0u) == new_pid;
      },
      deadline_);
  ASSERT_TRUE(replaced.ok()) << "server 0 was not replaced: " << replaced.status().ToString();
  ASSERT_EQ(kill(servers_[0].pid(), SIGCONT), 0);
  const auto woke = SteadyClock::now();
  // One heartbeat interval (timeout / 4) and its reply, with room for a loaded machine.
  Result<int> rc = servers_[0].WaitExit(woke + std::chrono::seconds(10));
  ASSERT_TRUE(rc.ok()) << "the stopped server did not exit once awake: " << rc.status().ToString();
  EXPECT_NE(*rc, 0);
  std::printf("a stopped server woke after its replacement and exited %.2f s later\n",
              std::chrono::duration<double>(SteadyClock::now() - woke).count());
  ExpectCleanExit(*coordinator_, "coordinator", deadline_);
  for (auto& w : workers_) ExpectCleanExit(w, "worker", deadline_);
  ExpectCleanExit(*replacement, "the replacement of server 0", deadline_);
  Result<json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->value("status", ""), "ok") << summary->dump();
  EXPECT_EQ((*summary)["examples_per_epoch"], json(std::vector<uint64_t>(2, 60000)));
}

}  // namespace
}  // namespace ps
