// Re-replication (server/replication.h): a whole copy of a server's shards (a replica
// snapshot, ServerCore::SaveReplica) makes a fresh core that answers and applies the
// requests to come exactly as the original would; a forwarded seed replaces a backup's
// copy; a promoted copy handed back becomes a backup's copy again.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/replication.h"
#include "server/server_node.h"
#include "tests/server/core_reads.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ClockTick;
using testing::DenseKeys;
using testing::KeyPush;
using testing::ReplyHeader;
using testing::ReplyStatus;
using testing::Rows;
using testing::VersionedPush;

JobConfig TwoServers() {
  // Adam keeps per-row state (moments and a step count) that a copy must carry.
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:8:3:uniform:1,s:sparse:2:normal:0.5"},
                                 {"num_servers", "2"},
                                 {"num_workers", "2"},
                                 {"replicas", "2"},
                                 {"staleness", "1"},
                                 {"optimizer", "adam"},
                                 {"lr_policy", "cosine"},
                                 {"max_iter", "100"},
                                 {"base_lr", "0.1"}})
      .value();
}

// Pushes from two workers, clock ticks, one worker gone: state of every kind a copy carries.
void Train(ServerCore& core, const JobConfig& config, uint64_t* rid, int64_t clocks) {
  const std::vector<uint64_t> dense = DenseKeys(config, core.server_id());
  for (int64_t clock = 0; clock < clocks; ++clock) {
    for (int w = 0; w < 2; ++w) {
      std::vector<float> g(dense.size() * 3);
      for (size_t i = 0; i < g.size(); ++i)
        g[i] = 0.01f * static_cast<float>(i + w) - clock * 0.03f;
      Frames push = VersionedPush(++*rid, 0, dense.front(), dense.back() + 1, g, w, clock, 0);
      ASSERT_TRUE(ReplyStatus(core.HandleOne(push)).ok());
      Frames sparse = KeyPush(++*rid, 1, {3, 1ull << 41, static_cast<uint64_t>(clock)},
                              {0.5f, -1, 2, 0.25f, 0.1f * clock, 1});
      ASSERT_TRUE(ReplyStatus(core.HandleOne(sparse)).ok());
      Frames tick = ClockTick(++*rid, w, clock + 1);
      ASSERT_TRUE(ReplyStatus(core.HandleOne(tick)).ok());
    }
  }
}

TEST(RereplicationTest, ACopyFromASnapshotGoesOnExactlyAsTheOriginal) {
  const JobConfig config = TwoServers();
  std::unique_ptr<ServerCore> original = ServerCore::Create(config, 0).value();
  uint64_t rid = 0;
  ASSERT_NO_FATAL_FAILURE(Train(*original, config, &rid, 4));
  std::string snapshot;
  ASSERT_TRUE(original->SaveReplica(&snapshot).ok());
  std::unique_ptr<ServerCore> copy = ServerCore::Create(config, 0).value();
  Status loaded = copy->LoadReplica(snapshot);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();

  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  const std::vector<uint64_t> sparse = {0, 1, 2, 3, 1ull << 41};
  EXPECT_EQ(Rows(*copy, 0, dense), Rows(*original, 0, dense));
  EXPECT_EQ(Rows(*copy, 1, sparse), Rows(*original, 1, sparse));
  EXPECT_NE(Rows(*copy, 0, dense), Rows(*ServerCore::Create(config, 0).value(), 0, dense));
  for (int w = 0; w < 2; ++w) EXPECT_EQ(copy->worker_clock(w), original->worker_clock(w));

  // A retry of a push the original applied is answered again by the copy, not applied.
  const std::vector<float> before = Rows(*copy, 1, sparse);
  Frames retry = KeyPush(rid - 1, 1, {3, 1ull << 41, 3}, {0.5f, -1, 2, 0.25f, 0.3f, 1});
  EXPECT_TRUE(ReplyStatus(copy->HandleOne(retry)).ok());
  EXPECT_EQ(copy->stats().pushes_duplicate, 1u);
  EXPECT_EQ(Rows(*copy, 1, sparse), before);

  // Worker 1 leaves on both; then the same requests keep both equal bit for bit (optimizer
  // state, shard versions, the lr schedule's progress and the clock table all came along).
  for (ServerCore* core : {original.get(), copy.get()}) {
    Frames leave = ClockTick(rid + 1, 1, 4, /*leave=*/true);
    ASSERT_TRUE(ReplyStatus(core->HandleOne(leave)).ok());
  }
  ++rid;
  uint64_t rid_original = rid, rid_copy = rid;
  ASSERT_NO_FATAL_FAILURE(Train(*original, config, &rid_original, 2));
  ASSERT_NO_FATAL_FAILURE(Train(*copy, config, &rid_copy, 2));
  EXPECT_EQ(Rows(*copy, 0, dense), Rows(*original, 0, dense));
  EXPECT_EQ(Rows(*copy, 1, sparse), Rows(*original, 1, sparse));
}

