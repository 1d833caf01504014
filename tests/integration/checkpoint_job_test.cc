// Checkpoint and restore across processes: a real ps_coordinator and ps_server with an
// in-test BSP worker; the server checkpoints every clock, is killed with SIGKILL, and a new
// job started with --restore=latest serves exactly the weights of the last checkpoint
// (its spilled rows included).
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/registration.h"
#include "server/checkpoint.h"
#include "tests/integration/job_test_util.h"
#include "tests/integration/process.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

using itest::ChildProcess;
using itest::Deadline;
using itest::DeadlineIn;
using itest::TimeLeft;

class CheckpointJobTest : public itest::JobTest {
 protected:
  // A server whose spill databases live in the test's directory: SIGKILL leaves them
  // behind, and the test directory is removed at the end.
  Result<ChildProcess> StartSpillingServer(const std::string& coordinator) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_server"), "--coordinator=" + coordinator,
                                     "--listen=tcp://127.0.0.1:*", "--register_timeout_ms=30000",
                                     "--spill_dir=" + dir_.Join("spill")};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    return ChildProcess::Spawn(argv, dir_.Join("server-0.log"));
  }

  // train.svm (2000 examples, 1000 features) and test.svm (500) in the test's directory.
  void MakeSparseData(itest::Deadline deadline) {
    Result<ChildProcess> gen = ChildProcess::Spawn(
        {itest::BinaryPath("ps_make_sparse_data"), "--features=1000", "--examples=2000", "--nnz=10",
         "--seed=7", "--out=" + dir_.Join("train.svm"), "--test_out=" + dir_.Join("test.svm"),
         "--test_examples=500"},
        dir_.Join("gen.log"));
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    Result<int> gen_rc = gen->WaitExit(deadline);
    ASSERT_TRUE(gen_rc.ok() && *gen_rc == 0);
  }

  // A coordinator with `flags`, one server and one ps_worker slowed down `slowdown` times,
  // appended to *procs in that order.
  void StartSparseJob(const std::vector<std::string>& flags, const std::string& slowdown,
                      itest::Deadline deadline, std::vector<ChildProcess>* procs) {
    std::string endpoint;
    Result<ChildProcess> coordinator = StartCoordinator(flags, deadline, &endpoint);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    procs->push_back(std::move(*coordinator));
    Result<ChildProcess> server = StartServer(0, endpoint);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    procs->push_back(std::move(*server));
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--register_timeout_ms=30000", "--slowdown=" + slowdown};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    Result<ChildProcess> worker = ChildProcess::Spawn(argv, dir_.Join("worker-0.log"));
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    procs->push_back(std::move(*worker));
  }

  // Until metrics.jsonl has a train line (training is under way).
  void WaitForTraining(itest::Deadline deadline) {
    for (;;) {
      ASSERT_LT(itest::SteadyClock::now(), deadline) << "the job never trained";
      Result<std::string> m = itest::ReadFile(RunDir() + "/metrics.jsonl");
      if (m.ok() && m->find("\"kind\":\"train\"") != std::string::npos) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Starts the job again with --restore=latest (the first run's directory moved aside) at
  // full speed and returns its summary once every process exited cleanly.
  Result<itest::json> RestoreLatestAndFinish(std::vector<std::string> job,
                                             itest::Deadline deadline) {
    std::filesystem::rename(RunDir(), dir_.Join("run1"));
    job.push_back("--restore=latest");
    std::vector<ChildProcess> procs;
    StartSparseJob(job, "1", deadline, &procs);
    if (procs.size() != 3) return Internal("the restored job did not start");
    ExpectCleanExit(procs[2], "worker", deadline);
    ExpectCleanExit(procs[0], "coordinator", deadline);
    ExpectCleanExit(procs[1], "server", deadline);
    return ReadSummary();
  }

  // Sparse LR on that data, 1 worker, BSP, 4 epochs, a checkpoint every epoch (or every
  // `checkpoint_every` clocks; 0: none but on SIGTERM): 2000 examples in batches of 100
  // are 20 clocks an epoch, so clock 20k ends epoch k.
  std::vector<std::string> SparseLrJob(const std::string& ckpt, int checkpoint_every = 20) {
    return {"--model=sparse_lr",
            "--train_data=" + dir_.Join("train.svm"),
            "--test_data=" + dir_.Join("test.svm"),
            "--hash_features=false",
            "--num_servers=1",
            "--num_workers=1",
            "--staleness=0",
            "--epochs=4",
            "--batch_size=100",
            "--chunk_examples=500",
            "--optimizer=adagrad",
            "--base_lr=0.2",
            "--lr_policy=exp",
            "--gamma=0.99",
            "--epsilon=1e-6",
            "--report_every_seconds=1e-6",
            "--checkpoint_every=" + std::to_string(checkpoint_every),
            "--checkpoint_dir=" + ckpt};
  }
};

constexpr uint32_t kWidth = 4;

// The latest clock in checkpoints.json (0: none).
int64_t RecordedClock(const std::string& ckpt) {
  std::ifstream in(CheckpointRecordFile(ckpt));
  itest::json j = itest::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("sets") || j["sets"].empty()) return 0;
  return j["sets"].back().value("clock", int64_t{0});
}

Status WaitForRecordedClock(const std::string& ckpt, int64_t clock, Deadline deadline) {
  while (RecordedClock(ckpt) < clock) {
    if (itest::SteadyClock::now() > deadline) return DeadlineExceeded("checkpoint not recorded");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Ok();
}

std::vector<uint64_t> Keys() {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 3000; ++k) keys.push_back(k * 104729 + 11);
  return keys;
}

struct Worker {
  Registration reg;
  std::unique_ptr<KVClient> client;
};

Result<Worker> Join(Transport* t, const std::string& coordinator, Deadline deadline) {
  RegisterRequest req;
  req.device = "test thread";
  Worker w;
  PS_ASSIGN_OR_RETURN(w.reg, RegisterWithCoordinator(t, coordinator, req, TimeLeft(deadline)));
  KVClientOptions o;
  o.client_id = w.reg.id;
  o.request_timeout = std::chrono::seconds(30);
  PS_ASSIGN_OR_RETURN(w.client, KVClient::Create(t, w.reg.config, w.reg.server_endpoints, o));
  return w;
}

TEST_F(CheckpointJobTest, KilledServerRestartsFromTheLatestCheckpoint) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(60));
  const std::string ckpt = dir_.Join("checkpoints");
  const std::vector<std::string> job = {
      "--model=none",
      "--tables=emb:sparse:4:normal:0.1",
      "--num_servers=1",
      "--num_workers=1",
      "--staleness=0",
      "--optimizer=adam",
      "--base_lr=0.01",
      "--checkpoint_every=1",
      "--checkpoint_dir=" + ckpt,
      "--memory_budget=256KB"};  // ~1k rows in memory: most of the 3000 spill
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> at_checkpoint(keys.size() * kWidth);
  Transport transport(ClientTransportOptions());
  {
    std::string endpoint;
    Result<ChildProcess> coordinator = StartCoordinator(job, deadline, &endpoint);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    Result<ChildProcess> server = StartSpillingServer(endpoint);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    Result<Worker> w = Join(&transport, endpoint, deadline);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    KVClient& c = *w->client;
    std::vector<float> grad(keys.size() * kWidth), seen(keys.size() * kWidth);
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE(c.Wait(c.Pull(0, keys, seen)).ok());
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = seen[i] * 0.5f + 0.01f * step;
      ASSERT_TRUE(c.Wait(c.Push(0, keys, grad)).ok());
      // The server writes the clock's checkpoint before it answers the tick.
      ASSERT_TRUE(c.Wait(c.Clock()).ok());
    }
    ASSERT_TRUE(std::filesystem::exists(CheckpointFile(ckpt, 3, 0)));
    // The coordinator records the set once the server reported it (--restore=latest
    // takes the latest recorded set).
    ASSERT_TRUE(WaitForRecordedClock(ckpt, 3, deadline).ok());
    ASSERT_TRUE(c.Wait(c.Pull(0, keys, at_checkpoint)).ok());
    // A push after the checkpoint: lost with the server, as it should be.
    ASSERT_TRUE(c.Wait(c.Push(0, keys, grad)).ok());
    server->Kill();
    coordinator->Kill();
  }
  // A checkpoint being written when the server died: never renamed into place.
  std::filesystem::create_directories(ckpt + "/clock-000000000004");
  std::filesystem::copy_file(CheckpointFile(ckpt, 3, 0), CheckpointFile(ckpt, 4, 0) + ".tmp");

  std::filesystem::remove(dir_.Join("ep"));  // the first coordinator's endpoint file
  std::vector<std::string> again = job;
  again.push_back("--restore=latest");
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(again, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Result<ChildProcess> server = StartSpillingServer(endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<Worker> w = Join(&transport, endpoint, deadline);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<float> restored(keys.size() * kWidth, -1.0f);
  ASSERT_TRUE(w->client->Wait(w->client->Pull(0, keys, restored)).ok());
  EXPECT_EQ(std::memcmp(restored.data(), at_checkpoint.data(), restored.size() * sizeof(float)), 0);
  server->Kill();
  coordinator->Kill();
}

// --checkpoint_every=1s: the coordinator names the clocks; both servers write their files
// at the same clock, and the set gets recorded, while the worker never stops.
TEST_F(CheckpointJobTest, CheckpointsBySecondsMakeWholeSetsAcrossServers) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(90));
  const std::string ckpt = dir_.Join("checkpoints");
  const std::vector<std::string> job = {
      "--model=none", "--tables=d:64:4:uniform:1,emb:sparse:4:normal:0.1", "--num_servers=2",
      "--num_workers=1", "--staleness=0", "--optimizer=sgd", "--base_lr=0.01",
      "--checkpoint_every=1s", "--checkpoint_dir=" + ckpt,
      // the in-test worker sends no heartbeats
      "--heartbeat_timeout=600"};
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(job, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Result<ChildProcess> s0 = StartServer(0, endpoint);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  Result<ChildProcess> s1 = StartServer(1, endpoint);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  Transport transport(ClientTransportOptions());
  Result<Worker> w = Join(&transport, endpoint, deadline);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  KVClient& c = *w->client;
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> grad(keys.size() * kWidth, 0.01f), seen(keys.size() * kWidth);
  // Steps until a set is recorded: the coordinator names a clock about a second in, a few
  // seconds of steps ahead; both servers write it and report it.
  int64_t steps = 0;
  while (RecordedClock(ckpt) == 0) {
    ASSERT_LT(itest::SteadyClock::now(), deadline)
        << "no checkpoint recorded after " << steps << " steps";
    Status pulled = c.Wait(c.Pull(1, keys, seen));
    ASSERT_TRUE(pulled.ok()) << pulled.ToString();
    Status pushed = c.Wait(c.Push(1, keys, grad));
    ASSERT_TRUE(pushed.ok()) << pushed.ToString();
    Status ticked = c.Wait(c.Clock());
    ASSERT_TRUE(ticked.ok()) << ticked.ToString();
    ++steps;
  }
  const int64_t recorded = RecordedClock(ckpt);
  ASSERT_GT(recorded, 0);
  // Both servers' files stand at the recorded clock, whole (CRC checked on open).
  for (int server = 0; server < 2; ++server) {
    Result<CheckpointReader> r = CheckpointReader::Open(CheckpointFile(ckpt, recorded, server));
    EXPECT_TRUE(r.ok()) << "server " << server << ": " << r.status().ToString();
  }
  // Every set directory holds both servers' files: the servers wrote the same clocks.
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
    if (!e.is_directory()) continue;
    EXPECT_TRUE(std::filesystem::exists(e.path() / "server-0.ckpt")) << e.path();
    EXPECT_TRUE(std::filesystem::exists(e.path() / "server-1.ckpt")) << e.path();
  }
  s0->Kill();
  s1->Kill();
  coordinator->Kill();
}

