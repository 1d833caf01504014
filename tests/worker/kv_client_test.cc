// KVClient against real servers on real sockets (ZeroMQ's in-process transport): request
// split and merge, many requests in flight, callbacks, errors, timeouts, and a server
// that keeps serving good clients while a bad peer sends it garbage.
#include "worker/kv_client.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <zmq_addon.hpp>

#include "server/server_node.h"
#include "tests/server/test_messages.h"
#include "tests/worker/in_process_cluster.h"

namespace ps {
namespace {

class KVClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = JobConfig::FromFlagMap({{"model", "none"},
                                      {"tables", "d:1001:5:zeros,s:sparse:3:zeros"},
                                      {"num_servers", "3"},
                                      {"base_lr", "1"}})
                  .value();
    cluster_ = std::make_unique<testing::InProcessCluster>(&transport_, config_);
    client_ = NewClient();
  }
  std::unique_ptr<KVClient> NewClient(
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    KVClientOptions o;
    o.request_timeout = timeout;
    return KVClient::Create(&transport_, config_, cluster_->endpoints(), o).value();
  }

  Transport transport_;
  JobConfig config_;
  std::unique_ptr<testing::InProcessCluster> cluster_;
  std::unique_ptr<KVClient> client_;
};

TEST_F(KVClientTest, DenseRangeSplitsAcrossServersAndMerges) {
  const size_t rows = 1001, w = 5;
  std::vector<float> grad(rows * w);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 97) - 48.0f;
  ASSERT_TRUE(client_->Wait(client_->PushRange(0, RowRange{0, rows}, grad)).ok());
  std::vector<float> out(rows * w, 123.0f);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, rows}, out)).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], -grad[i]) << i;
  // Every server got a share.
  for (int s = 0; s < 3; ++s) EXPECT_EQ(cluster_->core(s).stats().pushes_applied, 1u);
  // A sub-range pull lands at the right offsets.
  std::vector<float> part(10 * w);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{330, 340}, part)).ok());
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], -grad[330 * w + i]);
}

TEST_F(KVClientTest, KeyListsScatterBackInRequestOrder) {
  std::vector<uint64_t> keys = {5, 1ull << 63, 17, 5, 999999999999ull, 2, 40};
  std::vector<float> grad(keys.size() * 3);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i + 1);
  ASSERT_TRUE(client_->Wait(client_->Push(1, keys, grad)).ok());
  std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  std::vector<float> out(reversed.size() * 3);
  ASSERT_TRUE(client_->Wait(client_->Pull(1, reversed, out)).ok());
  for (size_t i = 0; i < reversed.size(); ++i) {
    for (size_t j = 0; j < 3; ++j) {
      float expect = 0;
      for (size_t k = 0; k < keys.size(); ++k) {
        if (keys[k] == reversed[i]) expect -= grad[k * 3 + j];
      }
      EXPECT_EQ(out[i * 3 + j], expect) << "key " << reversed[i];
    }
  }
  // Dense tables accept key lists too.
  std::vector<float> g(2 * 5, 1.0f);
  ASSERT_TRUE(client_->Wait(client_->Push(0, std::vector<uint64_t>{0, 1000}, g)).ok());
  std::vector<float> o(2 * 5);
  ASSERT_TRUE(client_->Wait(client_->Pull(0, std::vector<uint64_t>{1000, 0}, o)).ok());
  for (float x : o) EXPECT_EQ(x, -1.0f);
}

