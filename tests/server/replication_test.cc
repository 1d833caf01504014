// Chain replication (server/replication.h): a backup that applies what its primary forwards
// holds the same rows, clocks and recent-request table; and, over a real transport, a
// primary acknowledges a push only once its backup has it.
#include "server/replication.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

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

JobConfig TwoServers(double heartbeat_timeout = 4.0) {
  // Adam keeps per-row state, so a backup that missed a push or applied one twice would
  // drift from the primary even if it later saw the same gradients.
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:8:3:uniform:1,s:sparse:2:normal:0.5"},
                                 {"num_servers", "2"},
                                 {"num_workers", "1"},
                                 {"replicas", "2"},
                                 {"staleness", "0"},
                                 {"optimizer", "adam"},
                                 {"heartbeat_timeout", std::to_string(heartbeat_timeout)},
                                 {"base_lr", "0.1"}})
      .value();
}

// The primary applies `request`, then the backup applies what the primary forwards.
Frames ApplyBoth(ServerCore& primary, BackupStore& backup, Frames request, uint64_t* seq) {
  Frames forwarded = WrapForBackup(primary.server_id(), ++*seq, ShareFrames(request));
  Frames reply = primary.HandleOne(request);
  Frames ack = backup.Handle(forwarded);
  EXPECT_TRUE(ReplyStatus(ack).ok()) << ReplyStatus(ack).ToString();
  return reply;
}

TEST(ReplicationTest, BackupOfIsTheNextServerOnlyWithTwoReplicas) {
  JobConfig c = TwoServers();
  EXPECT_EQ(BackupOf(c, 0), 1);
  EXPECT_EQ(BackupOf(c, 1), 0);
  c.replicas = 1;
  EXPECT_EQ(BackupOf(c, 0), -1);
  EXPECT_FALSE(
      JobConfig::FromFlagMap(
          {{"model", "none"}, {"tables", "d:8:3"}, {"num_servers", "1"}, {"replicas", "2"}})
          .ok());
}

TEST(ReplicationTest, ForwardedPushesLeaveTheBackupEqualToThePrimary) {
  const JobConfig config = TwoServers();
  std::unique_ptr<ServerCore> primary = ServerCore::Create(config, 0).value();
  BackupStore backup(config, 1);
  const std::vector<uint64_t> dense = DenseKeys(config, 0);
  ASSERT_FALSE(dense.empty());
  const std::vector<uint64_t> sparse = {5, 1ull << 40};
  uint64_t seq = 0;
  uint64_t rid = 0;
  for (int64_t clock = 0; clock < 4; ++clock) {
    std::vector<float> g(dense.size() * 3);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i + 1) - clock * 0.02f;
    Frames r = ApplyBoth(*primary, backup,
                         VersionedPush(++rid, 0, dense.front(), dense.back() + 1, g, 0, clock,
                                       static_cast<uint64_t>(clock)),
                         &seq);
    ASSERT_TRUE(ReplyStatus(r).ok()) << ReplyStatus(r).ToString();
    r = ApplyBoth(*primary, backup, KeyPush(++rid, 1, sparse, {0.5f, -1, 2, 0.25f}), &seq);
    ASSERT_TRUE(ReplyStatus(r).ok()) << ReplyStatus(r).ToString();
    r = ApplyBoth(*primary, backup, ClockTick(++rid, 0, clock + 1), &seq);
    ASSERT_TRUE(ReplyStatus(r).ok()) << ReplyStatus(r).ToString();
  }
  ServerCore* shadow = backup.shadow(0);
  ASSERT_NE(shadow, nullptr);
  EXPECT_EQ(shadow->server_id(), 0);
  // Bit for bit: the same requests through the same code in the same order.
  EXPECT_EQ(Rows(*shadow, 0, dense), Rows(*primary, 0, dense));
  EXPECT_EQ(Rows(*shadow, 1, sparse), Rows(*primary, 1, sparse));
  EXPECT_NE(Rows(*shadow, 0, dense), Rows(*ServerCore::Create(config, 0).value(), 0, dense));
  EXPECT_EQ(shadow->worker_clock(0), 4);
  EXPECT_EQ(shadow->stats().pushes_applied, primary->stats().pushes_applied);

  // After a failover the worker resends its unacknowledged push to the promoted backup
  // with the same request id: answered, not applied again.
  const std::vector<float> before = Rows(*shadow, 1, sparse);
  Frames retry = KeyPush(rid - 1, 1, sparse, {0.5f, -1, 2, 0.25f});
  Frames again = shadow->HandleOne(retry);
  EXPECT_TRUE(ReplyStatus(again).ok());
  EXPECT_EQ(shadow->stats().pushes_duplicate, 1u);
  EXPECT_EQ(Rows(*shadow, 1, sparse), before);

  // Promotion hands the shadow over.
  std::unique_ptr<ServerCore> promoted = backup.Release(0);
  EXPECT_EQ(promoted.get(), shadow);
  EXPECT_EQ(backup.shadow(0), nullptr);
}