// A whole job (ps_worker training sparse LR, 1 worker, BSP) that checkpoints at every epoch
// boundary; then the job is started again from the set at clock 40 as if it had been
// killed there (the record cut back to it, a later set half-written, a newer one whole but
// unrecorded): it must resume at epoch 3 and clock 40 with the schedule's LR there, train
// the remaining epochs only, and end with the uninterrupted run's model.
TEST_F(CheckpointJobTest, RestartedJobResumesAtTheRecordedEpochClockAndLearningRate) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(80));
  ASSERT_NO_FATAL_FAILURE(MakeSparseData(deadline));
  const std::string ckpt = dir_.Join("checkpoints");
  const std::vector<std::string> job = SparseLrJob(ckpt);
  auto run_job = [&](const std::vector<std::string>& flags, const std::string& export_dir) {
    std::string endpoint;
    Result<ChildProcess> coordinator = StartCoordinator(flags, deadline, &endpoint);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    Result<ChildProcess> server = StartServer(0, endpoint, {"--export_dir=" + export_dir});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    std::vector<std::string> argv = {itest::BinaryPath("ps_worker"), "--coordinator=" + endpoint,
                                     "--register_timeout_ms=30000"};
    for (std::string& f : SecurityFlags()) argv.push_back(std::move(f));
    Result<ChildProcess> worker = ChildProcess::Spawn(argv, dir_.Join("worker-0.log"));
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    ExpectCleanExit(*worker, "worker", deadline);
    ExpectCleanExit(*coordinator, "coordinator", deadline);
    ExpectCleanExit(*server, "server", deadline);
  };
  auto rate = [](int64_t clock) { return 0.2 * std::pow(0.99, static_cast<double>(clock)); };
  run_job(job, dir_.Join("export1"));
  if (HasFatalFailure()) return;
  std::filesystem::rename(RunDir(), dir_.Join("run1"));

  std::ifstream record_in(CheckpointRecordFile(ckpt));
  itest::json record = itest::json::parse(record_in, nullptr, false);
  ASSERT_TRUE(record.is_object()) << "no checkpoints.json";
  std::vector<int64_t> clocks;
  for (const itest::json& e : record["sets"]) {
    const int64_t c = e["clock"].get<int64_t>();
    clocks.push_back(c);
    EXPECT_EQ(e["epoch"].get<int>(), c / 20 + 1) << e.dump();
    EXPECT_NEAR(e["learning_rate"].get<double>(), rate(c), 1e-12) << e.dump();
  }
  ASSERT_EQ(clocks, (std::vector<int64_t>{20, 40, 60, 80})) << record.dump();

  // As if killed after clock 60's file was being written: the record ends at 40, the set
  // at 60 lacks its file, the one at 80 is whole but was never recorded.
  itest::json cut = {{"sets", itest::json::array({record["sets"][0], record["sets"][1]})}};
  std::ofstream(CheckpointRecordFile(ckpt)) << cut.dump();
  std::filesystem::remove(CheckpointFile(ckpt, 60, 0));

  std::vector<std::string> again = job;
  again.push_back("--restore=latest");
  run_job(again, dir_.Join("export2"));
  if (HasFatalFailure()) return;
  Result<itest::json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ((*summary)["restored"]["clock"], 40) << summary->dump();
  EXPECT_EQ((*summary)["restored"]["epoch"], 3) << summary->dump();
  EXPECT_EQ((*summary)["epochs"], 4);
  EXPECT_EQ((*summary)["examples_per_epoch"], itest::json::array({0, 0, 2000, 2000}));
  // metrics.jsonl: training resumed at epoch 3 from clock 40, on the schedule.
  std::ifstream metrics(RunDir() + "/metrics.jsonl");
  std::string line;
  int train_lines = 0, lr_lines = 0;
  int64_t last_clock = 0;
  while (std::getline(metrics, line)) {
    itest::json j = itest::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("kind", "") != "train") continue;
    const int64_t c = j["clock"].get<int64_t>();
    if (train_lines++ == 0) {
      EXPECT_EQ(j["epoch"], 3) << line;
      EXPECT_EQ(c, 41) << line;
    }
    EXPECT_GE(j["epoch"].get<int>(), 3) << line;
    EXPECT_GT(c, 40) << line;
    // The LR of the latest acknowledged push (0: none yet), the schedule at a clock just
    // before the report's (pushes are acknowledged asynchronously): never the schedule's
    // start again.
    const double lr = j["lr"].get<double>();
    if (lr > 0) {
      ++lr_lines;
      bool on_schedule = false;
      for (int64_t k = c - 3; k <= c; ++k) on_schedule |= std::abs(lr / rate(k) - 1) < 1e-6;
      EXPECT_TRUE(on_schedule) << line << " vs " << rate(c - 2);
    }
    last_clock = std::max(last_clock, c);
  }
  EXPECT_GT(lr_lines, 30);
  EXPECT_EQ(last_clock, 80);
  // The checkpoint lies on an epoch boundary: nothing is replayed, so the model is the
  // uninterrupted run's, bit for bit.
  std::ifstream a(dir_.Join("export1/server-0.safetensors"), std::ios::binary);
  std::ifstream b(dir_.Join("export2/server-0.safetensors"), std::ios::binary);
  std::string bytes_a((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
  std::string bytes_b((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(bytes_a.empty());
  EXPECT_TRUE(bytes_a == bytes_b) << "the resumed run's model differs from the uninterrupted one";
}

// The same job killed for real: every process gets SIGKILL once a set past clock 40 is
// recorded (the worker is slowed down so that the job is still running then); the job
// started again with --restore=latest resumes at the latest recorded set's clock and epoch
// and trains the remaining epochs only.
TEST_F(CheckpointJobTest, KilledJobRestartsAtTheLatestRecordedSet) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(100));
  ASSERT_NO_FATAL_FAILURE(MakeSparseData(deadline));
  const std::string ckpt = dir_.Join("checkpoints");
  std::vector<std::string> job = SparseLrJob(ckpt);
  {
    std::vector<ChildProcess> procs;
    StartSparseJob(job, "2000", deadline, &procs);
    if (HasFatalFailure()) return;
    ASSERT_TRUE(WaitForRecordedClock(ckpt, 40, deadline).ok());
    for (ChildProcess& p : procs) p.Kill();
  }
  const int64_t recorded = RecordedClock(ckpt);
  ASSERT_GE(recorded, 40);
  ASSERT_LT(recorded, 80) << "the job ended before it was killed";
  Result<itest::json> summary = RestoreLatestAndFinish(job, deadline);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  const int epoch = static_cast<int>(recorded / 20) + 1;
  EXPECT_EQ((*summary)["restored"]["clock"], recorded) << summary->dump();
  EXPECT_EQ((*summary)["restored"]["epoch"], epoch) << summary->dump();
  itest::json per_epoch = (*summary)["examples_per_epoch"];
  ASSERT_EQ(per_epoch.size(), 4u);
  for (int e = 1; e <= 4; ++e) EXPECT_EQ(per_epoch[e - 1], e < epoch ? 0 : 2000) << e;
  std::ifstream metrics(RunDir() + "/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) {
    itest::json j = itest::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("kind", "") != "train") continue;
    EXPECT_EQ(j["epoch"], epoch) << line;  // the first line: where the job resumed
    EXPECT_EQ(j["clock"], recorded + 1) << line;
    break;
  }
}

