// A worker's call to the coordinator across a coordinator restart (worker/coordinator_call.h):
// a request the old coordinator never answered is sent again, with the same request id,
// once the heartbeat sees a new incarnation; an answer to another request id is dropped.
// The coordinator is a stand-in on inproc that answers heartbeats and lease requests.
#include "worker/coordinator_call.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace ps {
namespace {

using std::chrono::milliseconds;

constexpr char kEndpoint[] = "inproc://coordinator-call-test";
constexpr uint64_t kLease = 77;

// Answers each heartbeat with `incarnation`; the first lease request it drops and "restarts"
// (incarnation 1 -> 2); the second it answers, after an answer to an older request.
class RestartingCoordinator {
 public:
  explicit RestartingCoordinator(Transport* t) {
    Result<std::unique_ptr<ServerSocket>> s = t->Listen(kEndpoint);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    socket_ = std::move(s).value();
    thread_ = std::thread([this] { Loop(); });
  }
  ~RestartingCoordinator() {
    done_ = true;
    thread_.join();
  }
  std::atomic<uint64_t> incarnation{1};
  std::atomic<int> leases_seen{0};

 private:
  void Reply(const std::string& peer, capnp::MallocMessageBuilder& b) {
    Frames f;
    f.push_back(EncodeFrame(b));
    EXPECT_TRUE(socket_->Send(peer, std::move(f)).ok());
  }
  void Loop() {
    while (!done_) {
      Result<Incoming> in = socket_->Recv(milliseconds(10));
      if (!in.ok() || in->frames.empty()) continue;
      Result<DecodedHeader> h = DecodedHeader::Decode(in->frames[0]);
      if (!h.ok()) continue;
      const uint64_t rid = h->get().getRequestId();
      capnp::MallocMessageBuilder b;
      if (h->get().getBody().which() == wire::Header::Body::ALIVE) {
        NewHeader(b, rid, -1).getBody().initAliveReply().setIncarnation(incarnation.load());
        Reply(in->peer, b);
        continue;
      }
      EXPECT_EQ(rid, kLease);
      if (leases_seen.fetch_add(1) == 0) {
        incarnation = 2;  // died with the request unanswered; a new one answers beats
        continue;
      }
      capnp::MallocMessageBuilder stale;
      NewHeader(stale, rid - 1, -1).getBody().initLeaseReply().setWait();
      Reply(in->peer, stale);
      NewHeader(b, rid, -1).getBody().initLeaseReply().setFinished();
      Reply(in->peer, b);
    }
  }
  std::unique_ptr<ServerSocket> socket_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

Frames LeaseRequest() {
  capnp::MallocMessageBuilder b;
  NewHeader(b, kLease, 0).getBody().initLease().setWait(true);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

TEST(CoordinatorCallTest, ARequestUnansweredAtARestartIsSentAgainAndItsOwnAnswerTaken) {
  Transport transport;
  RestartingCoordinator coordinator(&transport);
  HeartbeatOptions hopt;
  hopt.coordinator = kEndpoint;
  hopt.interval = milliseconds(10);
  Result<std::unique_ptr<HeartbeatSender>> hb = HeartbeatSender::Start(&transport, hopt);
  ASSERT_TRUE(hb.ok()) << hb.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((*hb)->coordinator_incarnation() != 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ((*hb)->coordinator_incarnation(), 1u);
  Result<std::unique_ptr<ClientSocket>> socket = transport.Connect(kEndpoint);
  ASSERT_TRUE(socket.ok());
  CoordinatorCallOptions call;
  call.timeout = std::chrono::seconds(5);
  call.slice = milliseconds(10);
  call.heartbeat = hb->get();
  Result<CallReply> reply = CallCoordinator(**socket, LeaseRequest(), kLease, call);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(coordinator.leases_seen.load(), 2);
  auto body = reply->header.get().getBody();
  ASSERT_EQ(body.which(), wire::Header::Body::LEASE_REPLY);
  EXPECT_TRUE(body.getLeaseReply().isFinished());  // not the stale `wait`
}

TEST(CoordinatorCallTest, WithoutAHeartbeatANeverAnsweredRequestTimesOut) {
  Transport transport;
  RestartingCoordinator coordinator(&transport);
  Result<std::unique_ptr<ClientSocket>> socket = transport.Connect(kEndpoint);
  ASSERT_TRUE(socket.ok());
  CoordinatorCallOptions call;
  call.timeout = milliseconds(200);
  call.slice = milliseconds(20);
  Result<CallReply> reply = CallCoordinator(**socket, LeaseRequest(), kLease, call);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(coordinator.leases_seen.load(), 1);
}

}  // namespace
}  // namespace ps