// --softsync=0 (the default job's: the server sums one push of each worker per update): a
// snapshot taken with one worker's push summed and the other's not yet there must leave the
// copy in step. The pending sum is applied on the original before the snapshot; without it,
// the copy's next update came one push later and its versions stayed one behind (found by
// scripts/soak.sh: the copy refused the pushes that followed).
TEST(RereplicationTest, APendingSoftSyncSumDoesNotPutTheCopyOutOfStep) {
  JobConfig config = TwoServers();
  config.softsync = 0;  // c = num_workers = 2
  std::unique_ptr<ServerCore> original = ServerCore::Create(config, 0).value();
  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  std::vector<float> g(dense.size() * 3, 0.25f);
  uint64_t rid = 0;
  Frames first = VersionedPush(++rid, 0, dense.front(), dense.back() + 1, g, 0, 0, 0);
  ASSERT_TRUE(ReplyStatus(original->HandleOne(first)).ok());
  EXPECT_EQ(original->shard_version(0), 0u) << "one of two pushes: summed, not applied";
  std::string snapshot;
  ASSERT_TRUE(original->SaveReplica(&snapshot).ok());
  EXPECT_EQ(original->shard_version(0), 1u) << "the pending sum was applied for the snapshot";
  std::unique_ptr<ServerCore> copy = ServerCore::Create(config, 0).value();
  ASSERT_TRUE(copy->LoadReplica(snapshot).ok());
  EXPECT_EQ(copy->shard_version(0), 1u);
  // Both workers push from version 1 on both cores: the same updates, the same versions.
  for (int w = 0; w < 2; ++w) {
    for (ServerCore* core : {original.get(), copy.get()}) {
      Frames push = VersionedPush(rid + 1 + w, 0, dense.front(), dense.back() + 1, g, w, 1, 1);
      Status s = ReplyStatus(core->HandleOne(push));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }
  EXPECT_EQ(copy->shard_version(0), original->shard_version(0));
  EXPECT_EQ(original->shard_version(0), 2u);
  EXPECT_EQ(Rows(*copy, 0, dense), Rows(*original, 0, dense));
}

TEST(RereplicationTest, ASnapshotOfAnotherServerOrCutShortIsRefused) {
  const JobConfig config = TwoServers();
  std::unique_ptr<ServerCore> zero = ServerCore::Create(config, 0).value();
  uint64_t rid = 0;
  ASSERT_NO_FATAL_FAILURE(Train(*zero, config, &rid, 2));
  std::string snapshot;
  ASSERT_TRUE(zero->SaveReplica(&snapshot).ok());

  Status other = ServerCore::Create(config, 1).value()->LoadReplica(snapshot);
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("snapshot of server 0 sent to a copy of server 1"),
            std::string::npos)
      << other.ToString();
  Status cut = ServerCore::Create(config, 0).value()->LoadReplica(
      std::string_view(snapshot).substr(0, snapshot.size() / 2));
  EXPECT_EQ(cut.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cut.message().find("no end marker"), std::string::npos) << cut.ToString();
  Status junk = ServerCore::Create(config, 0).value()->LoadReplica("not a snapshot at all");
  EXPECT_NE(junk.message().find("bad magic"), std::string::npos) << junk.ToString();
  JobConfig wider = config;
  wider.table_specs[0].width = 4;
  Status shape = ServerCore::Create(wider, 0).value()->LoadReplica(snapshot);
  EXPECT_EQ(shape.code(), StatusCode::kInvalidArgument) << shape.ToString();
}

Frames PromoteMessage(uint64_t rid, int primary) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, rid, -1).getBody().initPromote().setPrimary(primary);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

