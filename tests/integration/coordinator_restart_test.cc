// The coordinator killed with -9 mid-run (twice) and started again with --resume (by hand, and by
// launch_local.sh) resumes the job from its journal (server/coordinator.h, "Restart"):
// real ps_coordinator, ps_server and ps_worker processes on 127.0.0.1 training a small MLP
// on Fashion-MNIST (skipped without the data).
//
// The job has one worker under BSP: its training is then the same computation whoever
// coordinates it (the chunks come in the same order, every push is applied in order), so a
// restart that loses no acknowledged push, trains no example twice and skips none ends with
// the unfaulted run's model, and the same test accuracy. The tolerance (0.002, 20 of the
// 10,000 test images) covers only the float order of the servers' apply threads; a chunk
// lost or trained twice shows in examples_per_epoch, which must be exactly 60,000.
// Kill-to-resume times are printed, for the record.
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
constexpr std::chrono::seconds kJobTimeout{150};
constexpr int64_t kKillAtClock = 250;  // (and twice that) of about 940 in the epoch
constexpr double kAccuracyTolerance = 0.002;

#define SKIP_WITHOUT_FASHION_MNIST()                                                      \
  if (access(kTrainImages, R_OK) != 0) {                                                  \
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)"; \
  }

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> JobFlags() {
  return {"--num_servers=2",
          "--num_workers=1",
          "--epochs=1",
          "--global_batch_size=64",  // one worker: 938 clocks in the epoch
          "--mlp_layers=784,32,10",
          "--staleness=0",
          "--replicas=1",
          "--chunk_examples=2048",
          "--base_lr=0.1",
          "--report_every_seconds=0.2",
          "--heartbeat_timeout=2",
          "--coordinator_restart_timeout=60"};
}

// The largest clock in the train lines of `run_dir`/metrics.jsonl written after `after`
// (Unix seconds); -1 when none.
int64_t LatestClock(const std::string& run_dir, double after = 0) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  int64_t clock = -1;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "train" && j.value("time", 0.0) > after) {
      clock = std::max(clock, j.value("clock", int64_t{-1}));
    }
  }
  return clock;
}

json CoordinatorRestart(const json& summary) {
  for (const json& e : summary.value("failures", json::array())) {
    if (e.value("kind", "") == "coordinator_restart") return e;
  }
  return json();
}

class CoordinatorRestartTest : public itest::JobTest {
 protected:
  // A whole job in `run_dir`: the coordinator, two servers, one worker. At each clock of
  // `kill_at`, the coordinator is killed (-9) once the worker reported that clock, and
  // started again with --resume at the same endpoint. Returns summary.json. The times are
  // of the first kill.
  json RunJob(const std::string& run_dir, const std::vector<int64_t>& kills) {
    const itest::Deadline deadline = itest::DeadlineIn(kJobTimeout);
    std::vector<std::string> flags = JobFlags();
    flags.push_back("--run_dir=" + run_dir);
    std::string endpoint;
    Result<itest::ChildProcess> c = StartCoordinator(flags, deadline, &endpoint);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return json();
    std::optional<itest::ChildProcess> coordinator(std::move(c).value());
    std::vector<itest::ChildProcess> procs;
    for (int s = 0; s < 2; ++s) {
      Result<itest::ChildProcess> p = StartServer(s, endpoint, {"--id=" + std::to_string(s)});
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (p.ok()) procs.push_back(std::move(p).value());
    }
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--register_timeout_ms=30000", "--id=0"};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    Result<itest::ChildProcess> w = itest::ChildProcess::Spawn(argv, dir_.Join("worker-0.log"));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return json();
    for (const int64_t kill_at : kills) {
      const bool first = kill_at == kills.front();
      while (LatestClock(run_dir) < kill_at && SteadyClock::now() < deadline &&
             !coordinator->TryReap()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      EXPECT_GE(LatestClock(run_dir), kill_at) << "the job did not reach the clock to kill at";
      if (first) killed_at_ = UnixNow();
      coordinator->Kill();
      // Down for a moment: the worker's requests meanwhile wait, then are sent again.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (first) {
        flags.push_back("--listen=" + endpoint);
        flags.push_back("--resume");
      }
      const double restarted = UnixNow();
      if (first) restarted_at_ = restarted;
      Result<itest::ChildProcess> again = StartCoordinator(flags, deadline, &endpoint);
      EXPECT_TRUE(again.ok()) << again.status().ToString();
      if (!again.ok()) return json();
      coordinator.emplace(std::move(again).value());
      // The job goes on: a train line past the kill's clock, written after the restart.
      while (LatestClock(run_dir, restarted) <= kill_at && SteadyClock::now() < deadline &&
             !coordinator->TryReap()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (first) going_on_at_ = UnixNow();
    }
    ExpectCleanExit(*coordinator, "coordinator", deadline);
    ExpectCleanExit(*w, "worker", deadline);
    for (size_t s = 0; s < procs.size(); ++s) {
      ExpectCleanExit(procs[s], "server " + std::to_string(s), deadline);
    }
    Result<std::string> text = itest::ReadFile(run_dir + "/summary.json");
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    return text.ok() ? json::parse(*text, nullptr, false) : json();
  }

  double killed_at_ = 0, restarted_at_ = 0, going_on_at_ = 0;
};

TEST_F(CoordinatorRestartTest, AKilledCoordinatorResumesTheJobToTheUnfaultedAccuracy) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto start = SteadyClock::now();
  const json clean = RunJob(dir_.Join("clean"), {});
  ASSERT_TRUE(clean.is_object());
  ASSERT_EQ(clean.value("status", ""), "ok") << clean.dump();
  const double clean_seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();

