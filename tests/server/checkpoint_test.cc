// Checkpoints: a server restored from one has the weights, optimizer state, versions and
// clocks it had at the checkpoint (spilled rows included); a set cut short or damaged is
// skipped for the previous complete one.
#include "server/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::ClockTick;
using testing::KeyPush;
using testing::RangePush;
using testing::ReplyStatus;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/ckpt_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    config_ = JobConfig::FromFlagMap({{"model", "none"},
                                      {"tables", "d:10:3:uniform:1,emb:sparse:4:normal:0.1"},
                                      {"num_servers", "1"},
                                      {"num_workers", "1"},
                                      {"staleness", "0"},
                                      {"optimizer", "adam"},
                                      {"base_lr", "0.01"},
                                      {"checkpoint_every", "2"},
                                      {"checkpoint_dir", dir_}})
                  .value();
    for (uint64_t k = 0; k < 6000; ++k) keys_.push_back(k * 7 + 3);
    store_.memory_budget = 512 << 10;  // ~2k of the 6000 sparse rows in memory
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // One worker step: push every row, then tick.
  void Step(ServerCore& core, int64_t clock, float scale) {
    std::vector<float> g(keys_.size() * 4), gd(10 * 3);
    for (size_t i = 0; i < g.size(); ++i) g[i] = scale * static_cast<float>(i % 11) - 0.4f;
    for (size_t i = 0; i < gd.size(); ++i) gd[i] = scale * static_cast<float>(i) - 1.0f;
    Frames p = KeyPush(rid_++, 1, keys_, g);
    ASSERT_TRUE(ReplyStatus(core.HandleOne(p)).ok());
    Frames d = RangePush(rid_++, 0, 0, 10, gd);
    ASSERT_TRUE(ReplyStatus(core.HandleOne(d)).ok());
    if (clock >= 0) {
      Frames t = ClockTick(rid_++, 0, clock);
      ASSERT_TRUE(ReplyStatus(core.HandleOne(t)).ok());
    }
  }
  std::vector<float> Rows(ServerCore& core) {
    std::vector<float> all;
    for (uint64_t r = 0; r < 10; ++r) {
      auto v = core.ReadRow(0, r).value();
      all.insert(all.end(), v.begin(), v.end());
    }
    for (uint64_t k : keys_) {
      auto v = core.ReadRow(1, k).value();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
  static bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  }

  std::string dir_;
  JobConfig config_;
  StoreOptions store_;
  std::vector<uint64_t> keys_;
  uint64_t rid_ = 1;
};

TEST_F(CheckpointTest, RestoredServerContinuesExactlyAsTheOriginal) {
  auto a = ServerCore::Create(config_, 0, store_).value();
  for (int64_t c = 1; c <= 4; ++c) Step(*a, c, 0.1f * static_cast<float>(c));
  ASSERT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 2, 0)));
  ASSERT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 4, 0)));
  ASSERT_GT(a->stats().rows_spilled, 0u);
  const std::vector<float> at_checkpoint = Rows(*a);
  // Past the checkpoint: one more step (not checkpointed: clock 5 < 4 + 2).
  Step(*a, 5, 0.7f);
  const std::vector<float> after = Rows(*a);
  ASSERT_FALSE(BitEqual(at_checkpoint, after));

  JobConfig restore = config_;
  restore.restore = "latest";
  auto b = ServerCore::Create(restore, 0, store_).value();
  EXPECT_EQ(b->worker_clock(0), 4);
  EXPECT_EQ(b->stats().restored_clock, 4);
  EXPECT_TRUE(BitEqual(Rows(*b), at_checkpoint));
  // The same step from the restored server gives the same weights: Adam's moments and
  // step counts came back too.
  Step(*b, 5, 0.7f);
  EXPECT_TRUE(BitEqual(Rows(*b), after));
  // Versions came back: both servers are at the same shard version.
  Frames pa = testing::KeyPull(rid_++, 1, {keys_[0]}), pb = testing::KeyPull(rid_++, 1, {keys_[0]});
  EXPECT_EQ(testing::ReplyHeader(a->HandleOne(pa)).get().getBody().getPullReply().getVersion(),
            testing::ReplyHeader(b->HandleOne(pb)).get().getBody().getPullReply().getVersion());
}