// --pull_dtype: 16-bit pulls, range and key-list, come back as the stored values rounded
// to that type, in half the bytes; set_pull_dtype(fp32) gets them exact again.
TEST_F(KVClientTest, SixteenBitPullsReturnTheRoundedRows) {
  const size_t rows = 1001, w = 5;
  std::vector<float> grad(rows * w);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.001f * static_cast<float>(i) + 1.0f / 3;
  ASSERT_TRUE(client_->Wait(client_->PushRange(0, RowRange{0, rows}, grad)).ok());
  auto rounded = [](float x, WireDtype dtype) {
    uint16_t half;
    float back;
    EncodeFloats(std::span<const float>(&x, 1), dtype, &half);
    DecodeFloats(&half, dtype, std::span<float>(&back, 1));
    return back;
  };
  for (WireDtype dtype : {WireDtype::kBf16, WireDtype::kFp16}) {
    client_->set_pull_dtype(dtype);
    const uint64_t before = client_->stats().bytes_pulled;
    std::vector<float> out(rows * w);
    ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, rows}, out)).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], rounded(-grad[i], dtype)) << WireDtypeName(dtype) << " " << i;
    }
    EXPECT_EQ(client_->stats().bytes_pulled - before, rows * w * 2);
    std::vector<float> keyed(2 * w);
    ASSERT_TRUE(client_->Wait(client_->Pull(0, std::vector<uint64_t>{1000, 7}, keyed)).ok());
    EXPECT_EQ(keyed[0], rounded(-grad[1000 * w], dtype));
    EXPECT_EQ(keyed[w + 1], rounded(-grad[7 * w + 1], dtype));
  }
  client_->set_pull_dtype(WireDtype::kFp32);
  std::vector<float> exact(rows * w);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, rows}, exact)).ok());
  for (size_t i = 0; i < exact.size(); ++i) ASSERT_EQ(exact[i], -grad[i]) << i;
}

TEST_F(KVClientTest, ManyRequestsInFlightFromSeveralThreads) {
  constexpr int kThreads = 4, kPushes = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<Ticket> tickets;
      std::vector<float> grad(1001 * 5, 0.25f);
      for (int i = 0; i < kPushes; ++i) {
        tickets.push_back(client_->PushRange(0, RowRange{0, 1001}, grad));
      }
      for (Ticket tk : tickets) EXPECT_TRUE(client_->Wait(tk).ok());
    });
  }
  for (auto& t : threads) t.join();
  std::vector<float> out(1001 * 5);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, 1001}, out)).ok());
  for (float x : out) ASSERT_EQ(x, -0.25f * kThreads * kPushes);
  EXPECT_EQ(client_->stats().pushes, static_cast<uint64_t>(kThreads * kPushes));
}

// Requests made under a cork go to each server as one batch and keep their order: the pull
// sees the push before it, and the clock tick comes after both.
TEST_F(KVClientTest, CorkedRequestsKeepTheirOrderAndComplete) {
  const size_t rows = 1001, w = 5;
  std::vector<float> grad(rows * w);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 13);
  std::vector<float> out(rows * w, 7.0f);
  std::vector<Ticket> tickets;
  {
    KVClient::Corked batch(*client_);
    tickets.push_back(client_->PushRange(0, RowRange{0, rows}, grad));
    tickets.push_back(client_->PullRange(0, RowRange{0, rows}, out));
    tickets.push_back(client_->Clock());
  }
  for (Ticket t : tickets) ASSERT_TRUE(client_->Wait(t).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], -grad[i]) << i;
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(cluster_->core(s).stats().pushes_applied, 1u);
    EXPECT_EQ(cluster_->core(s).worker_clock(0), 1);
  }
}

