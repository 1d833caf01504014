// Input limits on a real ps_server: requests that would make it allocate without bound get
// an error (a pull for 10^12 rows, a key list declared at 2 GB, too many frames), a frame
// over --max_frame_mb gets its sender disconnected before it is buffered, and a flood of
// tiny requests is answered in full while the server's peak RSS stays bounded (printed).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/registration.h"
#include "common/transport.h"
#include "common/wire.h"
#include "tests/integration/job_test_util.h"
#include "tests/integration/process.h"

namespace ps {
namespace {

using itest::ChildProcess;
using itest::Deadline;
using itest::DeadlineIn;
using itest::kTestTimeout;
using itest::TimeLeft;

class LimitsTest : public itest::JobTest {};

Frames PullHeader(uint64_t request_id, uint32_t table, uint64_t begin, uint64_t end) {
  capnp::MallocMessageBuilder b;
  auto pull = NewHeader(b, request_id, 0).getBody().initPull();
  pull.setTableId(table);
  auto range = pull.initKeys().initRange();
  range.setBegin(begin);
  range.setEnd(end);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// Call() turns an error reply into its Status: an answered, refused request.
void ExpectRefused(const Result<CallReply>& r, const std::string& what) {
  ASSERT_FALSE(r.ok()) << what << " was served";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
      << what << ": " << r.status().ToString();
  std::printf("%s: %s\n", what.c_str(), r.status().message().c_str());
}

// VmHWM (peak resident set) of `pid` in MB, or -1.
double PeakRssMb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

TEST_F(LimitsTest, OversizedAndFloodingRequestsGetErrorsOrBackpressure) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator =
      StartCoordinator({"--model=none", "--tables=t:4:2:zeros,emb:sparse:2:zeros",
                        "--num_servers=1", "--num_workers=1", "--staleness=-1"},
                       deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Result<ChildProcess> server =
      StartServer(0, endpoint, {"--max_frame_mb=1", "--max_frames=8", "--receive_hwm=100"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Transport transport(ClientTransportOptions());
  RegisterRequest req;
  req.device = "test";
  Result<Registration> reg = RegisterWithCoordinator(&transport, endpoint, req, TimeLeft(deadline));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const std::string server_ep = reg->server_endpoints[0];
  Result<std::unique_ptr<ClientSocket>> s = transport.Connect(server_ep);
  ASSERT_TRUE(s.ok());
  ClientSocket& sock = **s;

  // A pull for 10^12 rows.
  Result<CallReply> r = Call(sock, PullHeader(1, 0, 0, 1'000'000'000'000), TimeLeft(deadline));
  ExpectRefused(r, "pull of 10^12 rows");

  // A key list declared at 2^28 keys (2 GB), with 8 bytes of keys.
  {
    capnp::MallocMessageBuilder b;
    auto pull = NewHeader(b, 2, 0).getBody().initPull();
    pull.setTableId(1);
    pull.initKeys().setListCount(uint64_t{1} << 28);
    Frames f;
    f.push_back(EncodeFrame(b));
    uint64_t key = 7;
    f.push_back(CopyFrame(&key, sizeof(key)));
    r = Call(sock, std::move(f), TimeLeft(deadline));
    ExpectRefused(r, "key list declared at 2 GB");
  }

  // More frames than --max_frames.
  {
    Frames f = PullHeader(3, 0, 0, 4);
    for (int i = 0; i < 20; ++i) f.push_back(CopyFrame("x", 1));
    r = Call(sock, std::move(f), TimeLeft(deadline));
    ExpectRefused(r, "21 frames");
  }

  // A 4 MB frame (over --max_frame_mb=1): ZeroMQ drops the connection before buffering it,
  // so no answer comes; the server goes on serving others.
  {
    Result<std::unique_ptr<ClientSocket>> big = transport.Connect(server_ep);
    ASSERT_TRUE(big.ok());
    Frames f = PullHeader(4, 0, 0, 4);
    std::vector<char> blob(4 << 20, 'x');
    f.push_back(CopyFrame(blob.data(), blob.size()));
    ASSERT_TRUE((*big)->Send(std::move(f)).ok());
    Result<Frames> none = (*big)->Recv(std::chrono::milliseconds(1500));
    EXPECT_FALSE(none.ok()) << "an oversized frame was answered";
  }

  // A flood of tiny pulls sent without reading a reply: the server's receive high-water mark
  // holds the rest in the kernel's buffers and the sender's queue; every one is answered.
  constexpr int kFlood = 20000;
  for (int i = 0; i < kFlood; ++i) {
    ASSERT_TRUE(sock.Send(PullHeader(100 + i, 0, 0, 4)).ok());
  }
  int answered = 0;
  while (answered < kFlood) {
    Result<Frames> f = sock.Recv(TimeLeft(deadline));
    ASSERT_TRUE(f.ok()) << answered << " of " << kFlood << " answered: " << f.status().ToString();
    ++answered;
  }
  // Still serving well-formed requests.
  r = Call(sock, PullHeader(5, 0, 0, 4), TimeLeft(deadline));
  ASSERT_TRUE(r.ok()) << "a good pull after the flood: " << r.status().ToString();

  const double peak_mb = PeakRssMb(server->pid());
  std::printf("ps_server peak RSS after the oversized requests and %d pulls: %.1f MB\n", kFlood,
              peak_mb);
  EXPECT_GT(peak_mb, 0);
#ifndef PS_SANITIZED  // ASan keeps freed memory in quarantine (256 MB by default)
  EXPECT_LT(peak_mb, 256) << "the server's memory grew with the bad requests";
#endif

  ASSERT_TRUE(itest::SendDone(*reg->coordinator, reg->id, Status::Ok(), deadline).ok());
  ASSERT_TRUE(
      itest::SendReport(*reg->coordinator, reg->id, itest::FinalEvalReport(), deadline).ok());
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);
}

}  // namespace
}  // namespace ps
