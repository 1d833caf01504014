// CurveZMQ across processes: a real ps_coordinator and ps_server with keys; peers played by
// this test. A peer whose key the job does not list, and a peer that does not speak CURVE,
// get nothing through on either port (no registration, so no shard map; no push, no pull),
// and are logged with their key. A forwarding TCP proxy between a worker and a server shows
// what crosses the wire: the pushed floats' bytes are absent with CURVE, present with
// --insecure.
#include "common/security.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
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

class SecurityTest : public itest::JobTest {};

// One server, one worker, one table of 4 rows x 2.
const std::vector<std::string> kTinyJob = {"--model=none", "--tables=t:4:2:zeros",
                                           "--num_servers=1", "--num_workers=1", "--staleness=-1"};
// How long a rejected peer waits for an answer that must not come. A reply within this on
// loopback is immediate for an admitted peer (the positive controls below show it).
constexpr std::chrono::milliseconds kSilence{1500};

Frames PushFrames(uint64_t request_id, const std::vector<float>& grads) {
  capnp::MallocMessageBuilder b;
  auto push = NewHeader(b, request_id, 0).getBody().initPush();
  push.setTableId(0);
  auto range = push.initKeys().initRange();
  range.setBegin(0);
  range.setEnd(grads.size() / 2);
  Frames f;
  f.push_back(EncodeFrame(b));
  f.push_back(CopyFrame(grads.data(), grads.size() * sizeof(float)));
  return f;
}

Frames PullFrames(uint64_t request_id, uint64_t rows) {
  capnp::MallocMessageBuilder b;
  auto pull = NewHeader(b, request_id, 0).getBody().initPull();
  pull.setTableId(0);
  auto range = pull.initKeys().initRange();
  range.setBegin(0);
  range.setEnd(rows);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// Pulls the whole table through `socket` and returns its values.
Result<std::vector<float>> PullAll(ClientSocket& socket, Deadline deadline) {
  PS_ASSIGN_OR_RETURN(CallReply reply, Call(socket, PullFrames(5, 4), TimeLeft(deadline)));
  if (reply.frames.size() != 2) return Internal("pull reply without its values frame");
  std::vector<float> v(reply.frames[1].size() / sizeof(float));
  std::memcpy(v.data(), reply.frames[1].data(), v.size() * sizeof(float));
  return v;
}

// Requests sent by intruders; each must stay unanswered.
class Silence {
 public:
  // Sends `frames` on a fresh socket of `transport` to `endpoint`.
  void Send(Transport& transport, const std::string& endpoint, Frames frames,
            const std::string& what) {
    Result<std::unique_ptr<ClientSocket>> s = transport.Connect(endpoint);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Send(std::move(frames)).ok());
    sent_.push_back({std::move(s).value(), what + " at " + endpoint});
  }
  // Waits kSilence once, then expects no answer on any socket.
  void Expect() {
    for (size_t i = 0; i < sent_.size(); ++i) {
      Result<Frames> reply = i == 0 ? sent_[i].first->Recv(kSilence)
                                    : sent_[i].first->Recv(std::chrono::milliseconds(1));
      EXPECT_FALSE(reply.ok()) << sent_[i].second << " got an answer";
    }
    sent_.clear();
  }

 private:
  std::vector<std::pair<std::unique_ptr<ClientSocket>, std::string>> sent_;
};