TEST_F(KVClientTest, CallbackRunsOnceAndTheTicketIsForgotten) {
  std::promise<Status> done;
  std::vector<float> grad(5, 1.0f);
  Ticket t =
      client_->PushRange(0, RowRange{7, 8}, grad, [&](const Status& s) { done.set_value(s); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(client_->Wait(t).code(), StatusCode::kNotFound);
}

TEST_F(KVClientTest, BadArgumentsFailAtOnceWithoutSending) {
  std::vector<float> small(3);
  Status s = client_->Wait(client_->PushRange(0, RowRange{0, 2}, small));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 2 rows x 5"), std::string::npos) << s.message();
  EXPECT_EQ(client_->Wait(client_->PullRange(0, RowRange{1000, 1002}, small)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Wait(client_->PullRange(1, RowRange{0, 1}, small)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Wait(client_->Pull(7, std::vector<uint64_t>{1}, small)).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(client_->FindTable("s").value(), 1u);
  EXPECT_FALSE(client_->FindTable("nope").ok());
  // An empty request completes at once.
  EXPECT_TRUE(client_->Wait(client_->Pull(1, std::vector<uint64_t>{}, {})).ok());
  EXPECT_EQ(client_->stats().bytes_pushed, 0u);
}

TEST_F(KVClientTest, ServerErrorsReachTheCallerAndChangeNothing) {
  std::vector<float> grad(1001 * 5, 1.0f);
  grad[2500] = std::numeric_limits<float>::quiet_NaN();
  Status s = client_->Wait(client_->PushRange(0, RowRange{0, 1001}, grad));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s.message();
  std::vector<float> out(1001 * 5);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, 1001}, out)).ok());
  // The server holding row 500 refused its whole part; the others applied theirs, since
  // parts are independent requests. Row 500's server applied nothing.
  int holder = ShardMap(config_.table_specs, 3).ServerOf(0, 500);
  RowRange held = ShardMap(config_.table_specs, 3).DenseRangeOf(0, holder);
  for (uint64_t r = held.begin; r < held.end; ++r) EXPECT_EQ(out[r * 5], 0.0f);
  EXPECT_EQ(cluster_->core(holder).stats().pushes_rejected, 1u);
}

TEST_F(KVClientTest, ServerKeepsServingWhileABadPeerSendsGarbage) {
  auto bad = transport_.Connect(cluster_->endpoints()[0]).value();
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::thread attacker([&] {
    int i = 0;
    while (!stop.load()) {
      Frames f;
      switch (i++ % 4) {
        case 0:
          f.push_back(zmq::message_t(std::string(33, '\x01')));
          break;
        case 1:
          f = testing::RangePush(1, 0, 0, 1, {1, 1});
          break;  // wrong length
        case 2:
          f = testing::RangePush(1, 42, 0, 1, {1, 1, 1, 1, 1});
          break;  // unknown table
        case 3:
          f = testing::RangePush(1, 0, 0, 1, {1, 1, 1, 1, 1}, 99);
          break;  // version
      }
      if (!bad->Send(std::move(f)).ok()) break;
      Result<Frames> r = bad->Recv(std::chrono::seconds(10));
      if (r.ok() && !testing::ReplyStatus(*r).ok()) ++errors;
    }
  });
  std::vector<float> grad(1001 * 5, 1.0f);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(client_->Wait(client_->PushRange(0, RowRange{0, 1001}, grad)).ok());
  }
  stop = true;
  attacker.join();
  EXPECT_GT(errors.load(), 0);
  std::vector<float> out(1001 * 5);
  ASSERT_TRUE(client_->Wait(client_->PullRange(0, RowRange{0, 1001}, out)).ok());
  for (float x : out) ASSERT_EQ(x, -20.0f);
}

TEST(KVClientTimeoutTest, UnansweredRequestsTimeOut) {
  Transport t;
  JobConfig config =
      JobConfig::FromFlagMap({{"model", "none"}, {"tables", "d:4:1"}, {"num_servers", "1"}})
          .value();
  // Nobody listens here: the request waits in ZeroMQ's queue until it times out.
  KVClientOptions o;
  o.request_timeout = std::chrono::milliseconds(300);
  auto client = KVClient::Create(&t, config, {"inproc://nobody_listens"}, o).value();
  std::vector<float> out(4);
  auto start = std::chrono::steady_clock::now();
  Status s = client->Wait(client->PullRange(0, RowRange{0, 4}, out));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(secs, 0.25);
  EXPECT_LT(secs, 10.0);
}

// One server, a 4x2 table of zeros, SGD at rate 1, no staleness bound: the model is the
// sum of the pushes applied.
JobConfig RetryTestConfig() {
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:4:2:zeros"},
                                 {"num_servers", "1"},
                                 {"staleness", "-1"},
                                 {"base_lr", "1"}})
      .value();
}

// A push whose reply is lost is sent again with the same request id; the server applies it
// once and answers the retry.
TEST(KVClientRetryTest, ALostReplyIsRetriedWithTheSameIdAndAppliedOnce) {
  Transport transport;
  JobConfig config = RetryTestConfig();
  auto core = ServerCore::Create(config, 0).value();
  auto socket = transport.Listen("inproc://kv_client_retry_test").value();
  std::vector<uint64_t> ids;  // request ids the server saw
  std::atomic<bool> stop{false};
  std::thread server([&] {
    bool dropped = false;
    while (!stop.load()) {
      Result<Incoming> in = socket->Recv(std::chrono::milliseconds(20));
      if (!in.ok()) continue;
      ids.push_back(DecodedHeader::Decode(in->frames[0]).value().get().getRequestId());
      std::vector<Outgoing> out;
      ServerCore::After after;
      core->Handle(in->peer, in->frames, &out, &after);
      if (!dropped) {
        dropped = true;  // the reply to the first request is lost on the way
        continue;
      }
      for (Outgoing& o : out) (void)socket->Send(o.peer, std::move(o.frames));
    }
  });
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(20);
  o.retry_interval = std::chrono::milliseconds(200);
  auto client = KVClient::Create(&transport, config, {socket->BoundEndpoint()}, o).value();
  std::vector<float> grad(8, 1.0f);
  EXPECT_TRUE(client->Wait(client->PushRange(0, RowRange{0, 4}, grad)).ok());
  stop = true;
  server.join();
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], ids[1]) << "the retry carries the same request id";
  EXPECT_GE(client->stats().retries, 1u);
  EXPECT_EQ(core->stats().pushes_applied, 1u) << "applied once";
  EXPECT_GE(core->stats().pushes_duplicate, 1u);
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>({-1.0f, -1.0f}));
}

