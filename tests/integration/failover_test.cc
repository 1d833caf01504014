// Workers that die, stop, leave and join while a job trains: real ps_coordinator,
// ps_server and ps_worker processes on 127.0.0.1 training a small MLP on Fashion-MNIST
// (skipped without the data). Each test asserts that the failure is detected within a
// stated time, that the job completes, and that every epoch still covers every training
// example exactly once (summary.json's examples_per_epoch). Detection and drain times are
// printed, for the record.
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
constexpr double kHeartbeatTimeout = 3.0;
// Detection may lag the timeout by one heartbeat check of the coordinator's loop and by
// scheduling on a loaded machine.
constexpr double kDetectionSlack = 3.0;
// Each job trains for about 10 s on two idle cores; the margin is for loaded CI machines.
constexpr std::chrono::seconds kJobTimeout{150};

#define SKIP_WITHOUT_FASHION_MNIST()                                                      \
  if (access(kTrainImages, R_OK) != 0) {                                                  \
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)"; \
  }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class FailoverTest : public itest::JobTest {
 protected:
  // Coordinator, 2 servers and `workers` workers with ids 0..workers-1.
  void StartJob(int workers, int epochs) {
    deadline_ = itest::DeadlineIn(kJobTimeout);
    Result<itest::ChildProcess> c = StartCoordinator(
        {"--num_servers=2", "--num_workers=" + std::to_string(workers),
         "--epochs=" + std::to_string(epochs), "--mlp_layers=784,32,10", "--staleness=2",
         "--chunk_examples=2048", "--base_lr=0.1", "--report_every_seconds=0.2",
         "--heartbeat_timeout=" + std::to_string(kHeartbeatTimeout)},
        deadline_, &endpoint_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_.emplace(std::move(c).value());
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = StartServer(s, endpoint_);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      servers_.push_back(std::move(p).value());
    }
    for (int w = 0; w < workers; ++w) StartWorker(w);
  }

  // id -1: a worker that joins (no --id).
  void StartWorker(int id) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint_,
                                     "--drain_timeout_ms=8000", "--register_timeout_ms=30000"};
    if (id >= 0) argv.push_back("--id=" + std::to_string(id));
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    const std::string name = id >= 0 ? "worker-" + std::to_string(id) : "worker-join";
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    Result<itest::ChildProcess> p = itest::ChildProcess::Spawn(argv, dir_.Join(name + ".log"));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    workers_.push_back(std::move(p).value());
  }

  // Waits until metrics.jsonl has a train line from `worker` (it is training mid-epoch).
  bool WaitForTraining(int worker) {
    const std::string path = RunDir() + "/metrics.jsonl";
    while (SteadyClock::now() < deadline_) {
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) {
        json j = json::parse(line, nullptr, false);
        if (j.is_object() && j.value("kind", "") == "train" && j.value("worker", -1) == worker) {
          return true;
        }
      }
      if (coordinator_->TryReap()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // The job ends well; returns summary.json.
  json FinishJob() {
    ExpectCleanExit(*coordinator_, "coordinator", deadline_);
    Result<json> summary = ReadSummary();
    EXPECT_TRUE(summary.ok()) << summary.status().ToString();
    if (!summary.ok()) return json::object();
    EXPECT_EQ(summary->value("status", ""), "ok") << summary->dump();
    return *summary;
  }

  static void ExpectEveryEpochCoveredOnce(const json& summary, int epochs) {
    EXPECT_EQ(summary["examples_per_epoch"], json(std::vector<uint64_t>(epochs, 60000)))
        << summary.dump();
    EXPECT_EQ(summary.value("pushes_lost", uint64_t{1}), 0u);
  }

  static json FailureOf(const json& summary, const std::string& kind, int worker) {
    for (const json& f : summary.value("failures", json::array())) {
      if (f.value("kind", "") == kind && f.value("worker", -1) == worker) return f;
    }
    return json();
  }

  itest::Deadline deadline_;
  std::string endpoint_;
  std::optional<itest::ChildProcess> coordinator_;
  std::vector<itest::ChildProcess> servers_;
  std::vector<itest::ChildProcess> workers_;
};

TEST_F(FailoverTest, AKilledWorkerIsDetectedAndItsDataRetrained) {
  SKIP_WITHOUT_FASHION_MNIST();
  ASSERT_NO_FATAL_FAILURE(StartJob(3, 2));
  ASSERT_TRUE(WaitForTraining(2)) << "worker 2 never trained";
  const double killed_at = UnixNow();
  ASSERT_EQ(kill(workers_[2].pid(), SIGKILL), 0);
  json summary = FinishJob();
  const json f = FailureOf(summary, "worker_lost", 2);
  ASSERT_TRUE(f.is_object()) << "worker 2's death is not listed: " << summary.dump();
  const double detection = f.value("unix_time", 0.0) - killed_at;
  std::printf("kill -9: detected after %.2f s (heartbeat_timeout %.1f s), %d leases returned\n",
              detection, kHeartbeatTimeout, f.value("leases_returned", -1));
  EXPECT_GT(detection, 0);
  EXPECT_LE(detection, kHeartbeatTimeout + kDetectionSlack);
  ExpectEveryEpochCoveredOnce(summary, 2);
  EXPECT_EQ(summary["workers"][2].value("state", ""), "lost");
  for (int w = 0; w < 2; ++w) ExpectCleanExit(workers_[w], "worker", deadline_);
  for (auto& s : servers_) ExpectCleanExit(s, "server", deadline_);
}

TEST_F(FailoverTest, AStoppedWorkerIsEvictedAndRefusedWhenItWakes) {
  SKIP_WITHOUT_FASHION_MNIST();
  ASSERT_NO_FATAL_FAILURE(StartJob(3, 2));
  ASSERT_TRUE(WaitForTraining(2)) << "worker 2 never trained";
  const double stopped_at = UnixNow();
  ASSERT_EQ(kill(workers_[2].pid(), SIGSTOP), 0);
  Result<json> lost = WaitForFailure(
      endpoint_, *coordinator_,
      [](const json& f) {
        return f.value("kind", "") == "worker_lost" && f.value("worker", -1) == 2;
      },
      deadline_);
  ASSERT_TRUE(lost.ok()) << "the stopped worker was not declared dead: "
                         << lost.status().ToString();
  // Awake again: its work went to others, so everything it sends is refused and it exits.
  ASSERT_EQ(kill(workers_[2].pid(), SIGCONT), 0);
  Result<int> rc = workers_[2].WaitExit(deadline_);
  ASSERT_TRUE(rc.ok()) << "the evicted worker did not exit: " << rc.status().ToString();
  EXPECT_NE(*rc, 0);
  json summary = FinishJob();
  const json f = FailureOf(summary, "worker_lost", 2);
  ASSERT_TRUE(f.is_object()) << summary.dump();
  const double detection = f.value("unix_time", 0.0) - stopped_at;
  std::printf("SIGSTOP: detected after %.2f s (heartbeat_timeout %.1f s)\n", detection,
              kHeartbeatTimeout);
  EXPECT_LE(detection, kHeartbeatTimeout + kDetectionSlack);
  ExpectEveryEpochCoveredOnce(summary, 2);
  uint64_t evicted = 0;
  for (const json& s : summary["servers"]) evicted += s.value("workers_evicted", uint64_t{0});
  EXPECT_GE(evicted, 2u) << "both servers evict the worker";
}

TEST_F(FailoverTest, SigtermDrainsAWorkerWithinTheBound) {
  SKIP_WITHOUT_FASHION_MNIST();
  ASSERT_NO_FATAL_FAILURE(StartJob(3, 2));
  ASSERT_TRUE(WaitForTraining(2)) << "worker 2 never trained";
  const auto sent = SteadyClock::now();
  ASSERT_EQ(kill(workers_[2].pid(), SIGTERM), 0);
  // --drain_timeout_ms=8000 bounds it (the process exits with 3 past it).
  Result<int> rc = workers_[2].WaitExit(sent + std::chrono::seconds(8 + 5));
  ASSERT_TRUE(rc.ok()) << "worker 2 did not leave in time: " << rc.status().ToString();
  EXPECT_EQ(*rc, 0) << "a drained worker exits cleanly";
  const double drain = std::chrono::duration<double>(SteadyClock::now() - sent).count();
  std::printf("SIGTERM: worker left after %.2f s\n", drain);
  json summary = FinishJob();
  const json f = FailureOf(summary, "worker_left", 2);
  ASSERT_TRUE(f.is_object()) << summary.dump();
  EXPECT_TRUE(FailureOf(summary, "worker_lost", 2).is_null()) << "it left, it did not die";
  ExpectEveryEpochCoveredOnce(summary, 2);
  EXPECT_EQ(summary["workers"][2].value("state", ""), "left");
}

TEST_F(FailoverTest, AWorkerJoinsARunningJobThroughTheLauncher) {
  SKIP_WITHOUT_FASHION_MNIST();
  // Epochs enough that work is left when the joiner has loaded its data on a loaded machine
  // (three epochs could end first: the joiner then finished without a step).
  constexpr int kEpochs = 8;
  ASSERT_NO_FATAL_FAILURE(StartJob(2, kEpochs));
  ASSERT_TRUE(WaitForTraining(0)) << "worker 0 never trained";
  // launch_local.sh --join finds the coordinator through RUN_DIR/coordinator.endpoint.
  {
    std::ofstream ep(RunDir() + "/coordinator.endpoint");
    ep << endpoint_ << "\n";
  }
  const std::string bin_dir =
      std::filesystem::path(itest::BinaryPath("ps_worker")).parent_path().string();
  setenv("PS_BIN_DIR", bin_dir.c_str(), 0);
  Result<itest::ChildProcess> joiner =
      itest::ChildProcess::Spawn({"/bin/bash", itest::SourceDir() + "/scripts/launch_local.sh",
                                  "--join", RunDir(), "--keys", KeysDir()},
                                 dir_.Join("join.log"));
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  json summary = FinishJob();
  ExpectCleanExit(*joiner, "joined worker", deadline_);
  ASSERT_EQ(summary["workers"].size(), 3u) << summary.dump();
  const json& w = summary["workers"][2];
  EXPECT_TRUE(w.value("joined", false)) << w.dump();
  EXPECT_GT(w.value("examples", uint64_t{0}), 0u) << "the joined worker trained: " << w.dump();
  EXPECT_EQ(summary["joins"].size(), 1u);
  ExpectEveryEpochCoveredOnce(summary, kEpochs);
  EXPECT_TRUE(summary["failures"].empty()) << summary.dump();
}

// --replicas=2 (server/replication.h): each server backs up the other's shards. At the end
// of a BSP job the copy a backup holds equals its primary's rows bit for bit (each server
// exports both), so that a promoted backup would lose no acknowledged push.
TEST_F(FailoverTest, WithTwoReplicasEachBackupEndsEqualToItsPrimary) {
  SKIP_WITHOUT_FASHION_MNIST();
  deadline_ = itest::DeadlineIn(kJobTimeout);
  Result<itest::ChildProcess> c = StartCoordinator(
      {"--num_servers=2", "--num_workers=1", "--epochs=1", "--mlp_layers=784,32,10",
       "--staleness=0", "--replicas=2", "--chunk_examples=4096", "--base_lr=0.1",
       "--optimizer=adam", "--heartbeat_timeout=" + std::to_string(kHeartbeatTimeout)},
      deadline_, &endpoint_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  coordinator_.emplace(std::move(c).value());
  const std::string export_dir = RunDir() + "/export";
  std::filesystem::create_directories(export_dir);
  for (int s = 0; s < 2; ++s) {
    Result<itest::ChildProcess> p = StartServer(s, endpoint_, {"--export_dir=" + export_dir});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    servers_.push_back(std::move(p).value());
  }
  StartWorker(0);
  json summary = FinishJob();
  ExpectEveryEpochCoveredOnce(summary, 1);
  ExpectCleanExit(workers_[0], "worker", deadline_);
  for (auto& s : servers_) ExpectCleanExit(s, "server", deadline_);
  for (int s = 0; s < 2; ++s) {
    const std::string base = export_dir + "/server-" + std::to_string(s);
    Result<std::string> primary = itest::ReadFile(base + ".safetensors");
    Result<std::string> backup = itest::ReadFile(base + ".backup.safetensors");
    ASSERT_TRUE(primary.ok()) << primary.status().ToString();
    ASSERT_TRUE(backup.ok()) << backup.status().ToString();
    EXPECT_GT(primary->size(), 1000u);
    EXPECT_TRUE(*primary == *backup) << "server " << s << "'s backup differs from it";
  }
}

// --replicas=2: kill -9 a primary server mid-training. The coordinator declares it dead,
// promotes its backup (server 1 serves server 0's shards from its copy), the worker is
// redirected in its heartbeat replies and resends what server 0 had not answered, and the
// job completes. BSP with one worker is deterministic (same data order, same request order
// on each shard, exactly-once pushes), so the final test loss equals, bit for bit, that of
// the same job without the kill: no acknowledged push was lost and none applied twice.
TEST_F(FailoverTest, AKilledPrimaryServerFailsOverToItsBackup) {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> job = {"--num_servers=2",
                                        "--num_workers=1",
                                        "--epochs=2",
                                        "--mlp_layers=784,32,10",
                                        "--staleness=0",
                                        "--replicas=2",
                                        "--chunk_examples=4096",
                                        "--base_lr=0.1",
                                        "--report_every_seconds=0.2",
                                        "--heartbeat_timeout=" + std::to_string(kHeartbeatTimeout)};
  auto start = [&] {
    deadline_ = itest::DeadlineIn(kJobTimeout);
    servers_.clear();
    workers_.clear();
    Result<itest::ChildProcess> c = StartCoordinator(job, deadline_, &endpoint_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_.emplace(std::move(c).value());
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = StartServer(s, endpoint_, {"--id=" + std::to_string(s)});
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      servers_.push_back(std::move(p).value());
    }
    StartWorker(0);
  };

  // The reference: the same job, nothing killed.
  ASSERT_NO_FATAL_FAILURE(start());
  const json reference = FinishJob();
  ExpectCleanExit(workers_[0], "worker", deadline_);
  for (auto& s : servers_) ExpectCleanExit(s, "server", deadline_);
  ASSERT_EQ(reference.value("status", ""), "ok");
  std::filesystem::rename(RunDir(), RunDir() + "-reference");

  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_TRUE(WaitForTraining(0)) << "worker 0 never trained";
  const double killed_at = UnixNow();
  ASSERT_EQ(kill(servers_[0].pid(), SIGKILL), 0);
  json summary = FinishJob();
  ExpectCleanExit(workers_[0], "worker", deadline_);
  ExpectCleanExit(servers_[1], "server 1", deadline_);
  Result<int> rc = servers_[0].WaitExit(deadline_);
  EXPECT_TRUE(rc.ok()) << rc.status().ToString();

  json f;
  for (const json& e : summary.value("failures", json::array())) {
    if (e.value("kind", "") == "server_lost" && e.value("server", -1) == 0) f = e;
  }
  ASSERT_TRUE(f.is_object()) << "server 0's death is not listed: " << summary.dump();
  EXPECT_EQ(f.value("promoted", -1), 1) << f.dump();
  const double detection = f.value("unix_time", 0.0) - killed_at;
  const double failover = f.value("promoted_unix_time", 0.0) - killed_at;
  // Kill to the first pull the promoted backup served: the failover time. The only
  // worker made that pull, so it was redirected to the backup.
  ASSERT_TRUE(f.contains("first_pull_served_unix_time")) << f.dump();
  const double served = f.value("first_pull_served_unix_time", 0.0) - killed_at;
  std::printf(
      "server kill -9: detected after %.2f s, backup promoted after %.2f s, first pull served "
      "by it after %.2f s (heartbeat_timeout %.1f s); test loss %.9g (without the kill %.9g)\n",
      detection, failover, served, kHeartbeatTimeout, summary.value("test_loss", 0.0),
      reference.value("test_loss", 0.0));
  EXPECT_GE(served, failover - 0.5);
  // The worker learns the new address from its next heartbeat reply (one a second at most).
  EXPECT_LE(served, failover + 2.0);
  EXPECT_GT(detection, 0);
  EXPECT_LE(detection, kHeartbeatTimeout + kDetectionSlack);
  EXPECT_GE(failover, detection - 0.5);
  EXPECT_LE(failover, kHeartbeatTimeout + kDetectionSlack + 1.0);
  ExpectEveryEpochCoveredOnce(summary, 2);
  EXPECT_EQ(summary["servers"][0].value("state", ""), "lost") << summary["servers"].dump();
  EXPECT_EQ(summary["servers"][0].value("served_by", -1), 1);
  // Bit for bit: the same pushes, each applied once, in the same order on each shard.
  EXPECT_EQ(summary.value("test_loss", 0.0), reference.value("test_loss", 1.0));
  EXPECT_EQ(summary.value("test_accuracy", 0.0), reference.value("test_accuracy", 1.0));
  EXPECT_GT(summary.value("test_accuracy", 0.0), 0.5) << "the model trained";
}

// Re-replication (server/replication.h): a killed server is started again; its backup,
// which served its shards meanwhile, hands them back, and the predecessor sends it a copy of
// its own, so that the job survives the next kill too. With two servers: kill -9 server 0
// and restart it, then the same for server 1 (whose shards' only other copy is the one the
// restarted server 0 received). Without re-replication the second kill would lose shards.
// As above, BSP with one worker is deterministic: the final test loss equals, bit for bit,
// the unfaulted run's (no acknowledged push lost, none applied twice, the copies exact).
TEST_F(FailoverTest, ARestartedServerTakesItsShardsBackAndTheJobSurvivesTheNextKill) {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> job = {"--num_servers=2",
                                        "--num_workers=1",
                                        "--epochs=5",
                                        "--mlp_layers=784,32,10",
                                        "--staleness=0",
                                        "--replicas=2",
                                        "--chunk_examples=4096",
                                        "--base_lr=0.005",
                                        "--optimizer=adam",
                                        "--report_every_seconds=0.2",
                                        "--heartbeat_timeout=" + std::to_string(kHeartbeatTimeout)};
  auto start = [&] {
    deadline_ = itest::DeadlineIn(kJobTimeout);
    servers_.clear();
    workers_.clear();
    Result<itest::ChildProcess> c = StartCoordinator(job, deadline_, &endpoint_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_.emplace(std::move(c).value());
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = StartServer(s, endpoint_, {"--id=" + std::to_string(s)});
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      servers_.push_back(std::move(p).value());
    }
    StartWorker(0);
  };
  ASSERT_NO_FATAL_FAILURE(start());
  const json reference = FinishJob();
  ExpectCleanExit(workers_[0], "worker", deadline_);
  for (auto& s : servers_) ExpectCleanExit(s, "server", deadline_);
  ASSERT_EQ(reference.value("status", ""), "ok");
  std::filesystem::rename(RunDir(), RunDir() + "-reference");

  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_TRUE(WaitForTraining(0)) << "worker 0 never trained";
  for (int victim = 0; victim < 2; ++victim) {
    const double killed_at = UnixNow();
    ASSERT_EQ(kill(servers_[static_cast<size_t>(victim)].pid(), SIGKILL), 0);
    EXPECT_TRUE(servers_[static_cast<size_t>(victim)].WaitExit(deadline_).ok());
    // Started again at once, as the launcher does: it waits until the old one is declared
    // dead, then gets its shards back.
    Result<itest::ChildProcess> p =
        StartServer(10 + victim, endpoint_, {"--id=" + std::to_string(victim)});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    servers_[static_cast<size_t>(victim)] = std::move(p).value();
    Result<json> whole = WaitForFailure(
        endpoint_, *coordinator_,
        [victim](const json& f) {
          return f.value("kind", "") == "server_lost" && f.value("server", -1) == victim &&
                 f.contains("rereplicated_unix_time");
        },
        deadline_);
    ASSERT_TRUE(whole.ok()) << "server " << victim
                            << " did not get its shards back: " << whole.status().ToString();
    std::printf(
        "server %d kill -9: promoted its backup after %.2f s, two copies again after %.2f s "
        "(hand back %llu bytes with a %.3f s pause, the predecessor's copy %llu bytes)\n",
        victim, whole->value("promoted_unix_time", 0.0) - killed_at,
        whole->value("rereplicated_unix_time", 0.0) - killed_at,
        static_cast<unsigned long long>(whole->value("handback_bytes", uint64_t{0})),
        whole->value("handback_pause_seconds", 0.0),
        static_cast<unsigned long long>(whole->value("predecessor_copy_bytes", uint64_t{0})));
    EXPECT_GT(whole->value("handback_bytes", uint64_t{0}), 10000u) << whole->dump();
    EXPECT_GT(whole->value("predecessor_copy_bytes", uint64_t{0}), 10000u) << whole->dump();
    ASSERT_FALSE(coordinator_->TryReap()) << "the job ended before the faults were done";
  }
  json summary = FinishJob();
  ExpectCleanExit(workers_[0], "worker", deadline_);
  for (auto& s : servers_) ExpectCleanExit(s, "restarted server", deadline_);
  ExpectEveryEpochCoveredOnce(summary, 5);
  EXPECT_EQ(summary.value("pushes_rolled_back", uint64_t{1}), 0u) << summary.dump();
  for (int s = 0; s < 2; ++s) {
    // Both restarted servers serve their own shards at the end (not "lost").
    EXPECT_EQ(summary["servers"][s].value("state", "serving"), "serving")
        << summary["servers"].dump();
  }
  std::printf("test loss %.9g (without the kills %.9g)\n", summary.value("test_loss", 0.0),
              reference.value("test_loss", 0.0));
  EXPECT_EQ(summary.value("test_loss", 0.0), reference.value("test_loss", 1.0));
  EXPECT_EQ(summary.value("test_accuracy", 0.0), reference.value("test_accuracy", 1.0));
  EXPECT_GT(summary.value("test_accuracy", 0.0), 0.5) << "the model trained";
}

}  // namespace
}  // namespace ps
