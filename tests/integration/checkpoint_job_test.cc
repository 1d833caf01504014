// Checkpoint and restore across processes: a real ps_coordinator and ps_server with an
// in-test BSP worker; the server checkpoints every clock, is killed with SIGKILL, and a new
// job started with --restore=latest serves exactly the weights of the last checkpoint
// (its spilled rows included).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
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
};

constexpr uint32_t kWidth = 4;

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

}  // namespace
}  // namespace ps
