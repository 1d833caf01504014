// `ps_worker --standalone` against real jobs, and prefetching's staleness, on a small MLP
// (784-32-10) for one epoch of Fashion-MNIST (skips without the data):
//   - the standalone baseline's final model equals a one-worker BSP job's, bit for bit
//     (same test loss to the last digit);
//   - a one-worker job that prefetches reports every push but the first as exactly one
//     version stale (its own previous update arrived after the pull), and one that does
//     not prefetch reports none stale.
#include <gtest/gtest.h>
#include <strings.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "kernels/blas_core.h"
#include "kernels/kernels.h"
#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

#define SKIP_WITHOUT_FASHION_MNIST()                                                      \
  if (access(kTrainImages, R_OK) != 0) {                                                  \
    GTEST_SKIP() << kTrainImages << " is not here (scripts/install_deps.sh installs it)"; \
  }

// One epoch of a small MLP: about a second of compute.
// One epoch, at a quarter of the default's global batch of 512 (469 updates rather than 117,
// so the one-epoch model is clearly trained).
const std::vector<std::string> kJobFlags = {"--mlp_layers=784,32,10",  "--epochs=1",
                                            "--global_batch_size=128", "--num_workers=1",
                                            "--num_servers=1",         "--report_every_seconds=5"};

class StandaloneTest : public itest::JobTest {
 protected:
  std::string Flagfile() const { return itest::SourceDir() + "/configs/fashion_mnist_mlp.flags"; }

  // A job of 1 server and 1 worker with these extra job flags and worker flags.
  Result<json> RunJob(const std::vector<std::string>& extra,
                      const std::vector<std::string>& worker_flags) {
    const itest::Deadline deadline = itest::DeadlineIn(std::chrono::seconds(100));
    std::vector<std::string> flags = {"--flagfile=" + Flagfile()};
    flags.insert(flags.end(), kJobFlags.begin(), kJobFlags.end());
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::string endpoint;
    PS_ASSIGN_OR_RETURN(itest::ChildProcess coordinator,
                        StartCoordinator(flags, deadline, &endpoint));
    PS_ASSIGN_OR_RETURN(itest::ChildProcess server, StartServer(0, endpoint));
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--register_timeout_ms=30000"};
    argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    PS_ASSIGN_OR_RETURN(itest::ChildProcess worker,
                        itest::ChildProcess::Spawn(argv, dir_.Join("worker-0.log")));
    for (itest::ChildProcess* p : {&worker, &coordinator, &server}) {
      PS_ASSIGN_OR_RETURN(int rc, p->WaitExit(deadline));
      if (rc != 0) return Internal(p->log_path() + " exited with " + std::to_string(rc));
    }
    return ReadSummary();
  }

