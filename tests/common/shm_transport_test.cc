// The shared-memory payload path: exact bytes through ipc:// sockets with shm on, the
// inline fallback when a ring is full, frames held by the receiver, bad descriptors refused
// with an error naming the value, ShareFrames over shared bytes, and no /dev/shm leftovers.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "common/shm_ring.h"
#include "common/transport.h"

namespace ps {
namespace {

using std::chrono::milliseconds;

// Names of this process's segments now in /dev/shm.
std::vector<std::string> OurSegments() {
  std::vector<std::string> out;
  const std::string prefix = "ps_shm_" + std::to_string(getpid()) + "_";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::string IpcEndpoint(const std::string& name) {
  return "ipc:///tmp/ps_shm_test_" + std::to_string(getpid()) + "_" + name;
}

// A frame of `bytes` bytes whose content depends on `seed` and the position.
zmq::message_t Pattern(size_t bytes, uint32_t seed) {
  zmq::message_t m(bytes);
  auto* p = static_cast<uint8_t*>(m.data());
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + i / 4096));
  return m;
}

bool SameBytes(const zmq::message_t& a, const zmq::message_t& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

class ShmTransportTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(OurSegments().empty()) << OurSegments()[0]; }
};

TEST_F(ShmTransportTest, LargeAndSmallFramesRoundTripWithExactBytes) {
  {
    Transport t;
    auto server = t.Listen(IpcEndpoint("rt")).value();
    auto client = t.Connect(server->BoundEndpoint()).value();
    const std::vector<size_t> sizes = {100, (64 << 10) - 1, 1 << 20, 64 << 10, 3 << 20, 0};
    Frames sent;
    for (size_t i = 0; i < sizes.size(); ++i) sent.push_back(Pattern(sizes[i], i));
    ASSERT_TRUE(client->Send(ShareFrames(sent)).ok());
    Result<Incoming> in = server->Recv(milliseconds(5000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_TRUE(in->bad_frame.ok()) << in->bad_frame.ToString();
    ASSERT_EQ(in->frames.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(SameBytes(in->frames[i], sent[i])) << i;
    // Three frames were large enough for the ring; the others went inline.
    EXPECT_EQ(t.shm_stats().frames_sent, 3u);
    EXPECT_EQ(t.shm_stats().bytes_sent, (1u << 20) + (64u << 10) + (3u << 20));
    EXPECT_EQ(t.shm_stats().frames_received, 3u);

    // And back: a reply through the listener's ring for this peer.
    Frames reply;
    reply.push_back(Pattern(10, 9));
    reply.push_back(Pattern(2 << 20, 10));
    Frames expect = ShareFrames(reply);
    ASSERT_TRUE(server->Send(in->peer, std::move(reply)).ok());
    Result<Frames> back = client->Recv(milliseconds(5000));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(back->size(), 2u);
    EXPECT_TRUE(SameBytes((*back)[0], expect[0]));
    EXPECT_TRUE(SameBytes((*back)[1], expect[1]));
    EXPECT_EQ(t.shm_stats().frames_sent, 4u);
    EXPECT_EQ(t.shm_stats().frames_received, 4u);
    EXPECT_EQ(t.shm_stats().bad_descriptors, 0u);
    EXPECT_EQ(OurSegments().size(), 2u);  // one ring each way
  }
}

TEST_F(ShmTransportTest, OffSendsInlineAndTcpNeverUsesShm) {
  TransportOptions off;
  off.shm = ShmMode::kOff;
  for (auto [endpoint, options] :
       {std::pair{IpcEndpoint("off"), off},
        std::pair{std::string("tcp://127.0.0.1:*"), TransportOptions{}}}) {
    Transport t(options);
    auto server = t.Listen(endpoint).value();
    auto client = t.Connect(server->BoundEndpoint()).value();
    Frames f;
    f.push_back(Pattern(1 << 20, 1));
    Frames expect = ShareFrames(f);
    ASSERT_TRUE(client->Send(std::move(f)).ok());
    Result<Incoming> in = server->Recv(milliseconds(5000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->frames.size(), 1u);
    EXPECT_TRUE(SameBytes(in->frames[0], expect[0]));
    EXPECT_EQ(t.shm_stats().frames_sent, 0u) << endpoint;
    EXPECT_TRUE(OurSegments().empty());
  }
}

TEST_F(ShmTransportTest, FullRingFallsBackInlineAndFramesHeldStayIntact) {
  TransportOptions o;
  o.shm_ring_slots = 8;
  o.shm_ring_bytes = 4 << 20;
  Transport t(o);
  auto server = t.Listen(IpcEndpoint("full")).value();
  auto client = t.Connect(server->BoundEndpoint()).value();
  // 20 frames of 256 KB in flight and held: 8 slots, then the ring is full.
  constexpr int kMessages = 20;
  std::vector<zmq::message_t> expect;
  for (int i = 0; i < kMessages; ++i) {
    Frames f;
    f.push_back(Pattern(256 << 10, i));
    expect.push_back(Pattern(256 << 10, i));
    ASSERT_TRUE(client->Send(std::move(f)).ok());
  }
  std::vector<Incoming> held;
  for (int i = 0; i < kMessages; ++i) {
    Result<Incoming> in = server->Recv(milliseconds(5000));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    held.push_back(std::move(in).value());
  }
  EXPECT_EQ(t.shm_stats().frames_sent, 8u);
  EXPECT_EQ(t.shm_stats().frames_inline, 12u);
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(held[i].frames.size(), 1u);
    EXPECT_TRUE(SameBytes(held[i].frames[0], expect[i])) << i;
  }
  // Bytes, not slots, run out: 3 MB frames in a 4 MB ring, one at a time.
  Frames big;
  big.push_back(Pattern(3 << 20, 99));
  ASSERT_TRUE(client->Send(std::move(big)).ok());
  Result<Incoming> third = server->Recv(milliseconds(5000));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(t.shm_stats().frames_inline, 13u);  // slots held and 2 MB of the ring too
  // The receiver lets go: the ring takes frames again, and the 20 held ones were not
  // overwritten while they were held.
  held.clear();
  Frames again;
  again.push_back(Pattern(3 << 20, 100));
  Frames again_expect = ShareFrames(again);
  ASSERT_TRUE(client->Send(std::move(again)).ok());
  Result<Incoming> in = server->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok());
  EXPECT_TRUE(SameBytes(in->frames[0], again_expect[0]));
  EXPECT_EQ(t.shm_stats().frames_sent, 9u);
}

// A descriptor of a real ring's frame, to be spoiled field by field.
struct RealDescriptor {
  std::shared_ptr<ShmRing> ring = ShmRing::Create({.data_bytes = 1 << 20, .num_slots = 4}).value();
  zmq::message_t frame = ring->Put("abcdefgh", 8).value();
  ShmDescriptor Get() const {
    ShmDescriptor d;
    std::memcpy(&d, frame.data(), sizeof(d));
    return d;
  }
};

zmq::message_t Frame(const ShmDescriptor& d) { return zmq::message_t(&d, sizeof(d)); }

TEST_F(ShmTransportTest, BadDescriptorsAreErrorsNamingTheValue) {
  RealDescriptor real;
  ShmMapper mapper;
  // Held to the end: the slot stays in use for the good descriptor sent last.
  Result<zmq::message_t> ok = mapper.Resolve(real.frame);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(std::string(static_cast<const char*>(ok->data()), ok->size()), "abcdefgh");
  auto expect_error = [&](ShmDescriptor d, const std::string& needle) {
    Result<zmq::message_t> r = mapper.Resolve(Frame(d));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  };
  ShmDescriptor d = real.Get();
  std::snprintf(d.name, sizeof(d.name), "../../etc/passwd");
  expect_error(d, "'../../etc/passwd' is not ps_shm_");
  d = real.Get();
  std::memset(d.name, 'a', sizeof(d.name));  // no terminator
  expect_error(d, "not terminated");
  d = real.Get();
  std::snprintf(d.name, sizeof(d.name), "ps_shm_1_00000000deadbeef");
  expect_error(d, "ps_shm_1_00000000deadbeef");  // well formed, but no such segment
  d = real.Get();
  d.slot = 9999;
  expect_error(d, "slot 9999 is out of range");
  d = real.Get();
  d.offset = 1 << 20;
  d.length = 1;
  expect_error(d, "offset 1048576 + length 1 is beyond");
  d = real.Get();
  d.length = UINT64_MAX;
  expect_error(d, "length 18446744073709551615 is beyond");
  d = real.Get();
  d.generation += 5;
  expect_error(d, "is not the slot's current use");
  d = real.Get();
  d.length = 4;
  expect_error(d, "length 4");
  d = real.Get();
  d.slot = 1;  // a slot not in use
  expect_error(d, "slot 1 generation");
  EXPECT_FALSE(mapper.Resolve(Pattern(80, 1)).ok());  // not a descriptor at all

  // Through sockets: the listener reports the error with the message and keeps serving;
  // the client's Recv returns it.
  TransportOptions off;
  off.shm = ShmMode::kOff;  // the crafted 80-byte frames are sent as they are anyway
  Transport t(off);
  auto server = t.Listen(IpcEndpoint("bad")).value();
  auto client = t.Connect(server->BoundEndpoint()).value();
  d = real.Get();
  d.slot = 77;
  Frames bad;
  bad.push_back(zmq::message_t(4));
  bad.push_back(Frame(d));
  ASSERT_TRUE(client->Send(std::move(bad)).ok());
  Result<Incoming> in = server->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_TRUE(in->frames.empty());
  EXPECT_EQ(in->bad_frame.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(in->bad_frame.message().find("slot 77"), std::string::npos);
  Frames back;
  back.push_back(Frame(d));
  ASSERT_TRUE(server->Send(in->peer, std::move(back)).ok());
  Result<Frames> r = client->Recv(milliseconds(5000));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("slot 77"), std::string::npos) << r.status().ToString();
  // A good message after the bad ones still goes through.
  Frames good;
  good.push_back(Frame(real.Get()));
  ASSERT_TRUE(client->Send(std::move(good)).ok());
  in = server->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok());
  ASSERT_TRUE(in->bad_frame.ok()) << in->bad_frame.ToString();
  EXPECT_EQ(std::string(static_cast<const char*>(in->frames[0].data()), 8), "abcdefgh");
  EXPECT_EQ(t.shm_stats().bad_descriptors, 2u);
}

TEST_F(ShmTransportTest, SharedFramesKeepTheSlotUntilTheLastCopyGoes) {
  auto ring = ShmRing::Create({.data_bytes = 1 << 20, .num_slots = 4}).value();
  zmq::message_t original = Pattern(300 << 10, 3);
  zmq::message_t d = ring->Put(original.data(), original.size()).value();
  ShmMapper mapper;
  Frames frames;
  frames.push_back(mapper.Resolve(d).value());
  EXPECT_EQ(ring->Reclaim(), 1u);
  Frames copies = ShareFrames(frames);
  frames.clear();
  EXPECT_EQ(ring->Reclaim(), 1u);  // the copy still holds the slot
  EXPECT_TRUE(SameBytes(copies[0], original));
  copies.clear();
  EXPECT_EQ(ring->Reclaim(), 0u);
}

TEST_F(ShmTransportTest, ClosedSenderLeavesNoSegmentOnceTheTransportGoes) {
  zmq::message_t expect = Pattern(1 << 20, 5);
  Incoming kept;
  {
    Transport t;
    auto server = t.Listen(IpcEndpoint("close")).value();
    {
      auto client = t.Connect(server->BoundEndpoint()).value();
      Frames f;
      f.push_back(Pattern(1 << 20, 5));
      ASSERT_TRUE(client->Send(std::move(f)).ok());
      Result<Incoming> in = server->Recv(milliseconds(5000));
      ASSERT_TRUE(in.ok());
      kept = std::move(in).value();
    }
    // The client closed while the receiver holds its frame: the ring waits for it.
    EXPECT_EQ(OurSegments().size(), 1u);
    EXPECT_TRUE(SameBytes(kept.frames[0], expect));
    server.reset();
  }
  // The Transport unlinked it; the receiver's mapping still reads the bytes.
  EXPECT_TRUE(OurSegments().empty());
  EXPECT_TRUE(SameBytes(kept.frames[0], expect));
}

TEST_F(ShmTransportTest, ASendToAGonePeerFreesItsSlots) {
  auto ring = ShmRing::Create({.data_bytes = 1 << 20, .num_slots = 4}).value();
  zmq::message_t d = ring->Put("x", 1).value();
  EXPECT_EQ(ring->Reclaim(), 1u);
  EXPECT_FALSE(ring->Cancel(Pattern(80, 1)));
  EXPECT_TRUE(ring->Cancel(d));
  EXPECT_EQ(ring->Reclaim(), 0u);

  Transport t;
  auto server = t.Listen(IpcEndpoint("gone")).value();
  Frames f;
  f.push_back(Pattern(1 << 20, 1));
  Status s = server->Send("no-such-peer", std::move(f));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  ASSERT_EQ(OurSegments().size(), 2u);  // `ring` and the listener's ring for that peer
  server.reset();  // nothing held: unlinked at once, not when the Transport goes
  EXPECT_EQ(OurSegments().size(), 1u);
}

TEST_F(ShmTransportTest, AReservedFrameIsSentWithoutACopyAndFreedOnlyOnce) {
  auto ring = ShmRing::Create({.data_bytes = 1 << 20, .num_slots = 4}).value();
  ShmMapper mapper;
  zmq::message_t expect = Pattern(200 << 10, 7);
  {
    // Dropped unsent: the slot comes back.
    zmq::message_t unsent = ring->Reserve(100).value();
    EXPECT_EQ(ring->Reclaim(), 1u);
  }
  EXPECT_EQ(ring->Reclaim(), 0u);
  zmq::message_t f = ring->Reserve(expect.size()).value();
  std::memcpy(f.data(), expect.data(), expect.size());
  zmq::message_t d = ring->Commit(f).value();
  EXPECT_FALSE(ring->Commit(Pattern(200 << 10, 7)).has_value());  // not of the ring
  {
    // The receiver's use goes while the sender holds the frame: the slot stays, and the
    // frame may be sent again (a retry) as another descriptor of the same bytes.
    zmq::message_t got = mapper.Resolve(d).value();
    EXPECT_TRUE(SameBytes(got, expect));
  }
  EXPECT_EQ(ring->Reclaim(), 1u);
  EXPECT_FALSE(ring->Put("y", 1).value().empty());  // a new frame takes another slot
  zmq::message_t d2 = ring->Commit(f).value();
  f = zmq::message_t();            // the sender's frame goes: the receiver's use keeps the slot
  EXPECT_EQ(ring->Reclaim(), 2u);  // and the Put's unreleased one
  {
    zmq::message_t got = mapper.Resolve(d2).value();
    EXPECT_TRUE(SameBytes(got, expect));
    EXPECT_EQ(ring->Reclaim(), 2u);
  }
  EXPECT_EQ(ring->Reclaim(), 1u);
  // The reserved frame may outlive its ring's owner: it keeps the mapping.
  zmq::message_t late = ring->Reserve(10).value();
  std::weak_ptr<ShmRing> weak = ring;
  ring.reset();
  EXPECT_FALSE(weak.expired());
  static_cast<char*>(late.data())[9] = 'x';
  late = zmq::message_t();
  EXPECT_TRUE(weak.expired());
}

TEST_F(ShmTransportTest, ListenerRepliesBuiltInTheRingArriveIntact) {
  Transport t;
  auto server = t.Listen(IpcEndpoint("reserve")).value();
  auto client = t.Connect(server->BoundEndpoint()).value();
  Frames hello;
  hello.push_back(Pattern(8, 0));
  ASSERT_TRUE(client->Send(std::move(hello)).ok());
  Result<Incoming> in = server->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok());
  zmq::message_t expect = Pattern(3 << 20, 4);
  for (int i = 0; i < 3; ++i) {
    Frames reply;
    reply.push_back(Pattern(16, 1));
    reply.push_back(server->NewFrame(in->peer, expect.size()));
    std::memcpy(reply[1].data(), expect.data(), expect.size());
    ASSERT_TRUE(server->Send(in->peer, std::move(reply)).ok());
    Result<Frames> back = client->Recv(milliseconds(5000));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(back->size(), 2u);
    EXPECT_TRUE(SameBytes((*back)[1], expect)) << i;
  }
  EXPECT_EQ(t.shm_stats().frames_sent, 3u);
  EXPECT_EQ(t.shm_stats().frames_received, 3u);
  EXPECT_EQ(t.shm_stats().frames_built, 3u);
  // A reply sent twice (as the fault-injection wrapper duplicates one): the second is
  // another descriptor of the slot the sender still holds, intact even though the receiver
  // released the first in between.
  Frames reply;
  reply.push_back(server->NewFrame(in->peer, expect.size()));
  std::memcpy(reply[0].data(), expect.data(), expect.size());
  Frames again = ShareFrames(reply);
  ASSERT_TRUE(server->Send(in->peer, std::move(reply)).ok());
  {
    Result<Frames> first = client->Recv(milliseconds(5000));
    ASSERT_TRUE(first.ok());
    EXPECT_TRUE(SameBytes((*first)[0], expect));
  }  // released: the slot is free for the next frame
  ASSERT_TRUE(server->Send(in->peer, std::move(again)).ok());
  Result<Frames> second = client->Recv(milliseconds(5000));
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(SameBytes((*second)[0], expect));
  EXPECT_EQ(t.shm_stats().frames_built, 5u);
  // A small frame, or one for a tcp socket, is an ordinary frame.
  EXPECT_EQ(server->NewFrame(in->peer, 100).size(), 100u);
}