// SIGTERM to the coordinator of a running job with a --checkpoint_dir (and no periodic
// checkpoints): it names a last set, trains on until the server wrote it and it is
// recorded, then tells the worker (in a heartbeat reply) that the job stops: the worker
// leaves as on its own SIGTERM and exits cleanly, long before it would have given up on
// a silent coordinator (3 x --heartbeat_timeout + --coordinator_restart_timeout, 66 s
// here). The job started again with --restore=latest resumes at the set.
TEST_F(CheckpointJobTest, SigtermStopsTheJobAtARecordedCheckpointSet) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(100));
  ASSERT_NO_FATAL_FAILURE(MakeSparseData(deadline));
  const std::string ckpt = dir_.Join("checkpoints");
  std::vector<std::string> job = SparseLrJob(ckpt, /*checkpoint_every=*/0);
  job.push_back("--heartbeat_timeout=2");
  {
    std::vector<ChildProcess> procs;
    // Slow enough (80 clocks in ~8 s here) that the set named on SIGTERM, or the one named
    // again should the server pass the first before it hears of it, lies within the job.
    StartSparseJob(job, "4000", deadline, &procs);
    if (HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(WaitForTraining(deadline));
    ASSERT_EQ(RecordedClock(ckpt), 0) << "no set before the signal";
    ASSERT_EQ(kill(procs[0].pid(), SIGTERM), 0);
    Result<int> rc = procs[0].WaitExit(deadline);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    ExpectCleanExit(procs[1], "server", deadline);
    ExpectCleanExit(procs[2], "worker", std::min(deadline, DeadlineIn(std::chrono::seconds(30))));
  }
  const int64_t recorded = RecordedClock(ckpt);
  ASSERT_GT(recorded, 0) << "SIGTERM recorded no checkpoint set";
  ASSERT_LT(recorded, 80) << "the job ended before the signal";
  // The stopped job's summary: the stop set is its one recorded set (no periodic ones).
  Result<itest::json> stopped = ReadSummary();
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ((*stopped)["last_recorded_checkpoint_clock"], recorded) << stopped->dump();
  EXPECT_EQ((*stopped)["checkpoints_recorded"], 1) << stopped->dump();
  Result<itest::json> summary = RestoreLatestAndFinish(job, deadline);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ((*summary)["restored"]["clock"], recorded) << summary->dump();
  const int epoch = static_cast<int>(recorded / 20) + 1;
  EXPECT_EQ((*summary)["restored"]["epoch"], epoch) << summary->dump();
  itest::json per_epoch = (*summary)["examples_per_epoch"];
  ASSERT_EQ(per_epoch.size(), 4u);
  for (int e = 1; e <= 4; ++e) EXPECT_EQ(per_epoch[e - 1], e < epoch ? 0 : 2000) << e;
}