// Failover: a server that never answers is replaced by another endpoint (its promoted
// backup); Redirect resends the unanswered part there at once, with the same request id
// and the target server named in the header.
TEST(KVClientRetryTest, ARedirectResendsUnansweredPartsWithTheSameIds) {
  Transport transport;
  JobConfig config = RetryTestConfig();
  auto dead = transport.Listen("inproc://kv_client_dead_server").value();
  auto backup = transport.Listen("inproc://kv_client_promoted_backup").value();
  auto core = ServerCore::Create(config, 0).value();
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(20);
  o.retry_interval = std::chrono::seconds(60);  // no retry within the test: only the redirect
  auto client = KVClient::Create(&transport, config, {dead->BoundEndpoint()}, o).value();
  std::vector<float> grad(8, 1.0f);
  const Ticket t = client->PushRange(0, RowRange{0, 4}, grad);
  // The dead server got the push and never answers.
  Result<Incoming> lost = dead->Recv(std::chrono::seconds(10));
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  const uint64_t id = DecodedHeader::Decode(lost->frames[0]).value().get().getRequestId();
  client->Redirect(0, backup->BoundEndpoint());
  client->Redirect(0, backup->BoundEndpoint());  // repeated (every heartbeat): no-op
  Result<Incoming> in = backup->Recv(std::chrono::seconds(10));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  DecodedHeader h = DecodedHeader::Decode(in->frames[0]).value();
  EXPECT_EQ(h.get().getRequestId(), id) << "the same request id";
  EXPECT_EQ(h.get().getTargetServer(), 0) << "the header names the target server";
  std::vector<Outgoing> out;
  ServerCore::After after;
  core->Handle(in->peer, in->frames, &out, &after);
  for (Outgoing& r : out) ASSERT_TRUE(backup->Send(r.peer, std::move(r.frames)).ok());
  EXPECT_TRUE(client->Wait(t).ok());
  EXPECT_EQ(core->ReadRow(0, 0).value(), std::vector<float>({-1.0f, -1.0f}));
  // Then the client's clock, after the resent parts (a server restarted from a checkpoint
  // learns where the worker stands); its reply answers no ticket and is dropped.
  in = backup->Recv(std::chrono::seconds(10));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  h = DecodedHeader::Decode(in->frames[0]).value();
  ASSERT_EQ(h.get().getBody().which(), wire::Header::Body::CLOCK);
  EXPECT_EQ(h.get().getBody().getClock().getClock(), client->clock());
  EXPECT_FALSE(h.get().getBody().getClock().getLeave());
  EXPECT_EQ(h.get().getTargetServer(), 0);
  out.clear();
  core->Handle(in->peer, in->frames, &out, &after);
  for (Outgoing& r : out) ASSERT_TRUE(backup->Send(r.peer, std::move(r.frames)).ok());
  // Later requests go to the new endpoint.
  std::vector<float> rows(8);
  const Ticket pull = client->PullRange(0, RowRange{0, 4}, rows);
  in = backup->Recv(std::chrono::seconds(10));
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  out.clear();
  core->Handle(in->peer, in->frames, &out, &after);
  for (Outgoing& r : out) ASSERT_TRUE(backup->Send(r.peer, std::move(r.frames)).ok());
  EXPECT_TRUE(client->Wait(pull).ok());
  EXPECT_EQ(rows[0], -1.0f);
}