// Server 0 dies: server 1 serves its copy (promoted); the restarted server 0 gets it back
// (a seed it loads), server 1 holds its copy again and applies server 0's forwards; and
// server 1's own shards reach the restarted server 0 as a forwarded seed.
TEST(RereplicationTest, AHandBackAndAForwardedSeedMakeTheChainWholeAgain) {
  const JobConfig config = TwoServers();
  std::unique_ptr<ServerCore> primary = ServerCore::Create(config, 0).value();
  BackupStore on_one(config, 1);
  uint64_t rid = 0, seq = 0;
  Frames first = KeyPush(++rid, 1, {9}, {0.5f, -1});
  Frames forwarded = WrapForBackup(0, ++seq, ShareFrames(first));
  ASSERT_TRUE(ReplyStatus(primary->HandleOne(first)).ok());
  ASSERT_TRUE(ReplyStatus(on_one.Handle(forwarded)).ok());
  primary.reset();  // server 0 dies
  Frames promote = PromoteMessage(1, 0);
  ASSERT_TRUE(ReplyStatus(on_one.HandlePromote(promote)).ok());
  ServerCore* served = on_one.promoted(0);
  ASSERT_NE(served, nullptr);
  ASSERT_NO_FATAL_FAILURE(Train(*served, config, &rid, 2));

  // The hand back: the restarted server 0 loads the seed; server 1 holds a copy again.
  size_t bytes = 0;
  Result<Frames> seed = SeedMessage(*served, 7, &bytes);
  ASSERT_TRUE(seed.ok()) << seed.status().ToString();
  EXPECT_GT(bytes, 100u);
  std::unique_ptr<ServerCore> restarted = ServerCore::Create(config, 0).value();
  Frames loaded = LoadSeed(*restarted, 0, *seed);
  ASSERT_EQ(ReplyHeader(loaded).get().getBody().which(), wire::Header::Body::SEED_REPLY)
      << ReplyStatus(loaded).ToString();
  EXPECT_EQ(on_one.Unpromote(0), 0u);
  seq = 0;  // the restarted primary's link numbers its forwards from 1
  EXPECT_EQ(on_one.promoted(0), nullptr);
  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  EXPECT_EQ(Rows(*restarted, 0, dense), Rows(*on_one.shadow(0), 0, dense));
  // Forwards from the restarted primary are accepted again and keep the copies equal.
  Frames next = KeyPush(++rid, 1, {9, 10}, {1, 2, 3, 4});
  Frames next_forwarded = WrapForBackup(0, ++seq, ShareFrames(next));
  ASSERT_TRUE(ReplyStatus(restarted->HandleOne(next)).ok());
  ASSERT_TRUE(ReplyStatus(on_one.Handle(next_forwarded)).ok());
  EXPECT_EQ(Rows(*restarted, 1, {9, 10}), Rows(*on_one.shadow(0), 1, {9, 10}));
  // A seed for server 0 is not for a core of server 1.
  std::unique_ptr<ServerCore> wrong = ServerCore::Create(config, 1).value();
  EXPECT_EQ(ReplyStatus(LoadSeed(*wrong, 1, *seed)).code(), StatusCode::kInvalidArgument);

  // Server 1's own shards reach the restarted server 0 as the first forward of a new link:
  // its copy of server 1 is replaced by the seed's.
  std::unique_ptr<ServerCore> one = ServerCore::Create(config, 1).value();
  ASSERT_NO_FATAL_FAILURE(Train(*one, config, &rid, 3));
  BackupStore on_zero(config, 0);
  Result<Frames> own = SeedMessage(*one, 0, &bytes);
  ASSERT_TRUE(own.ok());
  Frames wrapped = WrapForBackup(1, 1, std::move(own).value());
  Frames ack = on_zero.Handle(wrapped);
  ASSERT_EQ(ReplyHeader(ack).get().getBody().which(), wire::Header::Body::REPLICATE_REPLY)
      << ReplyStatus(ack).ToString();
  const std::vector<uint64_t> dense_one = DenseKeys(config, 1);
  EXPECT_EQ(Rows(*on_zero.shadow(1), 0, dense_one), Rows(*one, 0, dense_one));
  EXPECT_EQ(on_zero.shadow(1)->worker_clock(0), 3);
}