  // Killed twice: the second coordinator resumes from the journal the first resumed one
  // kept.
  const json faulted = RunJob(dir_.Join("faulted"), {kKillAtClock, 2 * kKillAtClock});
  ASSERT_TRUE(faulted.is_object());
  EXPECT_EQ(faulted.value("status", ""), "ok") << faulted.dump();
  const json restart = CoordinatorRestart(faulted);
  ASSERT_TRUE(restart.is_object()) << "the restart is not listed: " << faulted.dump();
  EXPECT_EQ(restart.value("process", ""), "coordinator");
  EXPECT_GE(restart.value("clock", int64_t{-1}), kKillAtClock) << restart.dump();
  EXPECT_GT(restart.value("time", 0.0), 0.0) << restart.dump();
  EXPECT_GE(restart.value("unix_time", 0.0), restarted_at_) << restart.dump();
  int restarts = 0;
  for (const json& e : faulted.value("failures", json::array())) {
    restarts += e.value("kind", "") == "coordinator_restart" ? 1 : 0;
  }
  EXPECT_EQ(restarts, 2) << faulted.dump();
  // Every example once: no chunk lost with the coordinator, none handed out twice.
  EXPECT_EQ(faulted["examples_per_epoch"], json(std::vector<uint64_t>{60000})) << faulted.dump();
  EXPECT_EQ(faulted.value("pushes_lost", uint64_t{1}), 0u) << faulted.dump();
  ASSERT_EQ(faulted["workers"].size(), 1u);
  EXPECT_EQ(faulted["workers"][0].value("state", ""), "finished") << faulted.dump();
  const double clean_accuracy = clean.value("test_accuracy", 0.0);
  const double accuracy = faulted.value("test_accuracy", 0.0);
  EXPECT_GT(clean_accuracy, 0.6) << "the model trained";
  EXPECT_NEAR(accuracy, clean_accuracy, kAccuracyTolerance);
  std::printf(
      "coordinator kill -9 at clock %lld, restarted %.2f s later: restart listed %.2f s after "
      "the kill, training went on (a train line past the kill's clock) %.2f s after the "
      "kill; test accuracy %.4f (unfaulted %.4f); unfaulted job %.1f s, test %.1f s\n",
      static_cast<long long>(restart.value("clock", int64_t{-1})), restarted_at_ - killed_at_,
      restart.value("unix_time", 0.0) - killed_at_, going_on_at_ - killed_at_, accuracy,
      clean_accuracy, clean_seconds,
      std::chrono::duration<double>(SteadyClock::now() - start).count());
}

// launch_local.sh restarts a coordinator killed by a signal (at the same endpoint, with
// --resume); the job completes with the restart listed.
TEST_F(CoordinatorRestartTest, TheLauncherRestartsAKilledCoordinator) {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string run_dir = dir_.Join("launched");
  std::vector<std::string> args = {"--servers", "2", "--workers", "1", "--"};
  for (const std::string& f : JobFlags()) {
    if (f.rfind("--num_", 0) != 0) args.push_back(f);
  }
  const itest::Deadline deadline = itest::DeadlineIn(kJobTimeout);
  pid_t killed = 0;
  std::thread killer([&] {
    while (SteadyClock::now() < deadline && killed == 0) {
      if (LatestClock(run_dir) >= kKillAtClock) {
        for (const itest::ProcessInfo& p : itest::ScanProcesses()) {
          if (p.comm == "ps_coordinator" && p.state != 'Z' &&
              p.cmdline.find(run_dir) != std::string::npos && kill(p.pid, SIGKILL) == 0) {
            killed = p.pid;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Result<itest::LaunchResult> r =
      itest::RunLaunchLocal(args, run_dir, dir_.Join("launch.log"), kJobTimeout);
  killer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(killed, 0) << "the coordinator was not found to kill\n" << r->logs;
  EXPECT_EQ(r->exit_status, 0) << r->logs;
  EXPECT_TRUE(r->leftovers.empty()) << itest::Describe(r->leftovers);
  ASSERT_TRUE(r->summary.is_object()) << r->logs;
  EXPECT_EQ(r->summary.value("status", ""), "ok") << r->summary.dump();
  const json restart = CoordinatorRestart(r->summary);
  ASSERT_TRUE(restart.is_object()) << r->summary.dump();
  EXPECT_NE(restart.value("pid", 0u), static_cast<uint32_t>(killed)) << restart.dump();
  EXPECT_EQ(r->summary["examples_per_epoch"], json(std::vector<uint64_t>{60000}));
  std::printf("launch_local.sh: coordinator killed at clock >= %lld and restarted; job %.1f s\n",
              static_cast<long long>(kKillAtClock), r->seconds);
}

}  // namespace
}  // namespace ps
