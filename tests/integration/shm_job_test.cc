// The shared-memory payload path between real processes: a ps_server on ipc:// with CURVE,
// an in-test worker pushing and pulling a 2 MB dense table through it (pushes through the
// worker's ring, pull replies through the server's), exact final values, and /dev/shm
// clean after the processes exit; a server killed with SIGKILL leaves its segment until
// the next process's cleanup removes it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "common/registration.h"
#include "common/shm_ring.h"
#include "common/transport.h"
#include "tests/integration/job_test_util.h"
#include "tests/integration/process.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

using itest::ChildProcess;
using itest::Deadline;
using itest::DeadlineIn;
using itest::FinalEvalReport;
using itest::kTestTimeout;
using itest::SendDone;
using itest::SendReport;
using itest::TimeLeft;

constexpr uint64_t kRows = 512;
constexpr uint32_t kWidth = 1024;  // 2 MB of floats: one 2 MB frame per push and pull
constexpr int kRounds = 3;

std::vector<std::string> Segments(pid_t pid) {
  std::vector<std::string> out;
  const std::string prefix = "ps_shm_" + std::to_string(pid) + "_";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

float Grad(int round, uint64_t i) {
  return static_cast<float>(0.25 * (round + 1) + static_cast<double>(i % 1000) * 0.5);
}

class ShmJobTest : public itest::JobTest {
 protected:
  // Starts a coordinator and one server listening on ipc:// with `server_flags`.
  void StartJob(const std::vector<std::string>& server_flags, Deadline deadline) {
    Result<ChildProcess> c = StartCoordinator(
        {"--model=none",
         "--tables=dense:" + std::to_string(kRows) + ":" + std::to_string(kWidth) + ":zeros",
         "--num_servers=1", "--num_workers=1", "--base_lr=1", "--optimizer=sgd",
         "--lr_policy=fixed", "--weight_decay=0", "--clip_grad_norm=0", "--staleness=-1",
         "--epochs=1"},
        deadline, &coordinator_endpoint_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coordinator_.emplace(std::move(c).value());
    std::vector<std::string> flags = {"--listen=ipc://" + dir_.Join("server.sock")};
    flags.insert(flags.end(), server_flags.begin(), server_flags.end());
    Result<ChildProcess> s = StartServer(0, coordinator_endpoint_, flags);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_.emplace(std::move(s).value());
  }

  // Registers, pushes kRounds rounds of the whole table, pulls it back and checks every value
  // (SGD at rate 1 from zeros: minus the sum of the gradients).
  // Before the job ends, the server holds `server_segments` rings.
  void PushPullAndCheck(Transport& transport, Deadline deadline, bool send_done,
                        size_t server_segments) {
    RegisterRequest req;
    req.device = "shm test";
    Result<Registration> reg =
        RegisterWithCoordinator(&transport, coordinator_endpoint_, req, TimeLeft(deadline));
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    ASSERT_EQ(reg->server_endpoints.size(), 1u);
    ASSERT_EQ(reg->server_endpoints[0].rfind("ipc://", 0), 0u) << reg->server_endpoints[0];
    KVClientOptions opt;
    opt.client_id = reg->id;
    opt.request_timeout = std::chrono::seconds(20);
    opt.chunk_bytes = 0;  // one frame per push and pull: the counts checked below
    auto client = KVClient::Create(&transport, reg->config, reg->server_endpoints, opt);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const uint32_t table = (*client)->FindTable("dense").value();
    std::vector<float> grads(kRows * kWidth);
    for (int round = 0; round < kRounds; ++round) {
      for (uint64_t i = 0; i < grads.size(); ++i) grads[i] = Grad(round, i);
      Status s = (*client)->Wait((*client)->PushRange(table, RowRange{0, kRows}, grads));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    std::vector<float> values(kRows * kWidth, 1.0f);
    Status s = (*client)->Wait((*client)->PullRange(table, RowRange{0, kRows}, values));
    ASSERT_TRUE(s.ok()) << s.ToString();
    size_t wrong = 0;
    for (uint64_t i = 0; i < values.size(); ++i) {
      float expect = 0;
      for (int round = 0; round < kRounds; ++round) expect -= Grad(round, i);
      if (values[i] != expect && ++wrong <= 3) {
        ADD_FAILURE() << "value " << i << ": " << values[i] << ", expected " << expect;
      }
    }
    EXPECT_EQ(wrong, 0u);
    // Checked now: once the job ends, the server exits and unlinks its rings.
    EXPECT_EQ(Segments(server_->pid()).size(), server_segments);
    if (send_done) {
      // Done, then worker 0's final evaluation: the coordinator then ends the job.
      Status done = SendDone(*reg->coordinator, reg->id, Status::Ok(), deadline);
      EXPECT_TRUE(done.ok()) << done.ToString();
      Status report = SendReport(*reg->coordinator, reg->id, FinalEvalReport(), deadline);
      EXPECT_TRUE(report.ok()) << report.ToString();
    }
  }

  std::string coordinator_endpoint_;
  std::optional<ChildProcess> coordinator_, server_;
};

TEST_F(ShmJobTest, PayloadsCrossThroughSharedMemoryWithExactValuesAndNoLeftovers) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  StartJob({}, deadline);
  ASSERT_TRUE(server_.has_value());
  const pid_t server_pid = server_->pid();
  {
    Transport transport(ClientTransportOptions());
    PushPullAndCheck(transport, deadline, /*send_done=*/true, /*server_segments=*/1);
    const ShmStats st = transport.shm_stats();
    EXPECT_EQ(st.frames_sent, static_cast<uint64_t>(kRounds)) << "pushes through the ring";
    EXPECT_EQ(st.frames_received, 1u) << "the pull reply through the server's ring";
    EXPECT_EQ(st.frames_inline, 0u);
    EXPECT_EQ(st.bad_descriptors, 0u);
  }
  EXPECT_TRUE(Segments(getpid()).empty());
  ExpectCleanExit(*server_, "server", deadline);
  ExpectCleanExit(*coordinator_, "coordinator", deadline);
  EXPECT_TRUE(Segments(server_pid).empty()) << Segments(server_pid)[0];
}

TEST_F(ShmJobTest, OffKeepsPayloadsOnTheSocket) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  StartJob({"--shm=off"}, deadline);
  ASSERT_TRUE(server_.has_value());
  TransportOptions o = ClientTransportOptions();
  o.shm = ShmMode::kOff;
  {
    Transport transport(o);
    PushPullAndCheck(transport, deadline, /*send_done=*/true, /*server_segments=*/0);
    EXPECT_EQ(transport.shm_stats().frames_sent, 0u);
    EXPECT_EQ(transport.shm_stats().frames_received, 0u);
  }
  ExpectCleanExit(*server_, "server", deadline);
  ExpectCleanExit(*coordinator_, "coordinator", deadline);
}

TEST_F(ShmJobTest, AKilledServersSegmentIsRemovedByTheNextCleanup) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  StartJob({}, deadline);
  ASSERT_TRUE(server_.has_value());
  const pid_t server_pid = server_->pid();
  {
    Transport transport(ClientTransportOptions());
    PushPullAndCheck(transport, deadline, /*send_done=*/false, /*server_segments=*/1);
    server_->Kill();
    ASSERT_TRUE(server_->WaitExit(deadline).ok());
  }
  // SIGKILL ran no destructor: the segment is still there, until any process's first ring
  // (or this call) finds its owner gone.
  EXPECT_EQ(Segments(server_pid).size(), 1u);
  EXPECT_GE(CleanStaleShmSegments(), 1);
  EXPECT_TRUE(Segments(server_pid).empty());
  coordinator_->Kill();
}

}  // namespace
}  // namespace ps