// What a server receives from a cork: one ZeroMQ message holding every request, seen here
// by a plain ROUTER socket that does not split batches.
TEST(KVClientBatchTest, CorkedRequestsToOneServerTravelAsOneMessage) {
  JobConfig config =
      JobConfig::FromFlagMap(
          {{"model", "none"}, {"tables", "a:4:2:zeros,b:8:3:zeros"}, {"num_servers", "1"}})
          .value();
  const std::string endpoint =
      "ipc:///tmp/ps_kv_batch_test_" + std::to_string(::getpid()) + ".sock";
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(endpoint);
  Transport transport;
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(5);
  auto client = KVClient::Create(&transport, config, {endpoint}, o).value();
  std::vector<float> a(4 * 2), b(8 * 3);
  {
    KVClient::Corked batch(*client);
    client->PullRange(0, RowRange{0, 4}, a, [](const Status&) {});
    client->PullRange(1, RowRange{0, 8}, b, [](const Status&) {});
    client->Clock([](const Status&) {});
  }
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_GT(zmq::poll(&item, 1, std::chrono::milliseconds(5000)), 0) << "nothing arrived";
  std::vector<zmq::message_t> frames;
  ASSERT_TRUE(zmq::recv_multipart(router, std::back_inserter(frames)).has_value());
  ASSERT_GE(frames.size(), 2u);
  frames.erase(frames.begin());  // the routing identity
  ASSERT_TRUE(LooksLikeBatch(frames[0]));
  Result<std::vector<Frames>> messages = UnpackBatch(std::move(frames));
  ASSERT_TRUE(messages.ok()) << messages.status().ToString();
  EXPECT_EQ(messages->size(), 3u) << "two pulls and a clock tick in one message";
  // Nothing else was sent.
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(100)), 0);
  client.reset();
  ::unlink(endpoint.substr(6).c_str());
}

// Over ipc:// with shared memory: a 65536x2 table, so that a push's payload (512 KB) is
// built in the client's ring.
JobConfig ShmTestConfig() {
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:65536:2:zeros"},
                                 {"num_servers", "1"},
                                 {"staleness", "-1"},
                                 {"base_lr", "1"}})
      .value();
}

std::string ShmEndpoint(const std::string& name) {
  return "ipc:///tmp/ps_kv_shm_" + std::to_string(getpid()) + "_" + name;
}

// This process's segments in /dev/shm (the test must leave none).
int OurShmSegments() {
  int n = 0;
  const std::string prefix = "ps_shm_" + std::to_string(getpid()) + "_";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
    closedir(d);
  }
  return n;
}

std::vector<float> Gradient(size_t n, float scale) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = scale * static_cast<float>(i % 13 + 1);
  return g;
}

bool PayloadIs(const zmq::message_t& frame, const std::vector<float>& g) {
  return frame.size() == g.size() * sizeof(float) &&
         std::memcmp(frame.data(), g.data(), frame.size()) == 0;
}