TEST_F(SecurityTest, UnknownKeysAndPlainPeersGetNothingThroughOnAnyPort) {
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(kTinyJob, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();

  // Intruders: one with a key pair of its own (it knows the servers' public key, which is
  // no secret), one speaking plain ZeroMQ.
  Result<CurveKeyPair> stranger = GenerateCurveKeyPair();
  ASSERT_TRUE(stranger.ok());
  TransportOptions stranger_options = ClientTransportOptions();
  stranger_options.security.own = *stranger;
  Transport curve_intruder(stranger_options);
  Transport plain_intruder;

  // Before the job assembles: neither can register (and so read the shard map).
  Silence silence;
  silence.Send(curve_intruder, endpoint,
               itest::WorkerRegisterFrames(wire::PROTOCOL_VERSION, 1, "x"),
               "register with an unknown key");
  silence.Send(plain_intruder, endpoint,
               itest::WorkerRegisterFrames(wire::PROTOCOL_VERSION, 1, "x"),
               "register without CURVE");
  silence.Expect();

  Result<ChildProcess> server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Transport transport(ClientTransportOptions());
  RegisterRequest req;
  req.device = "test";
  Result<Registration> reg = RegisterWithCoordinator(&transport, endpoint, req, TimeLeft(deadline));
  ASSERT_TRUE(reg.ok()) << "the admitted worker must register: " << reg.status().ToString();
  ASSERT_EQ(reg->server_endpoints.size(), 1u);
  const std::string server_ep = reg->server_endpoints[0];

  // After it: still nothing, at the coordinator (register again) or at the server.
  const std::vector<float> poison(8, 1000.0f);
  for (Transport* t : {&curve_intruder, &plain_intruder}) {
    const std::string who = t == &curve_intruder ? "unknown key" : "plain ZeroMQ";
    silence.Send(*t, endpoint, itest::WorkerRegisterFrames(wire::PROTOCOL_VERSION, 2, "x"),
                 "register (" + who + ")");
    silence.Send(*t, server_ep, PushFrames(3, poison), "push (" + who + ")");
    silence.Send(*t, server_ep, PullFrames(4, 4), "pull (" + who + ")");
  }
  silence.Expect();

  // The admitted worker reaches the server, and the model is as it began: no push landed.
  Result<std::unique_ptr<ClientSocket>> good = transport.Connect(server_ep);
  ASSERT_TRUE(good.ok());
  Result<std::vector<float>> values = PullAll(**good, deadline);
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_THAT(*values, ::testing::Each(0.0f)) << "an intruder's push changed the model";

  Status done = itest::SendDone(*reg->coordinator, reg->id, Status::Ok(), deadline);
  ASSERT_TRUE(done.ok()) << done.ToString();
  Status report = itest::SendReport(*reg->coordinator, reg->id, itest::FinalEvalReport(), deadline);
  ASSERT_TRUE(report.ok()) << report.ToString();
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);

  // Both listeners logged the stranger's address and key.
  for (const char* log : {"coordinator.log", "server-0.log"}) {
    Result<std::string> text = itest::ReadFile(dir_.Join(log));
    ASSERT_TRUE(text.ok());
    EXPECT_THAT(*text, ::testing::HasSubstr("rejected peer 127.0.0.1"));
    EXPECT_THAT(*text, ::testing::HasSubstr(stranger->public_key)) << log;
  }
}

TEST_F(SecurityTest, BinariesWithoutKeysOrInsecureRefuseToStart) {
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{}, {"--insecure", "--listen=tcp://0.0.0.0:*"}}) {
    std::vector<std::string> argv = {itest::BinaryPath("ps_coordinator"), "--model=none",
                                     "--tables=t:4:2:zeros"};
    if (extra.empty()) argv.push_back("--listen=tcp://127.0.0.1:*");
    argv.insert(argv.end(), extra.begin(), extra.end());
    Result<ChildProcess> c = ChildProcess::Spawn(argv, dir_.Join("refused.log"));
    ASSERT_TRUE(c.ok());
    Result<int> rc = c->WaitExit(DeadlineIn(kTestTimeout));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 2);
  }
  Result<std::string> log = itest::ReadFile(dir_.Join("refused.log"));
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, ::testing::HasSubstr("no keys: give --keys_dir=DIR"));
  EXPECT_THAT(*log, ::testing::HasSubstr("--allow_insecure_remote"));
}

TEST_F(SecurityTest, AFlagfileWithAnUnknownFlagIsRefusedWithItsLine) {
  const std::string flagfile = dir_.Join("bad.flags");
  {
    std::ofstream f(flagfile);
    f << "# a job\n--epochs=1\n--bogus_setting=3\n";
  }
  Result<ChildProcess> c =
      ChildProcess::Spawn({itest::BinaryPath("ps_coordinator"), "--flagfile=" + flagfile,
                           "--insecure", "--listen=tcp://127.0.0.1:*", "--run_dir=" + RunDir()},
                          dir_.Join("flagfile.log"));
  ASSERT_TRUE(c.ok());
  Result<int> rc = c->WaitExit(DeadlineIn(kTestTimeout));
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2);
  Result<std::string> log = itest::ReadFile(dir_.Join("flagfile.log"));
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, ::testing::HasSubstr(flagfile + ":3: unknown flag --bogus_setting"));
}

// ---- what crosses the wire ----