  // `ps_worker --standalone` with `env` ("NAME=VALUE", set for it alone) and `worker_flags`
  // on kJobFlags; its summary. With `comm`: the process's name once it has started training (after
  // any restart), read from /proc while it runs or before it is reaped.
  Result<json> RunStandalone(const std::vector<std::string>& env, const std::string& name,
                             std::string* comm = nullptr,
                             const std::vector<std::string>& worker_flags = {}) {
    std::string job_flags;
    for (const std::string& f : kJobFlags) job_flags += f + " ";
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "OPENBLAS_CORETYPE", "-u",
                                     "PS_BLAS_CORE_CHECK"};
    argv.insert(argv.end(), env.begin(), env.end());
    const std::string run_dir = dir_.Join(name);
    for (const std::string& a :
         {itest::BinaryPath("ps_worker"), std::string("--standalone"),
          "--job_flagfile=" + Flagfile(), "--job_flags=" + job_flags, "--run_dir=" + run_dir}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
    PS_ASSIGN_OR_RETURN(itest::ChildProcess p,
                        itest::ChildProcess::Spawn(argv, dir_.Join(name + ".log")));
    if (comm != nullptr) {
      const itest::Deadline started = itest::DeadlineIn(std::chrono::seconds(60));
      while (true) {
        Result<std::string> log = itest::ReadFile(p.log_path());
        if (log.ok() && log->find("standalone on ") != std::string::npos) break;
        if (std::chrono::steady_clock::now() > started) {
          return DeadlineExceeded("the standalone run did not start training within 60 s");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      // Not reaped yet (only WaitExit reaps), so /proc keeps the name even after an exit.
      PS_ASSIGN_OR_RETURN(*comm, itest::ReadFile("/proc/" + std::to_string(p.pid()) + "/comm"));
    }
    PS_ASSIGN_OR_RETURN(int rc, p.WaitExit(itest::DeadlineIn(std::chrono::seconds(100))));
    if (rc != 0) {
      return Internal("standalone exited with " + std::to_string(rc) + ": " +
                      itest::TailOfFile(p.log_path(), 30));
    }
    PS_ASSIGN_OR_RETURN(std::string text, itest::ReadFile(run_dir + "/summary.json"));
    return json::parse(text);
  }
};

// The OpenBLAS core a worker's summary names ("cpu: 1 threads, OpenBLAS SkylakeX").
std::string BlasCoreOf(const json& summary) {
  const std::string device = summary["workers"][0].value("device", "");
  const size_t at = device.find("OpenBLAS ");
  return at == std::string::npos ? "" : device.substr(at + 9);
}

TEST_F(StandaloneTest, MatchesAOneWorkerBspJobBitForBit) {
  SKIP_WITHOUT_FASHION_MNIST();
  Result<json> job = RunJob({"--staleness=0"}, {});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->value("status", ""), "ok") << job->dump();

  std::string job_flags;
  for (const std::string& f : kJobFlags) job_flags += f + " ";
  job_flags += "--staleness=0";
  const std::string run_dir = dir_.Join("standalone");
  Result<itest::ChildProcess> p = itest::ChildProcess::Spawn(
      {itest::BinaryPath("ps_worker"), "--standalone", "--job_flagfile=" + Flagfile(),
       "--job_flags=" + job_flags, "--run_dir=" + run_dir},
      dir_.Join("standalone.log"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<int> rc = p->WaitExit(itest::DeadlineIn(std::chrono::seconds(100)));
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  ASSERT_EQ(*rc, 0) << itest::TailOfFile(dir_.Join("standalone.log"), 30);
  Result<std::string> text = itest::ReadFile(run_dir + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  json alone = json::parse(*text);

  EXPECT_EQ(alone.value("mode", ""), "standalone");
  EXPECT_EQ(alone.value("status", ""), "ok");
  EXPECT_EQ(alone["examples_per_epoch"], json::array({60000}));
  EXPECT_EQ(alone.value("examples", 0), job->value("examples", 1));
  EXPECT_GT(alone.value("test_accuracy", 0.0), 0.75) << alone.dump();
  // Bit for bit: the same initial rows, order, gradients, rates and update rule.
  EXPECT_EQ(alone.value("test_loss", 0.0), job->value("test_loss", 1.0))
      << "standalone " << alone.dump() << "\njob " << job->dump();
  EXPECT_EQ(alone.value("test_accuracy", 0.0), job->value("test_accuracy", 1.0));
  // Both report where the time went.
  ASSERT_TRUE(alone["workers"][0].contains("step_seconds"));
  ASSERT_TRUE(job->at("workers")[0].contains("step_seconds")) << job->dump();
  EXPECT_GT(job->at("workers")[0]["step_seconds"].value("compute", 0.0), 0.0);
  EXPECT_GT(job->at("workers")[0]["step_seconds"].value("pull", 0.0), 0.0);
  EXPECT_EQ(job->at("workers")[0].value("prefetch", true), false) << "BSP never prefetches";
}

// --model=network too, dropout included: the worker's and the baseline's masks come from
// the same seed and step count.
TEST_F(StandaloneTest, ANetworkMatchesAOneWorkerBspJobBitForBit) {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string net =
      "--network=input:1x28x28,conv2d:4:5:stride=3,relu,flatten,dropout:0.25,dense:10,softmax_ce";
  Result<json> job = RunJob({"--staleness=0", "--model=network", net}, {});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->value("status", ""), "ok") << job->dump();
  std::string job_flags;
  for (const std::string& f : kJobFlags) job_flags += f + " ";
  job_flags += "--staleness=0 --model=network " + net;
  const std::string run_dir = dir_.Join("standalone");
  Result<itest::ChildProcess> p = itest::ChildProcess::Spawn(
      {itest::BinaryPath("ps_worker"), "--standalone", "--job_flagfile=" + Flagfile(),
       "--job_flags=" + job_flags, "--run_dir=" + run_dir},
      dir_.Join("standalone.log"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<int> rc = p->WaitExit(itest::DeadlineIn(std::chrono::seconds(100)));
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  ASSERT_EQ(*rc, 0) << itest::TailOfFile(dir_.Join("standalone.log"), 30);
  Result<std::string> text = itest::ReadFile(run_dir + "/summary.json");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  json alone = json::parse(*text);
  EXPECT_EQ(alone.value("status", ""), "ok");
  EXPECT_GT(alone.value("test_accuracy", 0.0), 0.75) << alone.dump();
  EXPECT_EQ(alone.value("test_loss", 0.0), job->value("test_loss", 1.0))
      << "standalone " << alone.dump() << "\njob " << job->dump();
  EXPECT_EQ(alone.value("test_accuracy", 0.0), job->value("test_accuracy", 1.0));
}

TEST_F(StandaloneTest, PrefetchMakesEachPushOneVersionStaleAndNoMore) {
  SKIP_WITHOUT_FASHION_MNIST();
  // SGD: a gradient one update stale under the default's Nesterov momentum 0.9 trains
  // poorly (README, worker flags), and this test is about the staleness, not the optimizer.
  Result<json> with = RunJob({"--staleness=1", "--optimizer=sgd"}, {"--prefetch=true"});
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  ASSERT_EQ(with->value("status", ""), "ok") << with->dump();
  EXPECT_EQ(with->at("workers")[0].value("prefetch", false), true);
  // One worker: the pull for step t + 1 leaves before step t's push on the same connection,
  // so it lacks exactly that push. Step 0's push is fresh (its pull was not prefetched).
  EXPECT_EQ(with->value("max_staleness_seen", 0), 1) << with->dump();
  EXPECT_GT(with->value("mean_staleness", 0.0), 0.99);
  EXPECT_LE(with->value("max_clock_lag_seen", 99), 1);
  EXPECT_GT(with->value("test_accuracy", 0.0), 0.75);

  Result<json> without = RunJob({"--staleness=1", "--optimizer=sgd"}, {"--prefetch=false"});
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(without->at("workers")[0].value("prefetch", true), false);
  EXPECT_EQ(without->value("max_staleness_seen", 1), 0) << without->dump();
}

// A worker runs the best kernels its CPU has, whatever OpenBLAS's own table says (OpenBLAS
// 0.3.21 gives CPUs newer than itself its SSE3 kernels); a user's OPENBLAS_CORETYPE stands.
// Every worker here starts without OPENBLAS_CORETYPE, whatever this test's environment holds.
TEST_F(StandaloneTest, RunsTheBestOpenBlasKernelsOfTheCpuUnlessTheUserChose) {
  SKIP_WITHOUT_FASHION_MNIST();
  const CpuFeatures cpu = ThisCpuFeatures();
  // OpenBLAS's own choice: a worker told not to check keeps it.
  Result<json> kept = RunStandalone({"PS_BLAS_CORE_CHECK=0"}, "kept");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  const std::string own_choice = BlasCoreOf(*kept);
  ASSERT_FALSE(own_choice.empty()) << kept->dump();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    EXPECT_EQ(own_choice, ChosenBlasCore()) << "this process has OpenBLAS's own choice too";
  }
  Result<std::string> kept_log = itest::ReadFile(dir_.Join("kept.log"));
  ASSERT_TRUE(kept_log.ok());
  EXPECT_EQ(kept_log->find("restarting with OPENBLAS_CORETYPE="), std::string::npos) << *kept_log;

  std::string comm;
  Result<json> chosen = RunStandalone({}, "default", &comm);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(comm, "ps_worker\n") << "a restart keeps the process's name (ps, top, pkill)";
  const std::string core = BlasCoreOf(*chosen);
  ASSERT_FALSE(core.empty()) << chosen->dump();
  EXPECT_EQ(BetterBlasCore(core, cpu), "")
      << "the worker ran OpenBLAS's " << core << " kernels on a CPU that runs "
      << BestBlasCoreFor(cpu) << "; OpenBLAS chose " << own_choice;
  // Where OpenBLAS chose worse, the worker restarted and said why; otherwise it did not.
  const bool restarted = !BetterBlasCore(own_choice, cpu).empty();
  Result<std::string> log = itest::ReadFile(dir_.Join("default.log"));
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->find("restarting with OPENBLAS_CORETYPE=") != std::string::npos, restarted)
      << *log;

  Result<json> forced = RunStandalone({"OPENBLAS_CORETYPE=Prescott"}, "forced");
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_EQ(strcasecmp(BlasCoreOf(*forced).c_str(), "Prescott"), 0) << forced->dump();
  // Other kernels sum in another order, so the models differ in the last bits only.
  EXPECT_NEAR(forced->value("test_accuracy", 0.0), chosen->value("test_accuracy", 1.0), 0.01);
}

// On the GPU the standalone run keeps its model, optimizer state and gradients in device
// memory (worker/standalone.h): one epoch trains as on the CPU, within the rounding of
// other kernels. Skipped where no GPU is visible.
TEST_F(StandaloneTest, OnTheGpuTrainsAsOnTheCpu) {
  SKIP_WITHOUT_FASHION_MNIST();
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  Result<json> cpu = RunStandalone({}, "cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  Result<json> gpu = RunStandalone({}, "gpu", nullptr, {"--device=cuda"});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->value("status", ""), "ok") << gpu->dump();
  EXPECT_NE(gpu->at("workers")[0].value("device", "").find("(cuda:"), std::string::npos)
      << gpu->dump();
  EXPECT_NEAR(gpu->value("test_accuracy", 0.0), cpu->value("test_accuracy", 1.0), 0.01);
  EXPECT_NEAR(gpu->value("test_loss", 0.0), cpu->value("test_loss", 1.0),
              0.02 * cpu->value("test_loss", 1.0));
}

}  // namespace
}  // namespace ps