// A push built in the ring whose reply is lost: the receiver released its frame, and a
// second push went through the ring meanwhile, yet the retry (same id) carries the first
// push's bytes; the server applies it once.
TEST(KVClientShmTest, APushBuiltInTheRingIsResentIntactAndAppliedOnce) {
  {
    Transport transport;
    JobConfig config = ShmTestConfig();
    auto core = ServerCore::Create(config, 0).value();
    auto socket = transport.Listen(ShmEndpoint("retry")).value();
    const size_t n = 65536 * 2;
    const std::vector<float> a = Gradient(n, 1.0f), b = Gradient(n, -0.25f);
    std::mutex mu;
    std::vector<uint64_t> ids;  // push request ids the server saw, guarded by mu
    std::vector<bool> intact;   // whether each carried the right bytes, guarded by mu
    uint64_t first_id = 0;
    std::atomic<bool> stop{false};
    std::thread server([&] {
      bool dropped = false;
      while (!stop.load()) {
        Result<Incoming> in = socket->Recv(std::chrono::milliseconds(20));
        if (!in.ok() || in->frames.size() != 2) continue;
        const uint64_t id = DecodedHeader::Decode(in->frames[0]).value().get().getRequestId();
        {
          std::lock_guard<std::mutex> l(mu);
          if (ids.empty()) first_id = id;
          ids.push_back(id);
          intact.push_back(PayloadIs(in->frames[1], id == first_id ? a : b));
        }
        std::vector<Outgoing> out;
        ServerCore::After after;
        core->Handle(in->peer, in->frames, &out, &after);
        in = Incoming();  // the receiver lets go of the shared bytes before answering
        if (!dropped) {
          dropped = true;  // the reply to the first push is lost on the way
          continue;
        }
        for (Outgoing& o : out) (void)socket->Send(o.peer, std::move(o.frames));
      }
    });
    KVClientOptions o;
    o.request_timeout = std::chrono::seconds(20);
    o.retry_interval = std::chrono::milliseconds(300);
    o.chunk_bytes = 0;  // the 512 KB push as one frame
    auto client = KVClient::Create(&transport, config, {socket->BoundEndpoint()}, o).value();
    std::vector<float> buffer = a;
    const Ticket ta = client->PushRange(0, RowRange{0, 65536}, buffer);
    std::fill(buffer.begin(), buffer.end(), 1e6f);  // the caller may reuse it at once
    // Once the server has the first push (and released it), a second one through the ring.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!ids.empty()) break;
      }
      std::this_thread::yield();
    }
    buffer = b;
    EXPECT_TRUE(client->Wait(client->PushRange(0, RowRange{0, 65536}, buffer)).ok());
    EXPECT_TRUE(client->Wait(ta).ok());
    stop = true;
    server.join();
    ASSERT_GE(ids.size(), 3u);
    // The retry of the first push may come before or after the second push (it is due
    // retry_interval after the first was sent, however slow the threads run).
    EXPECT_GE(std::count(ids.begin(), ids.end(), first_id), 2)
        << "the retry carries the same request id";
    EXPECT_EQ(intact, std::vector<bool>(ids.size(), true)) << "every push carried its bytes";
    EXPECT_EQ(core->stats().pushes_applied, 2u) << "applied once";
    EXPECT_GE(core->stats().pushes_duplicate, 1u);
    EXPECT_EQ(core->ReadRow(0, 7).value(),
              std::vector<float>({-(a[14] + b[14]), -(a[15] + b[15])}));
    EXPECT_EQ(transport.shm_stats().frames_built, ids.size()) << "built in the ring, retries too";
    client.reset();
    socket.reset();
  }
  EXPECT_EQ(OurShmSegments(), 0);
}

// A failover over ipc://: the resend to the promoted backup (another socket, another ring)
// is a copy of the bytes the first ring still holds.
TEST(KVClientShmTest, ARedirectResendsTheHeldBytesToTheNewServer) {
  {
    Transport transport;
    JobConfig config = ShmTestConfig();
    auto dead = transport.Listen(ShmEndpoint("dead")).value();
    auto backup = transport.Listen(ShmEndpoint("backup")).value();
    auto core = ServerCore::Create(config, 0).value();
    KVClientOptions o;
    o.request_timeout = std::chrono::seconds(20);
    o.retry_interval = std::chrono::seconds(60);  // only the redirect resends
    o.chunk_bytes = 0;                            // the 512 KB push as one frame
    auto client = KVClient::Create(&transport, config, {dead->BoundEndpoint()}, o).value();
    const std::vector<float> g = Gradient(65536 * 2, 0.5f);
    std::vector<float> buffer = g;
    const Ticket t = client->PushRange(0, RowRange{0, 65536}, buffer);
    std::fill(buffer.begin(), buffer.end(), 0.0f);
    {
      Result<Incoming> lost = dead->Recv(std::chrono::seconds(10));
      ASSERT_TRUE(lost.ok()) << lost.status().ToString();
      EXPECT_TRUE(PayloadIs(lost->frames[1], g));
    }  // released unanswered
    client->Redirect(0, backup->BoundEndpoint());
    Result<Incoming> in = backup->Recv(std::chrono::seconds(10));
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->frames.size(), 2u);
    EXPECT_TRUE(PayloadIs(in->frames[1], g));
    std::vector<Outgoing> out;
    ServerCore::After after;
    core->Handle(in->peer, in->frames, &out, &after);
    for (Outgoing& r : out) ASSERT_TRUE(backup->Send(r.peer, std::move(r.frames)).ok());
    EXPECT_TRUE(client->Wait(t).ok());
    EXPECT_EQ(core->ReadRow(0, 3).value(), std::vector<float>({-g[6], -g[7]}));
    EXPECT_EQ(transport.shm_stats().frames_built, 1u);
    EXPECT_EQ(transport.shm_stats().frames_sent, 2u) << "the resend went through the new ring";
    client.reset();
    dead.reset();
    backup.reset();
  }
  EXPECT_EQ(OurShmSegments(), 0);
}