// A restarted server (ServeOptions::awaiting_seed) answers none of its shards' requests
// until their copy has loaded: a push that reaches it first is neither applied nor
// acknowledged (it would be lost under the copy, or see fresh rows). Sent again after the
// load (same id, as a redirected worker resends it), it is applied once, on the copy.
TEST(RereplicationTest, ARestartedServerServesNothingBeforeItsCopyLoads) {
  const JobConfig config = TwoServers();
  uint64_t rid = 0;
  std::unique_ptr<ServerCore> original = ServerCore::Create(config, 0).value();
  ASSERT_NO_FATAL_FAILURE(Train(*original, config, &rid, 2));
  size_t bytes = 0;
  Result<Frames> seed = SeedMessage(*original, 50, &bytes);
  ASSERT_TRUE(seed.ok()) << seed.status().ToString();

  Transport transport;
  std::unique_ptr<ServerSocket> listen = transport.Listen("inproc://awaiting-seed").value();
  std::unique_ptr<ServerCore> restarted = ServerCore::Create(config, 0).value();
  BackupStore backups(config, 0);
  std::atomic<bool> stop{false};
  Status served;
  std::thread loop([&] {
    served = ServeUntilShutdown(*listen, *restarted, stop,
                                {.poll_interval = std::chrono::milliseconds(20),
                                 .report_interval = std::chrono::milliseconds(0),
                                 .backups = &backups,
                                 .awaiting_seed = true});
  });
  std::unique_ptr<ClientSocket> client = transport.Connect(listen->BoundEndpoint()).value();
  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  const std::vector<float> g(dense.size() * 3, 0.5f);
  // Pulled at the copy's version (two clocks of two workers' pushes: 4).
  Frames push = VersionedPush(++rid, 0, dense.front(), dense.back() + 1, g, 0, 2, 4);
  ASSERT_TRUE(client->Send(ShareFrames(push)).ok());
  EXPECT_FALSE(client->Recv(std::chrono::milliseconds(300)).ok()) << "answered before the copy";

  Result<CallReply> loaded = Call(*client, std::move(seed).value(), std::chrono::seconds(10));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->header.get().getBody().which(), wire::Header::Body::SEED_REPLY);
  Result<CallReply> applied = Call(*client, ShareFrames(push), std::chrono::seconds(10));
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  stop = true;
  loop.join();
  EXPECT_TRUE(served.ok() || served.code() == StatusCode::kAborted) << served.ToString();
  ASSERT_TRUE(ReplyStatus(original->HandleOne(push)).ok());
  EXPECT_EQ(Rows(*restarted, 0, dense), Rows(*original, 0, dense))
      << "the push applied once, after the copy";
}

// A primary asked to send its shards to a restarted backup (a relink) answers the
// coordinator only once that backup has acknowledged the copy: until then the copy may be
// in the primary's send queue only, and a primary that died then would leave its backup
// to be promoted with no copy at all. A backup that does not answer within the link's
// timeout gets no link and the coordinator an error; one that answers holds the copy.
TEST(RereplicationTest, ARelinkAnswersOnlyOnceTheNewBackupHoldsTheCopy) {
  const JobConfig config = TwoServers();
  uint64_t rid = 0;
  Transport transport;
  std::unique_ptr<ServerSocket> listen0 = transport.Listen("inproc://relink-0").value();
  std::unique_ptr<ServerSocket> listen1 = transport.Listen("inproc://relink-1").value();
  std::unique_ptr<ServerCore> core0 = ServerCore::Create(config, 0).value();
  ASSERT_NO_FATAL_FAILURE(Train(*core0, config, &rid, 2));
  std::unique_ptr<ServerCore> core1 = ServerCore::Create(config, 1).value();
  BackupStore backups0(config, 0), backups1(config, 1);
  std::unique_ptr<BackupLink> relink0;
  std::atomic<bool> stop0{false}, stop1{false};
  std::thread loop0([&] {
    (void)ServeUntilShutdown(*listen0, *core0, stop0,
                             {.poll_interval = std::chrono::milliseconds(20),
                              .report_interval = std::chrono::milliseconds(0),
                              .backups = &backups0,
                              .transport = &transport,
                              .relink = &relink0,
                              .seed_timeout = std::chrono::milliseconds(1000)});
  });
  std::unique_ptr<ClientSocket> coordinator = transport.Connect(listen0->BoundEndpoint()).value();
  auto relink = [&] {
    capnp::MallocMessageBuilder b;
    auto r = NewHeader(b, ++rid, -1).getBody().initRereplicate();
    r.setPrimary(0);
    r.setEndpoint(listen1->BoundEndpoint());
    r.setHandBack(false);
    Frames f;
    f.push_back(EncodeFrame(b));
    return Call(*coordinator, std::move(f), std::chrono::seconds(10));
  };
  // Server 1's loop is not running: nothing acknowledges the copy.
  const auto t0 = std::chrono::steady_clock::now();
  Result<CallReply> unanswered = relink();
  EXPECT_EQ(unanswered.status().code(), StatusCode::kUnavailable) << unanswered.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));

  std::thread loop1([&] {
    (void)ServeUntilShutdown(*listen1, *core1, stop1,
                             {.poll_interval = std::chrono::milliseconds(20),
                              .report_interval = std::chrono::milliseconds(0),
                              .backups = &backups1});
  });
  Result<CallReply> answered = relink();
  ASSERT_TRUE(answered.ok()) << answered.status().ToString();
  EXPECT_GT(answered->header.get().getBody().getRereplicateReply().getBytes(), 100u);
  stop1 = true;
  loop1.join();
  stop0 = true;
  loop0.join();
  ASSERT_NE(backups1.shadow(0), nullptr) << "acknowledged, so loaded";
  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  EXPECT_EQ(Rows(*backups1.shadow(0), 0, dense), Rows(*core0, 0, dense));
  ASSERT_NE(relink0, nullptr);
  EXPECT_FALSE(relink0->down());
}

}  // namespace
}  // namespace ps