// A client's request built in its ring (KVClient's pushes): sent without a copy, kept by
// the sender for a resend while the receiver releases its use and other frames pass
// through the ring, sent again intact, and resent on another connection (a failover's
// redirect) as a copy from the held slot.
TEST_F(ShmTransportTest, ClientFramesBuiltInTheRingStayIntactForResends) {
  {
    Transport t;
    auto server = t.Listen(IpcEndpoint("push")).value();
    auto backup = t.Listen(IpcEndpoint("push_backup")).value();
    auto client = t.Connect(server->BoundEndpoint()).value();
    const zmq::message_t expect = Pattern(1 << 20, 11);
    Frames kept;
    {
      Frames f;
      f.push_back(Pattern(16, 0));
      f.push_back(client->NewFrame(expect.size()));
      std::memcpy(f[1].data(), expect.data(), expect.size());
      kept = ShareFrames(f);  // what KVClient keeps for retries
      ASSERT_TRUE(client->Send(std::move(f)).ok());
    }
    {
      Result<Incoming> in = server->Recv(milliseconds(5000));
      ASSERT_TRUE(in.ok()) << in.status().ToString();
      ASSERT_EQ(in->frames.size(), 2u);
      EXPECT_TRUE(SameBytes(in->frames[1], expect));
    }  // released by the receiver
    EXPECT_EQ(t.shm_stats().frames_built, 1u);
    // Other frames through the ring meanwhile (first fit would reuse a freed slot's bytes).
    for (uint32_t i = 0; i < 3; ++i) {
      Frames other;
      other.push_back(Pattern(1 << 20, 20 + i));
      ASSERT_TRUE(client->Send(std::move(other)).ok());
      Result<Incoming> in = server->Recv(milliseconds(5000));
      ASSERT_TRUE(in.ok());
      EXPECT_TRUE(SameBytes(in->frames[0], Pattern(1 << 20, 20 + i)));
    }
    // The retry: the same bytes, no copy.
    ASSERT_TRUE(client->Send(ShareFrames(kept)).ok());
    {
      Result<Incoming> in = server->Recv(milliseconds(5000));
      ASSERT_TRUE(in.ok()) << in.status().ToString();
      ASSERT_TRUE(in->bad_frame.ok()) << in->bad_frame.ToString();
      EXPECT_TRUE(SameBytes(in->frames[1], expect));
    }
    EXPECT_EQ(t.shm_stats().frames_built, 2u);
    // The redirect: another connection's ring gets a copy of the held slot's bytes.
    auto other = t.Connect(backup->BoundEndpoint()).value();
    const uint64_t sent_before = t.shm_stats().frames_sent;
    ASSERT_TRUE(other->Send(ShareFrames(kept)).ok());
    {
      Result<Incoming> in = backup->Recv(milliseconds(5000));
      ASSERT_TRUE(in.ok()) << in.status().ToString();
      EXPECT_TRUE(SameBytes(in->frames[1], expect));
    }
    EXPECT_EQ(t.shm_stats().frames_sent, sent_before + 1);
    EXPECT_EQ(t.shm_stats().frames_built, 2u);
    // A small frame is an ordinary one; with shm off, every frame is.
    EXPECT_EQ(client->NewFrame(100).size(), 100u);
  }
  TransportOptions off;
  off.shm = ShmMode::kOff;
  Transport t(off);
  auto server = t.Listen(IpcEndpoint("push_off")).value();
  auto client = t.Connect(server->BoundEndpoint()).value();
  Frames f;
  f.push_back(client->NewFrame(1 << 20));
  std::memset(f[0].data(), 7, f[0].size());
  ASSERT_TRUE(client->Send(std::move(f)).ok());
  ASSERT_TRUE(server->Recv(milliseconds(5000)).ok());
  EXPECT_EQ(t.shm_stats().frames_sent, 0u);
  EXPECT_TRUE(OurSegments().empty());
}