// What a run of three pull/push steps left, for comparing chunked requests with whole ones.
struct ChunkOutcome {
  std::vector<float> model;
  std::vector<uint64_t> versions;
  KVClientStats stats;
  uint64_t applied = 0;   // pushes the servers counted
  uint64_t requests = 0;  // request ids the client used
};

// Three steps on a fresh in-process cluster of `config` with these chunks: pull into w,
// push gradient(w, step) computed from it; then the model as a last pull reads it. `pull`
// and `push` make the requests (range or key list) of a table of `floats` floats.
ChunkOutcome RunChunked(
    const JobConfig& config, size_t chunk_bytes, size_t floats,
    const std::function<Ticket(KVClient&, std::span<float>)>& pull,
    const std::function<Ticket(KVClient&, std::span<const float>, const RequestInfo&)>& push,
    const std::function<float(const std::vector<float>&, size_t, int)>& gradient) {
  ChunkOutcome r;
  Transport t;
  testing::InProcessCluster cluster(&t, config);
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(20);
  o.chunk_bytes = chunk_bytes;
  auto client = KVClient::Create(&t, config, cluster.endpoints(), o).value();
  const uint64_t first_id = client->next_request_id();
  std::vector<float> w(floats);
  for (int step = 0; step < 3; ++step) {
    RequestInfo info;
    EXPECT_TRUE(client->Wait(pull(*client, w), &info).ok());
    std::vector<float> g(w.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = gradient(w, i, step);
    EXPECT_TRUE(client->Wait(push(*client, g, info)).ok());
  }
  RequestInfo info;
  r.model.resize(w.size());
  EXPECT_TRUE(client->Wait(pull(*client, r.model), &info).ok());
  r.versions = info.versions;
  r.stats = client->stats();
  r.requests = client->next_request_id() - first_id;
  for (int s = 0; s < config.num_servers; ++s) r.applied += cluster.core(s).stats().pushes_applied;
  return r;
}

// Chunked range requests (KVClientOptions::chunk_bytes): the same model bytes as unchunked
// ones, one shard version and one applied push per logical push (staleness unchanged).
TEST(KVClientChunkTest, ChunkedPushesAndPullsMatchUnchunkedOnes) {
  const JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                                   {"tables", "d:1001:5:zeros"},
                                                   {"num_servers", "3"},
                                                   {"optimizer", "momentum"},
                                                   {"base_lr", "0.5"}})
                               .value();
  auto run = [&](size_t chunk_bytes) {
    return RunChunked(
        config, chunk_bytes, 1001 * 5,
        [](KVClient& c, std::span<float> out) {
          return c.PullRange(0, RowRange{0, 1001}, out);
        },
        [](KVClient& c, std::span<const float> g, const RequestInfo& info) {
          return c.PushRange(0, RowRange{0, 1001}, g, nullptr, info.versions);
        },
        [](const std::vector<float>& w, size_t i, int step) {
          return static_cast<float>((i * 7 + step * 3) % 11) - 5.0f + 0.01f * w[i];
        });
  };
  const ChunkOutcome plain = run(0);
  const ChunkOutcome chunked = run(64);  // 3 rows of 5 floats a chunk: ~110 chunks per server
  EXPECT_GT(chunked.requests, 10 * plain.requests) << "the chunked run did chunk";
  EXPECT_EQ(chunked.model, plain.model);
  EXPECT_EQ(plain.versions, std::vector<uint64_t>({3, 3, 3}));
  EXPECT_EQ(chunked.versions, plain.versions) << "one version per logical push";
  EXPECT_EQ(plain.applied, 9u);
  EXPECT_EQ(chunked.applied, 9u);
  EXPECT_EQ(chunked.stats.staleness_count, plain.stats.staleness_count);
  EXPECT_EQ(chunked.stats.staleness_sum, plain.stats.staleness_sum);
  EXPECT_EQ(chunked.stats.bytes_pushed, plain.stats.bytes_pushed);
  EXPECT_EQ(chunked.stats.bytes_pulled, plain.stats.bytes_pulled);
}