// SIGTERM to the coordinator of a job with no --checkpoint_dir: it stops at once, and the
// worker, told so in a heartbeat reply, leaves and exits cleanly well before it would have
// given up on a silent coordinator (66 s here); the server is shut down.
TEST_F(CheckpointJobTest, SigtermWithoutCheckpointsSendsTheWorkerHome) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(60));
  ASSERT_NO_FATAL_FAILURE(MakeSparseData(deadline));
  std::vector<std::string> job = SparseLrJob(/*ckpt=*/"", /*checkpoint_every=*/0);
  job.push_back("--heartbeat_timeout=2");
  std::vector<ChildProcess> procs;
  StartSparseJob(job, "4000", deadline, &procs);
  if (HasFatalFailure()) return;
  ASSERT_NO_FATAL_FAILURE(WaitForTraining(deadline));
  ASSERT_EQ(kill(procs[0].pid(), SIGTERM), 0);
  Result<int> rc = procs[0].WaitExit(deadline);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_NE(*rc, 0) << "a stopped job is not a finished one";
  ExpectCleanExit(procs[1], "server", deadline);
  ExpectCleanExit(procs[2], "worker", std::min(deadline, DeadlineIn(std::chrono::seconds(30))));
  Result<itest::json> summary = ReadSummary();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_NE(summary->dump().find("stopped by signal"), std::string::npos) << summary->dump();
}