// Forwards one TCP connection at a time from a loopback port to `target_port`, recording
// the bytes sent towards the target.
class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listen_fd_, 4);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    pipe(stop_pipe_);
    thread_ = std::thread([this] { Run(); });
  }
  ~TcpProxy() {
    char c = 0;
    (void)write(stop_pipe_[1], &c, 1);
    thread_.join();
    close(listen_fd_);
    close(stop_pipe_[0]);
    close(stop_pipe_[1]);
  }
  int port() const { return port_; }
  std::string Captured() {
    std::lock_guard<std::mutex> l(mu_);
    return captured_;
  }

 private:
  void Run() {
    int client = -1, target = -1;
    while (true) {
      std::vector<pollfd> fds = {{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      if (client >= 0) fds.push_back({client, POLLIN, 0});
      if (target >= 0) fds.push_back({target, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0) break;
      if (fds[0].revents) break;
      if (fds[1].revents & POLLIN) {
        int c = accept(listen_fd_, nullptr, nullptr);
        if (client >= 0) close(client);
        if (target >= 0) close(target);
        client = c;
        target = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(target_port_));
        if (connect(target, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
          close(target);
          close(client);
          client = target = -1;
        }
        continue;
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        const bool from_client = fds[i].fd == client;
        char buf[65536];
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          close(client);
          close(target);
          client = target = -1;
          break;
        }
        if (from_client) {
          std::lock_guard<std::mutex> l(mu_);
          captured_.append(buf, static_cast<size_t>(n));
        }
        const int to = from_client ? target : client;
        for (ssize_t off = 0; off < n;) {
          ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
          if (w <= 0) break;
          off += w;
        }
      }
    }
    if (client >= 0) close(client);
    if (target >= 0) close(target);
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::string captured_;  // guarded by mu_
};

class WireTest : public SecurityTest, public ::testing::WithParamInterface<bool> {};

TEST_P(WireTest, PushedFloatsAreOnTheWireOnlyWithoutCurve) {
  const bool curve = GetParam();
  if (!curve) UseInsecure();
  const Deadline deadline = DeadlineIn(kTestTimeout);
  std::string endpoint;
  Result<ChildProcess> coordinator = StartCoordinator(kTinyJob, deadline, &endpoint);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  Result<ChildProcess> server = StartServer(0, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Transport transport(ClientTransportOptions());
  RegisterRequest req;
  req.device = "test";
  Result<Registration> reg = RegisterWithCoordinator(&transport, endpoint, req, TimeLeft(deadline));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  const std::string server_ep = reg->server_endpoints[0];
  const int server_port = std::stoi(server_ep.substr(server_ep.rfind(':') + 1));

  TcpProxy proxy(server_port);
  Result<std::unique_ptr<ClientSocket>> s =
      transport.Connect("tcp://127.0.0.1:" + std::to_string(proxy.port()));
  ASSERT_TRUE(s.ok());
  // Eight distinctive floats: 32 bytes that occur by chance in neither run.
  const std::vector<float> grads = {1.25f, -2.5f, 3.75f, -5.125f, 6.0625f, -7.5f, 8.25f, -9.0f};
  Result<CallReply> reply = Call(**s, PushFrames(7, grads), TimeLeft(deadline));
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->header.get().getBody().which(), wire::Header::Body::PUSH_REPLY);
  const std::string needle(reinterpret_cast<const char*>(grads.data()),
                           grads.size() * sizeof(float));
  const std::string captured = proxy.Captured();
  ASSERT_GT(captured.size(), needle.size()) << "the proxy saw the push";
  const bool seen = captured.find(needle) != std::string::npos;
  std::printf("wire (%s): %zu bytes from the worker, pushed floats %s\n",
              curve ? "CURVE" : "insecure", captured.size(), seen ? "VISIBLE" : "not visible");
  EXPECT_EQ(seen, !curve);

  ASSERT_TRUE(itest::SendDone(*reg->coordinator, reg->id, Status::Ok(), deadline).ok());
  ASSERT_TRUE(
      itest::SendReport(*reg->coordinator, reg->id, itest::FinalEvalReport(), deadline).ok());
  ExpectCleanExit(*coordinator, "ps_coordinator", deadline);
  ExpectCleanExit(*server, "ps_server", deadline);
}

INSTANTIATE_TEST_SUITE_P(Curve, WireTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "On" : "Insecure";
                         });

}  // namespace
}  // namespace ps