// Chunked key lists: the same model as one request per server (duplicated keys included,
// applied in call order), one version and one applied push per server share, and the same
// bytes.
TEST(KVClientChunkTest, ChunkedKeyListsMatchUnchunkedOnes) {
  const JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                                   {"tables", "s:sparse:4:zeros"},
                                                   {"num_servers", "2"},
                                                   {"optimizer", "adagrad"},
                                                   {"base_lr", "0.5"}})
                               .value();
  // 300 keys, some twice, spread over both servers, in no order.
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 300; ++i) keys.push_back((i * 7919) % 257 + (i % 3) * 100000);
  auto run = [&](size_t chunk_bytes) {
    return RunChunked(
        config, chunk_bytes, keys.size() * 4,
        [&](KVClient& c, std::span<float> out) { return c.Pull(0, keys, out); },
        [&](KVClient& c, std::span<const float> g, const RequestInfo&) {
          return c.Push(0, keys, g);
        },
        [](const std::vector<float>& w, size_t i, int step) {
          return static_cast<float>((i * 5 + step) % 9) - 4.0f + 0.1f * w[i];
        });
  };
  const ChunkOutcome plain = run(0);
  const ChunkOutcome chunked = run(48);  // 3 rows of 4 floats a chunk: ~50 chunks per server
  EXPECT_GT(chunked.requests, 10 * plain.requests) << "the chunked run did chunk";
  EXPECT_EQ(chunked.model, plain.model);
  EXPECT_NE(plain.model, std::vector<float>(plain.model.size(), 0.0f)) << "the pushes applied";
  EXPECT_EQ(chunked.versions, plain.versions) << "one version per logical push";
  EXPECT_EQ(plain.applied, 6u);  // 3 pushes x 2 servers
  EXPECT_EQ(chunked.applied, 6u);
  EXPECT_EQ(chunked.stats.staleness_count, plain.stats.staleness_count);
  EXPECT_EQ(chunked.stats.bytes_pushed, plain.stats.bytes_pushed);
  EXPECT_EQ(chunked.stats.bytes_pulled, plain.stats.bytes_pulled);
}

// A NaN in one chunk: that chunk is refused (nothing of it applied), the ticket reports the
// error, the other chunks are applied.
TEST_F(KVClientTest, ABadChunkIsRefusedAloneAndReported) {
  KVClientOptions o;
  o.request_timeout = std::chrono::seconds(20);
  o.chunk_bytes = 64;  // 3 rows a chunk
  auto client = KVClient::Create(&transport_, config_, cluster_->endpoints(), o).value();
  std::vector<float> grad(1001 * 5, 1.0f);
  grad[500 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();
  Status s = client->Wait(client->PushRange(0, RowRange{0, 1001}, grad));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s.message();
  std::vector<float> out(1001 * 5);
  ASSERT_TRUE(client->Wait(client->PullRange(0, RowRange{0, 1001}, out)).ok());
  const ShardMap map(config_.table_specs, 3);
  const RowRange held = map.DenseRangeOf(0, map.ServerOf(0, 500));
  const uint64_t bad_begin = held.begin + (500 - held.begin) / 3 * 3;
  for (uint64_t r = 0; r < 1001; ++r) {
    const float expect = r >= bad_begin && r < std::min(bad_begin + 3, held.end) ? 0.0f : -1.0f;
    ASSERT_EQ(out[r * 5], expect) << "row " << r;
  }
}

TEST(KVClientRetryTest, RequestIdsStartAtRandom) {
  Transport transport;
  JobConfig config =
      JobConfig::FromFlagMap({{"model", "none"}, {"tables", "d:4:2:zeros"}, {"num_servers", "1"}})
          .value();
  auto socket = transport.Listen("inproc://kv_client_id_test").value();
  auto a = KVClient::Create(&transport, config, {socket->BoundEndpoint()}, {}).value();
  auto b = KVClient::Create(&transport, config, {socket->BoundEndpoint()}, {}).value();
  // Two clients with the same sender id (a worker that rejoined) do not share ids.
  EXPECT_NE(a->next_request_id(), b->next_request_id());
  EXPECT_GT(a->next_request_id(), 1u);
}

}  // namespace
}  // namespace ps
