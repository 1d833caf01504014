// HeartbeatSender: a coordinator that answers keeps the sender content; one that stops
// answering is reported lost once, after options.coordinator_timeout.
#include "common/heartbeat.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/wire.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;

// A coordinator stand-in on inproc: answers every heartbeat with an aliveReply while
// `answering` is set, and drops them afterwards.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(Transport* t) {
    Result<std::unique_ptr<ServerSocket>> s = t->Listen("inproc://heartbeat-test");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    socket_ = std::move(s).value();
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeCoordinator() {
    done_ = true;
    thread_.join();
  }
  std::atomic<bool> answering{true};
  std::atomic<int> beats{0};

 private:
  void Loop() {
    while (!done_) {
      Result<Incoming> in = socket_->Recv(std::chrono::milliseconds(10));
      if (!in.ok()) continue;
      ++beats;
      if (!answering) continue;
      Result<DecodedHeader> h = DecodedHeader::Decode(in->frames[0]);
      if (!h.ok()) continue;
      capnp::MallocMessageBuilder b;
      NewHeader(b, h->get().getRequestId(), -1).getBody().initAliveReply();
      Frames f;
      f.push_back(EncodeFrame(b));
      (void)socket_->Send(in->peer, std::move(f));
    }
  }
  std::unique_ptr<ServerSocket> socket_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(HeartbeatTest, ACoordinatorThatStopsAnsweringIsReportedLostOnce) {
  Transport transport;
  FakeCoordinator coordinator(&transport);
  std::atomic<int> lost{0};
  HeartbeatOptions o;
  o.coordinator = "inproc://heartbeat-test";
  o.interval = std::chrono::milliseconds(20);
  o.coordinator_timeout = std::chrono::milliseconds(200);
  o.on_coordinator_lost = [&] { ++lost; };
  Result<std::unique_ptr<HeartbeatSender>> h = HeartbeatSender::Start(&transport, o);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  // Answered: 30 beats span 600 ms, three times the timeout, and nothing is reported.
  while (coordinator.beats < 30) {
    ASSERT_LT(Clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(lost.load(), 0);
  // Silent: reported once, some time after the timeout.
  coordinator.answering = false;
  const auto silent_since = Clock::now();
  while (lost.load() == 0) {
    ASSERT_LT(Clock::now(), deadline) << "a silent coordinator was never reported lost";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(Clock::now() - silent_since, std::chrono::milliseconds(150));
  const int beats = coordinator.beats;
  while (coordinator.beats < beats + 20) {
    ASSERT_LT(Clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(lost.load(), 1) << "reported more than once";
  (*h)->Stop();
}

}  // namespace
}  // namespace ps