Frames PromoteMessage(uint64_t rid, int primary) {
  capnp::MallocMessageBuilder b;
  NewHeader(b, rid, -1).getBody().initPromote().setPrimary(primary);
  Frames f;
  f.push_back(EncodeFrame(b));
  return f;
}

TEST(ReplicationTest, APromotedShadowIsServedAndRefusesLaterForwards) {
  const JobConfig config = TwoServers();
  std::unique_ptr<ServerCore> primary = ServerCore::Create(config, 0).value();
  BackupStore backup(config, 1);
  uint64_t seq = 0;
  const std::vector<uint64_t> sparse = {7};
  ApplyBoth(*primary, backup, KeyPush(1, 1, sparse, {0.5f, -1}), &seq);
  EXPECT_FALSE(backup.any_promoted());
  EXPECT_EQ(backup.promoted(0), nullptr);

  // Only the backup of server 0 may be promoted for it.
  BackupStore other(config, 0);
  Frames wrong = PromoteMessage(2, 0);
  EXPECT_EQ(ReplyStatus(other.HandlePromote(wrong)).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(other.any_promoted());

  Frames promote = PromoteMessage(3, 0);
  Frames reply = backup.HandlePromote(promote);
  ASSERT_TRUE(ReplyStatus(reply).ok()) << ReplyStatus(reply).ToString();
  EXPECT_EQ(ReplyHeader(reply).get().getBody().which(), wire::Header::Body::PROMOTE_REPLY);
  ServerCore* served = backup.promoted(0);
  ASSERT_NE(served, nullptr);
  EXPECT_EQ(served, backup.shadow(0));
  EXPECT_EQ(backup.backup_of_self(), 0);
  EXPECT_EQ(Rows(*served, 1, sparse), Rows(*primary, 1, sparse));
  // Promoting again is a no-op; a forward from the dead primary is refused.
  Frames again = PromoteMessage(4, 0);
  EXPECT_TRUE(ReplyStatus(backup.HandlePromote(again)).ok());
  EXPECT_EQ(backup.promoted(0), served);
  Frames late = WrapForBackup(0, ++seq, KeyPush(5, 1, sparse, {1, 1}));
  EXPECT_EQ(ReplyStatus(backup.Handle(late)).code(), StatusCode::kAborted)
      << "Aborted fences the old primary";
  EXPECT_EQ(Rows(*served, 1, sparse), Rows(*primary, 1, sparse));

  // A primary that never forwarded anything: its shards are served as they started.
  BackupStore fresh(config, 1);
  Frames first = PromoteMessage(6, 0);
  ASSERT_TRUE(ReplyStatus(fresh.HandlePromote(first)).ok());
  ASSERT_NE(fresh.promoted(0), nullptr);
  EXPECT_EQ(fresh.promoted(0)->server_id(), 0);
}

TEST(ReplicationTest, ABackupRefusesWhatIsNotItsPrimarysAndBadMessages) {
  const JobConfig config = TwoServers();
  BackupStore backup(config, 0);  // backs up server 1 only
  Frames wrong = WrapForBackup(0, 1, ClockTick(1, 0, 1));
  EXPECT_EQ(ReplyStatus(backup.Handle(wrong)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(backup.shadow(0), nullptr);
  Frames junk;
  junk.push_back(CopyFrame("junk", 4));
  junk.push_back(CopyFrame("junk", 4));
  EXPECT_FALSE(ReplyStatus(backup.Handle(junk)).ok());
  Frames empty;
  EXPECT_FALSE(ReplyStatus(backup.Handle(empty)).ok());
  // A forwarded request the shadow refuses (a bad push) changes nothing there.
  Frames bad = WrapForBackup(1, 1, KeyPush(3, 7, {1}, {1, 2}));
  EXPECT_TRUE(ReplyStatus(backup.Handle(bad)).ok());
  ASSERT_NE(backup.shadow(1), nullptr);
  EXPECT_EQ(backup.shadow(1)->stats().pushes_applied, 0u);
  // Forwards are numbered 1, 2, ...: one missing (3 after 1) would leave the copy behind
  // while the next acknowledgement covered it, so it is refused, and so is a repeat.
  Frames skipped = WrapForBackup(1, 3, KeyPush(4, 1, {1}, {1, 2}));
  Status gap = ReplyStatus(backup.Handle(skipped));
  EXPECT_EQ(gap.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gap.message().find("got forward 3 from server 1, expected 2"), std::string::npos)
      << gap.ToString();
  Frames again = WrapForBackup(1, 1, KeyPush(5, 1, {1}, {1, 2}));
  EXPECT_EQ(ReplyStatus(backup.Handle(again)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(backup.shadow(1)->stats().pushes_applied, 0u);
}

// Two servers over a real transport, each the other's backup, each loop on its own thread.
class ReplicatedPairTest : public ::testing::Test {
 protected:
  void Start(double heartbeat_timeout) {
    config_ = TwoServers(heartbeat_timeout);
    for (int s = 0; s < 2; ++s) {
      listen_[s] = transport_.Listen("inproc://replication-test-" + std::to_string(s)).value();
      core_[s] = ServerCore::Create(config_, s).value();
      backups_[s] = std::make_unique<BackupStore>(config_, s);
    }
    for (int s = 0; s < 2; ++s) {
      link_[s] = std::make_unique<BackupLink>(
          transport_.Connect(listen_[1 - s]->BoundEndpoint()).value(), s,
          std::chrono::milliseconds(static_cast<int64_t>(heartbeat_timeout * 1000)));
    }
    for (int s = 0; s < 2; ++s) {
      threads_[s] = std::thread([this, s] {
        result_[s] = ServeUntilShutdown(*listen_[s], *core_[s], stop_[s],
                                        {.poll_interval = std::chrono::milliseconds(20),
                                         .report_interval = std::chrono::milliseconds(0),
                                         .backups = backups_[s].get(),
                                         .backup_link = link_[s].get()});
      });
    }
    client_ = transport_.Connect(listen_[0]->BoundEndpoint()).value();
  }
  void TearDown() override {
    for (int s = 0; s < 2; ++s) {
      stop_[s] = true;
      if (threads_[s].joinable()) threads_[s].join();
    }
  }
  void StopServer(int s) {
    stop_[s] = true;
    if (threads_[s].joinable()) threads_[s].join();
  }
  Frames Shutdown() {
    capnp::MallocMessageBuilder b;
    NewHeader(b, 999, -1).getBody().setShutdown();
    Frames f;
    f.push_back(EncodeFrame(b));
    return f;
  }

  Transport transport_;
  JobConfig config_;
  std::unique_ptr<ServerSocket> listen_[2];
  std::unique_ptr<ServerCore> core_[2];
  std::unique_ptr<BackupStore> backups_[2];
  std::unique_ptr<BackupLink> link_[2];
  std::atomic<bool> stop_[2] = {false, false};
  std::thread threads_[2];
  Status result_[2];
  std::unique_ptr<ClientSocket> client_;
};

TEST_F(ReplicatedPairTest, PushesReachTheBackupBeforeTheyAreAcknowledged) {
  Start(4.0);
  const std::vector<uint64_t> dense = DenseKeys(config_, 0);
  uint64_t rid = 0;
  for (int64_t clock = 0; clock < 3; ++clock) {
    std::vector<float> g(dense.size() * 3, 0.1f * static_cast<float>(clock + 1));
    Result<CallReply> r = Call(*client_,
                               VersionedPush(++rid, 0, dense.front(), dense.back() + 1, g, 0, clock,
                                             static_cast<uint64_t>(clock)),
                               std::chrono::seconds(10));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    r = Call(*client_, ClockTick(++rid, 0, clock + 1), std::chrono::seconds(10));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // Server 1 first, then server 0: a shutdown reply means the loop has ended.
  std::unique_ptr<ClientSocket> to1 = transport_.Connect(listen_[1]->BoundEndpoint()).value();
  ASSERT_TRUE(Call(*to1, Shutdown(), std::chrono::seconds(10)).ok());
  threads_[1].join();
  ASSERT_TRUE(Call(*client_, Shutdown(), std::chrono::seconds(10)).ok());
  threads_[0].join();
  EXPECT_TRUE(result_[0].ok()) << result_[0].ToString();
  ServerCore* shadow = backups_[1]->shadow(0);
  ASSERT_NE(shadow, nullptr);
  EXPECT_EQ(Rows(*shadow, 0, dense), Rows(*core_[0], 0, dense));
  EXPECT_EQ(shadow->worker_clock(0), 3);
  EXPECT_EQ(link_[0]->acked(), link_[0]->sent());
  EXPECT_FALSE(link_[0]->down());
}

TEST_F(ReplicatedPairTest, TwoServersThatBackUpEachOtherBothForward) {
  Start(30.0);  // a deadlock would show as a 30 s wait, far past the calls' bound
  std::unique_ptr<ClientSocket> to1 = transport_.Connect(listen_[1]->BoundEndpoint()).value();
  ClientSocket* to[2] = {client_.get(), to1.get()};
  uint64_t rid = 0;
  for (int64_t clock = 0; clock < 3; ++clock) {
    for (int s = 0; s < 2; ++s) {
      const std::vector<uint64_t> dense = DenseKeys(config_, s);
      std::vector<float> g(dense.size() * 3, 0.25f);
      // Both pushes in flight at once, so each server forwards while it backs up the other.
      ASSERT_TRUE(to[s]
                      ->Send(VersionedPush(++rid, 0, dense.front(), dense.back() + 1, g, 0, clock,
                                           static_cast<uint64_t>(clock)))
                      .ok());
    }
    for (int s = 0; s < 2; ++s) {
      Result<Frames> r = to[s]->Recv(std::chrono::seconds(5));
      ASSERT_TRUE(r.ok()) << "server " << s << ": " << r.status().ToString();
      EXPECT_TRUE(ReplyStatus(*r).ok());
    }
  }
  for (int s = 0; s < 2; ++s) StopServer(s);
  for (int s = 0; s < 2; ++s) {
    EXPECT_FALSE(link_[s]->down());
    ServerCore* shadow = backups_[1 - s]->shadow(s);
    ASSERT_NE(shadow, nullptr);
    const std::vector<uint64_t> dense = DenseKeys(config_, s);
    EXPECT_EQ(Rows(*shadow, 0, dense), Rows(*core_[s], 0, dense));
  }
}

TEST_F(ReplicatedPairTest, APrimaryWaitsForItsBackupThenGoesOnAlone) {
  const double timeout_s = 1.0;
  Start(timeout_s);
  StopServer(1);  // the backup stops answering
  const std::vector<uint64_t> dense = DenseKeys(config_, 0);
  std::vector<float> g(dense.size() * 3, 0.5f);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(client_->Send(VersionedPush(1, 0, dense.front(), dense.back() + 1, g, 0, 0, 0)).ok());
  // Not acknowledged while the backup may still have it to apply...
  Result<Frames> early = client_->Recv(std::chrono::milliseconds(300));
  EXPECT_FALSE(early.ok());
  // ...then, once the backup is declared lost (the timeout), acknowledged without it.
  Result<Frames> late = client_->Recv(std::chrono::seconds(10));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_TRUE(ReplyStatus(*late).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  StopServer(0);
  EXPECT_EQ(core_[0]->stats().pushes_applied, 1u);
  EXPECT_TRUE(link_[0]->down());
}

// Failover: once the coordinator promoted server 1 for server 0, a push that reaches the
// old primary (stopped, not dead, and back) is refused by the backup; the old primary is
// fenced: it never acknowledges that push and stops. The worker's resend to the promoted
// copy (same request id, target server 0) is applied there once.
// A request's header with targetServer set (as a KVClient sends it).
Frames ForServer(Frames request, int target) {
  Result<DecodedHeader> h = DecodedHeader::Decode(request[0]);
  EXPECT_TRUE(h.ok());
  capnp::MallocMessageBuilder b;
  b.setRoot(h->get());
  b.getRoot<wire::Header>().setTargetServer(target);
  request[0] = EncodeFrame(b);
  return request;
}

TEST_F(ReplicatedPairTest, APromotedBackupFencesTheOldPrimary) {
  Start(4.0);
  std::unique_ptr<ClientSocket> coordinator =
      transport_.Connect(listen_[1]->BoundEndpoint()).value();
  const std::vector<uint64_t> dense = DenseKeys(config_, 0);
  std::vector<float> g(dense.size() * 3, 0.5f);
  // Before a promotion, server 1 refuses requests for server 0's shards.
  Result<CallReply> early = Call(
      *coordinator, ForServer(VersionedPush(5, 0, dense.front(), dense.back() + 1, g, 0, 0, 0), 0),
      std::chrono::seconds(10));
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable) << early.status().ToString();
  Result<CallReply> promoted = Call(*coordinator, PromoteMessage(1, 0), std::chrono::seconds(10));
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  EXPECT_EQ(promoted->header.get().getBody().which(), wire::Header::Body::PROMOTE_REPLY);

  ASSERT_TRUE(client_->Send(VersionedPush(7, 0, dense.front(), dense.back() + 1, g, 0, 0, 0)).ok());
  Result<Frames> answered = client_->Recv(std::chrono::milliseconds(1500));
  EXPECT_FALSE(answered.ok()) << "a fenced primary acknowledges nothing";
  threads_[0].join();
  EXPECT_EQ(result_[0].code(), StatusCode::kFailedPrecondition) << result_[0].ToString();
  EXPECT_TRUE(link_[0]->fenced());

  // The worker's resend, redirected: the promoted copy applies it.
  Frames resend = ForServer(VersionedPush(7, 0, dense.front(), dense.back() + 1, g, 0, 0, 0), 0);
  std::unique_ptr<ClientSocket> worker = transport_.Connect(listen_[1]->BoundEndpoint()).value();
  Result<CallReply> applied = Call(*worker, std::move(resend), std::chrono::seconds(10));
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(applied->header.get().getBody().which(), wire::Header::Body::PUSH_REPLY);
  StopServer(1);
  ASSERT_NE(backups_[1]->promoted(0), nullptr);
  EXPECT_EQ(backups_[1]->promoted(0)->stats().pushes_applied, 1u);
  EXPECT_EQ(core_[1]->stats().pushes_applied, 0u) << "server 1's own shards are untouched";
}

}  // namespace
}  // namespace ps