// Preemption, then a restart of the whole job: worker 1 left at clock 2 and a joiner
// (worker 2) took its place; worker 0 ran a clock ahead (SSP) of the checkpoint at clock 4.
// The restarted job (2 workers again) restores it: each of its workers resumes at clock 4,
// whichever rejoins first (worker 1's old clock 2 does not hold them back, worker 0's entry
// 5 does not let the slowest clock pass 4 before worker 0 is back, and the old job's joiner
// is not in the new job), and the schedule goes on from the batches the old job trained.
TEST_F(CheckpointTest, AJobWhoseWorkerWasReplacedByAJoinerRestoresAtTheCheckpointClock) {
  config_.num_workers = 2;
  auto a = ServerCore::Create(config_, 0, store_).value();
  auto tick = [&](ServerCore& core, int worker, int64_t clock, bool leave = false) {
    Frames t = ClockTick(rid_++, worker, clock, leave);
    Frames reply = core.HandleOne(t);
    EXPECT_TRUE(ReplyStatus(reply).ok()) << "worker " << worker << " clock " << clock;
    return testing::ReplyHeader(reply).get().getBody().getClockReply().getMinClock();
  };
  for (int64_t c = 1; c <= 2; ++c) {
    Step(*a, c, 0.1f);
    tick(*a, 1, c);
  }
  tick(*a, 1, 2, /*leave=*/true);
  EXPECT_EQ(tick(*a, 2, 0), 2) << "the joiner starts at the slowest live clock";
  for (int64_t c = 3; c <= 4; ++c) {
    Step(*a, c, 0.1f * static_cast<float>(c));
    if (c == 4) tick(*a, 0, 5);
    tick(*a, 2, c);
  }
  ASSERT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 4, 0)));
  ASSERT_EQ(a->worker_clock(0), 5);
  const std::vector<float> at_4 = Rows(*a);
  const int64_t trained = a->JobSteps();

  JobConfig restart = config_;
  restart.restore = CheckpointSetDir(dir_, 4);
  Result<std::unique_ptr<ServerCore>> b = ServerCore::Create(restart, 0, store_);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(BitEqual(Rows(**b), at_4));
  EXPECT_EQ((*b)->JobSteps(), trained);
  // A worker's first tick after a restore (KVClient::Rejoin) learns the clock it resumes
  // at. Worker 1 comes back first and runs 2 clocks ahead before worker 0 is back.
  EXPECT_EQ(tick(**b, 1, 0), 4);
  tick(**b, 1, 5);
  tick(**b, 1, 6);
  EXPECT_EQ(tick(**b, 0, 0), 4);
  tick(**b, 0, 5);
  EXPECT_EQ(tick(**b, 0, 6), 6) << "the old job's joiner holds the new job back";
}

TEST_F(CheckpointTest, ACheckpointCutShortOrDamagedIsSkipped) {
  auto a = ServerCore::Create(config_, 0, store_).value();
  for (int64_t c = 1; c <= 2; ++c) Step(*a, c, 0.2f);
  const std::vector<float> at_2 = Rows(*a);
  const std::string good = CheckpointFile(dir_, 2, 0);
  ASSERT_TRUE(std::filesystem::exists(good));
  const auto size = std::filesystem::file_size(good);

  // clock 4: cut short (a kill during the write, as if it had been renamed early);
  // clock 6: full length, one byte flipped; clock 8: only the temp file.
  std::filesystem::create_directories(
      std::filesystem::path(CheckpointFile(dir_, 4, 0)).parent_path());
  std::filesystem::copy_file(good, CheckpointFile(dir_, 4, 0));
  std::filesystem::resize_file(CheckpointFile(dir_, 4, 0), size / 2);
  std::filesystem::create_directories(
      std::filesystem::path(CheckpointFile(dir_, 6, 0)).parent_path());
  std::filesystem::copy_file(good, CheckpointFile(dir_, 6, 0));
  {
    std::fstream f(CheckpointFile(dir_, 6, 0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 3));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size / 3));
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  std::filesystem::create_directories(
      std::filesystem::path(CheckpointFile(dir_, 8, 0)).parent_path());
  std::filesystem::copy_file(good, CheckpointFile(dir_, 8, 0) + ".tmp");

  EXPECT_FALSE(CheckpointReader::Open(CheckpointFile(dir_, 4, 0)).ok());
  EXPECT_FALSE(CheckpointReader::Open(CheckpointFile(dir_, 6, 0)).ok());
  auto latest = LatestCompleteCheckpoint(dir_, 1);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(std::filesystem::path(*latest).filename(), "clock-000000000002");
  // A set needs every server's file: with two servers none is complete.
  EXPECT_FALSE(LatestCompleteCheckpoint(dir_, 2).ok());

  JobConfig restore = config_;
  restore.restore = "latest";
  auto b = ServerCore::Create(restore, 0, store_).value();
  EXPECT_EQ(b->worker_clock(0), 2);
  EXPECT_TRUE(BitEqual(Rows(*b), at_2));
}

TEST_F(CheckpointTest, ACheckpointOfAnotherJobIsRefused) {
  auto a = ServerCore::Create(config_, 0, store_).value();
  Step(*a, 2, 0.3f);
  JobConfig other = config_;
  other.restore = "latest";
  other.optimizer = "sgd";  // rows of another stride
  auto b = ServerCore::Create(other, 0, store_);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("optimizer"), std::string::npos) << b.status().ToString();
  JobConfig none = config_;
  none.restore = dir_ + "/clock-000000000099";
  EXPECT_FALSE(ServerCore::Create(none, 0, store_).ok());
}

}  // namespace
}  // namespace ps