// Frames built on several threads while the socket's thread sends: each arrives intact; a
// ring that is full gives ordinary frames, which go inline.
TEST_F(ShmTransportTest, FramesBuiltOnOtherThreadsAndAFullRingGoesInline) {
  TransportOptions o;
  o.shm_ring_slots = 4;
  o.shm_ring_bytes = 8 << 20;
  Transport t(o);
  auto server = t.Listen(IpcEndpoint("threads")).value();
  auto client = t.Connect(server->BoundEndpoint()).value();
  // Four slots held by the sender (kept for a resend): the fifth frame is ordinary.
  std::vector<zmq::message_t> held;
  for (int i = 0; i < 4; ++i) held.push_back(client->NewFrame(256 << 10));
  Frames f;
  f.push_back(client->NewFrame(256 << 10));
  std::memset(f[0].data(), 3, f[0].size());
  ASSERT_TRUE(client->Send(std::move(f)).ok());
  Result<Incoming> in = server->Recv(milliseconds(5000));
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->frames[0].size(), size_t{256} << 10);
  EXPECT_EQ(static_cast<const char*>(in->frames[0].data())[1000], 3);
  EXPECT_EQ(t.shm_stats().frames_inline, 1u);
  EXPECT_EQ(t.shm_stats().frames_sent, 0u);
  held.clear();
  in = Incoming();

  constexpr int kThreads = 4, kPerThread = 25;
  std::mutex mu;
  std::vector<std::pair<uint32_t, zmq::message_t>> built;  // guarded by mu
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint32_t seed = static_cast<uint32_t>(th * 100 + i);
        zmq::message_t m = client->NewFrame(128 << 10);
        zmq::message_t p = Pattern(m.size(), seed);
        std::memcpy(m.data(), p.data(), p.size());
        std::lock_guard<std::mutex> l(mu);
        built.emplace_back(seed, std::move(m));
      }
    });
  }
  // This thread is the socket's: it sends what the others built, as they build it.
  int received = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (received < kThreads * kPerThread && std::chrono::steady_clock::now() < deadline) {
    std::vector<std::pair<uint32_t, zmq::message_t>> batch;
    {
      std::lock_guard<std::mutex> l(mu);
      batch.swap(built);
    }
    for (auto& [seed, m] : batch) {
      Frames frames;
      frames.push_back(zmq::message_t(&seed, sizeof(seed)));
      frames.push_back(std::move(m));
      EXPECT_TRUE(client->Send(std::move(frames)).ok());  // no ASSERT: the threads are joined below
    }
    while (true) {
      Result<Incoming> r = server->Recv(milliseconds(batch.empty() ? 10 : 1000));
      if (!r.ok()) break;
      ++received;
      if (r->frames.size() != 2 || r->frames[0].size() != sizeof(uint32_t)) {
        ADD_FAILURE() << "a message of " << r->frames.size() << " frames";
        continue;
      }
      uint32_t seed;
      std::memcpy(&seed, r->frames[0].data(), sizeof(seed));
      EXPECT_TRUE(SameBytes(r->frames[1], Pattern(128 << 10, seed))) << seed;
    }
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(received, kThreads * kPerThread);
  EXPECT_EQ(t.shm_stats().frames_sent + t.shm_stats().frames_inline - 1,
            static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_GT(t.shm_stats().frames_built, 0u);
  EXPECT_EQ(t.shm_stats().bad_descriptors, 0u);
}

TEST_F(ShmTransportTest, StaleSegmentsOfDeadProcessesAreRemoved) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string stale = "/ps_shm_" + std::to_string(child) + "_0123456789abcdef";
  const std::string live = "/ps_shm_" + std::to_string(getpid()) + "_0123456789abcdef";
  for (const std::string& name : {stale, live}) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << name;
    close(fd);
  }
  EXPECT_GE(CleanStaleShmSegments(), 1);
  errno = 0;
  EXPECT_EQ(shm_open(stale.c_str(), O_RDONLY, 0), -1);
  EXPECT_EQ(errno, ENOENT);
  int fd = shm_open(live.c_str(), O_RDONLY, 0);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  shm_unlink(live.c_str());
}

}  // namespace
}  // namespace ps