// kill -9 of the coordinator, not restarted: nobody will shut the others down, so each
// notices that its heartbeats go unanswered (3 x --heartbeat_timeout, plus
// --coordinator_restart_timeout, 0 here) and stops as on SIGTERM: the server writes its
// shard at its clock, the worker drains; both exit within a bound.
TEST_F(CheckpointJobTest, AKilledCoordinatorStopsTheServerAndTheWorker) {
  const Deadline deadline = DeadlineIn(std::chrono::seconds(60));
  ASSERT_NO_FATAL_FAILURE(MakeSparseData(deadline));
  const std::string ckpt = dir_.Join("checkpoints");
  std::vector<std::string> job = SparseLrJob(ckpt, /*checkpoint_every=*/0);
  job.push_back("--heartbeat_timeout=1");
  job.push_back("--coordinator_restart_timeout=0");
  std::vector<ChildProcess> procs;
  StartSparseJob(job, "2000", deadline, &procs);
  if (HasFatalFailure()) return;
  ASSERT_NO_FATAL_FAILURE(WaitForTraining(deadline));
  const auto killed = itest::SteadyClock::now();
  procs[0].Kill();
  // Lost after 3 s of silence; the worker's drain is bounded by --drain_timeout_ms (10 s).
  const Deadline bound = DeadlineIn(std::chrono::seconds(20));
  Result<int> server_rc = procs[1].WaitExit(bound);
  ASSERT_TRUE(server_rc.ok()) << "the server outlived its coordinator: "
                              << server_rc.status().ToString();
  const double server_seconds =
      std::chrono::duration<double>(itest::SteadyClock::now() - killed).count();
  Result<int> worker_rc = procs[2].WaitExit(bound);
  ASSERT_TRUE(worker_rc.ok()) << "the worker outlived its coordinator: "
                              << worker_rc.status().ToString();
  const double worker_seconds =
      std::chrono::duration<double>(itest::SteadyClock::now() - killed).count();
  std::printf("coordinator killed: server exited after %.2f s, worker after %.2f s\n",
              server_seconds, worker_seconds);
  EXPECT_GE(server_seconds, 2.5) << "not before its heartbeats went unanswered";
  // The server's shard, written on the way out (not a recorded set: no coordinator).
  bool written = false;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
    written |= e.is_directory() && std::filesystem::exists(e.path() / "server-0.ckpt");
  }
  EXPECT_TRUE(written) << "no checkpoint file under " << ckpt;
  EXPECT_EQ(RecordedClock(ckpt), 0);
}

}  // namespace
}  // namespace ps
