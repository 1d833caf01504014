// HeartbeatSender: a coordinator that answers keeps the sender content; one that stops
// answering is reported lost once, after options.coordinator_timeout.
//
// The silence is measured on a fake clock (HeartbeatOptions::now) that moves only when the
// test says, and every wait is for a condition (beats received, replies sent) with a
// deadline in seconds: a descheduled thread on a loaded machine, or under a sanitizer,
// slows the test down but cannot make a beat look late.
#include "common/heartbeat.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "common/wire.h"

namespace ps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kInterval{20};
constexpr milliseconds kTimeout{200};
// Real time any one condition may take to come true; only ever reached when it never does.
constexpr std::chrono::seconds kWaitLimit{60};

// What the test threads saw, bumped by them and waited on by the test body.
struct Counts {
  uint64_t beats = 0;     // heartbeats the coordinator received
  uint64_t replies = 0;   // replies it sent
  int lost = 0;           // on_coordinator_lost calls
  uint64_t stopping = 0;  // on_job_stopping calls
};

class Events {
 public:
  void Bump(uint64_t Counts::*counter) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++(counts_.*counter);
    }
    cv_.notify_all();
  }
  void Lost() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++counts_.lost;
    }
    cv_.notify_all();
  }
  Counts Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }
  // True once `done` holds; false when it still does not after kWaitLimit.
  bool WaitFor(const std::function<bool(const Counts&)>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWaitLimit, [&] { return done(counts_); });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Counts counts_;  // guarded by mu_
};

// A clock that stands still until Advance.
class FakeClock {
 public:
  Clock::time_point Now() const { return Clock::time_point(Clock::duration(ticks_.load())); }
  void Advance(Clock::duration d) { ticks_ += d.count(); }

 private:
  std::atomic<Clock::rep> ticks_{
      std::chrono::duration_cast<Clock::duration>(std::chrono::hours(1)).count()};
};