namespace ps {
namespace {

// --checkpoint_every=<N>s: the coordinator names a clock; the server writes its file when the
// slowest clock reaches exactly that clock, and refuses one it has passed (its file would
// stand at another clock than the other servers').
TEST_F(CheckpointTest, ANamedClockIsWrittenExactlyThereAndAPassedOneRefused) {
  config_.checkpoint_every = 0;
  config_.checkpoint_every_seconds = 1;
  auto core = ServerCore::Create(config_, 0, store_).value();
  ASSERT_TRUE(core->RequestCheckpointAt(3));
  for (int64_t c = 1; c <= 5; ++c) Step(*core, c, 0.1f * static_cast<float>(c));
  EXPECT_EQ(core->last_checkpoint_clock(), 3);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/clock-000000000003/server-0.ckpt"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/clock-000000000004"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/clock-000000000005"));
  EXPECT_FALSE(core->RequestCheckpointAt(5));  // the slowest clock is 5 already
  EXPECT_FALSE(core->RequestCheckpointAt(4));
  ASSERT_TRUE(core->RequestCheckpointAt(7));
  for (int64_t c = 6; c <= 8; ++c) Step(*core, c, 0.1f);
  EXPECT_EQ(core->last_checkpoint_clock(), 7);
  EXPECT_EQ(core->stats().checkpoints_written, 2u);
}

// A server that replaces a dead one (--replicas=1) restores a set whose clocks are behind
// the workers': it holds a pull until the worker's tick says where it stands (the tick a
// redirected KVClient sends), refuses evicted workers, accepts gradients computed from the
// lost versions, and writes its next checkpoints at the clocks the other servers do.
TEST_F(CheckpointTest, AReplacementLearnsTheWorkersClocksAndKeepsTheCheckpointClocks) {
  config_.num_workers = 2;
  auto a = ServerCore::Create(config_, 0, store_).value();
  for (int64_t c = 1; c <= 5; ++c) {
    Step(*a, c, 0.1f);
    Frames t = ClockTick(rid_++, 1, c);
    ASSERT_TRUE(ReplyStatus(a->HandleOne(t)).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 4, 0)));

  JobConfig restore = config_;
  restore.restore = CheckpointSetDir(dir_, 4);
  auto b = ServerCore::Create(restore, 0, store_).value();
  b->BecomeReplacement(/*evicted=*/{1}, /*idle=*/{}, 0.25);
  EXPECT_TRUE(b->replacement());
  EXPECT_EQ(b->restore_seconds(), 0.25);
  EXPECT_EQ(b->worker_clock(0), 4);
  // Worker 0 is at clock 7 by now; its pull waits for its own tick (BSP), not served on the
  // checkpoint's clock table.
  std::vector<Outgoing> out;
  ServerCore::After after = ServerCore::After::kContinue;
  Frames pull = testing::RangePull(rid_++, 0, 0, 10, /*worker=*/0, /*clock=*/7);
  b->Handle("w0", pull, &out, &after);
  EXPECT_TRUE(out.empty()) << "a pull at clock 7 was served on the restored clock table";
  Frames tick = ClockTick(rid_++, 0, 7);
  b->Handle("w0", tick, &out, &after);
  ASSERT_EQ(out.size(), 2u) << "the tick's reply and the released pull";
  EXPECT_TRUE(ReplyStatus(out[1].frames).ok());
  EXPECT_EQ(b->worker_clock(0), 7);
  // Evicted: worker 1 died before the replacement came.
  Frames t1 = ClockTick(rid_++, 1, 7);
  EXPECT_EQ(ReplyStatus(b->HandleOne(t1)).code(), StatusCode::kFailedPrecondition);
  // A gradient computed from a version the dead server had reached (past the restored one).
  Frames p = testing::VersionedPush(rid_++, 0, 0, 10, std::vector<float>(30, 0.1f), 0, 7, 1000);
  EXPECT_TRUE(ReplyStatus(b->HandleOne(p)).ok());
  EXPECT_EQ(b->pushes_since_checkpoint(), 1u);
  // The next checkpoints: at 8 and 10 (4 + k * 2, where the other servers write), not at
  // 7 where the table jumped to.
  for (int64_t c = 8; c <= 10; ++c) {
    Frames t = ClockTick(rid_++, 0, c);
    ASSERT_TRUE(ReplyStatus(b->HandleOne(t)).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(CheckpointFile(dir_, 7, 0)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 8, 0)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFile(dir_, 10, 0)));
  EXPECT_EQ(b->pushes_since_checkpoint(), 0u);
}

}  // namespace
}  // namespace ps