// A coordinator stand-in on inproc: answers every heartbeat with an aliveReply while
// `answering` is set, and drops them afterwards.
class FakeCoordinator {
 public:
  FakeCoordinator(Transport* t, Events* events) : events_(events) {
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
  std::atomic<bool> job_stopping{false};  // what the replies say

 private:
  void Loop() {
    while (!done_) {
      Result<Incoming> in = socket_->Recv(milliseconds(10));
      if (!in.ok()) continue;
      events_->Bump(&Counts::beats);  // before `answering` is read
      if (!answering) continue;
      Result<DecodedHeader> h = DecodedHeader::Decode(in->frames[0]);
      if (!h.ok()) continue;
      capnp::MallocMessageBuilder b;
      NewHeader(b, h->get().getRequestId(), -1)
          .getBody()
          .initAliveReply()
          .setJobStopping(job_stopping.load());
      Frames f;
      f.push_back(EncodeFrame(b));
      if (socket_->Send(in->peer, std::move(f)).ok()) events_->Bump(&Counts::replies);
    }
  }
  Events* const events_;
  std::unique_ptr<ServerSocket> socket_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

class HeartbeatTest : public ::testing::Test {
 protected:
  void Start(bool fake_clock) {
    HeartbeatOptions o;
    o.coordinator = "inproc://heartbeat-test";
    o.interval = kInterval;
    o.coordinator_timeout = kTimeout;
    o.on_coordinator_lost = [this] { events_.Lost(); };
    o.on_job_stopping = [this] { events_.Bump(&Counts::stopping); };
    if (fake_clock) o.now = [this] { return clock_.Now(); };
    Result<std::unique_ptr<HeartbeatSender>> h = HeartbeatSender::Start(&transport_, o);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    sender_ = std::move(h).value();
  }

  // Returns once the sender has begun and ended a whole turn (send a beat, count it, read
  // the replies there are, check the silence) after this call began. With `sent` beats
  // counted now, the next turn reads after counting beat sent + 1, and ends before sending
  // beat sent + 2: once the coordinator has that one, the turn is over.
  void WaitForATurn() {
    const uint64_t sent = sender_->beats_sent();
    ASSERT_TRUE(events_.WaitFor([&](const Counts& c) { return c.beats >= sent + 2; }))
        << "the sender stopped beating";
  }

  // Returns once the sender has read a reply sent after this call began (it took the fake
  // clock's time then as the last answer).
  void WaitForAnAnswerRead() {
    const uint64_t replies = events_.Get().replies;
    ASSERT_TRUE(events_.WaitFor([&](const Counts& c) { return c.replies > replies; }))
        << "the coordinator answered no beat";
    ASSERT_NO_FATAL_FAILURE(WaitForATurn());
  }

  // Stops answering and returns once no reply is left on its way to the sender: a beat
  // received after `answering` was cleared goes unanswered, and the coordinator handles
  // beats one at a time, so every reply was sent before it; the next turn reads them.
  void GoSilent() {
    coordinator_.answering = false;
    const uint64_t beats = events_.Get().beats;
    ASSERT_TRUE(events_.WaitFor([&](const Counts& c) { return c.beats > beats; }));
    ASSERT_NO_FATAL_FAILURE(WaitForATurn());
  }

  int lost() const { return events_.Get().lost; }

  Events events_;
  Transport transport_;
  FakeCoordinator coordinator_{&transport_, &events_};
  FakeClock clock_;
  std::unique_ptr<HeartbeatSender> sender_;  // declared last: stopped first
};

TEST_F(HeartbeatTest, ACoordinatorThatAnswersIsNeverLost) {
  ASSERT_NO_FATAL_FAILURE(Start(/*fake_clock=*/true));
  // Four timeouts pass in all, half a timeout between answers.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(kTimeout / 2);
    ASSERT_NO_FATAL_FAILURE(WaitForAnAnswerRead());
  }
  EXPECT_EQ(lost(), 0);
}

TEST_F(HeartbeatTest, ASilentCoordinatorIsReportedLostOnceAfterTheTimeout) {
  ASSERT_NO_FATAL_FAILURE(Start(/*fake_clock=*/true));
  ASSERT_NO_FATAL_FAILURE(WaitForAnAnswerRead());
  ASSERT_NO_FATAL_FAILURE(GoSilent());
  // Silent for just under the timeout, and the sender has looked: not lost yet.
  clock_.Advance(kTimeout - milliseconds(1));
  ASSERT_NO_FATAL_FAILURE(WaitForATurn());
  EXPECT_EQ(lost(), 0) << "reported lost before the timeout";
  // Past it: lost, at the next turn.
  clock_.Advance(milliseconds(2));
  ASSERT_TRUE(events_.WaitFor([](const Counts& c) { return c.lost > 0; }))
      << "a silent coordinator was never reported lost";
  // Silent on and on: reported once only.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(kTimeout);
    ASSERT_NO_FATAL_FAILURE(WaitForATurn());
  }
  EXPECT_EQ(lost(), 1) << "reported more than once";
}

// A reply saying that the job stops runs on_job_stopping, once however many say so; the
// coordinator, answering, is not lost.
TEST_F(HeartbeatTest, AReplySayingTheJobStopsRunsOnJobStoppingOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(/*fake_clock=*/true));
  ASSERT_NO_FATAL_FAILURE(WaitForAnAnswerRead());
  EXPECT_EQ(events_.Get().stopping, 0u) << "called before any reply said so";
  coordinator_.job_stopping = true;
  ASSERT_TRUE(events_.WaitFor([](const Counts& c) { return c.stopping > 0; }))
      << "replies saying that the job stops were never acted on";
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(WaitForAnAnswerRead());
  EXPECT_EQ(events_.Get().stopping, 1u) << "called more than once";
  EXPECT_EQ(lost(), 0);
}

// The default clock (steady_clock): a coordinator that never answers is reported lost,
// and not before the timeout has passed since the sender started.
TEST_F(HeartbeatTest, WithTheRealClockANeverAnsweringCoordinatorIsLost) {
  coordinator_.answering = false;
  const auto started = Clock::now();
  ASSERT_NO_FATAL_FAILURE(Start(/*fake_clock=*/false));
  ASSERT_TRUE(events_.WaitFor([](const Counts& c) { return c.lost > 0; }))
      << "a silent coordinator was never reported lost";
  EXPECT_GE(Clock::now() - started, kTimeout);
  ASSERT_NO_FATAL_FAILURE(WaitForATurn());
  EXPECT_EQ(lost(), 1);
}

}  // namespace
}  // namespace ps
