// The coordinator's checkpoint record: a set is recorded only once every server committed
// one at its clock and every training worker's lease requests passed it; the epoch to
// resume at; naming clocks under --checkpoint_every=<N>s; stopping.
#include "server/coord_checkpoints.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "server/checkpoint.h"

namespace ps {
namespace {

using nlohmann::json;

class CoordCheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/coord_ckpt_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobConfig Config(const std::string& every = "100") {
    return JobConfig::FromFlagMap({{"model", "none"},
                                   {"tables", "d:10:3"},
                                   {"num_servers", "2"},
                                   {"num_workers", "2"},
                                   {"epochs", "3"},
                                   {"checkpoint_every", every},
                                   {"checkpoint_dir", dir_}})
        .value();
  }

  json Record(const CheckpointBook& book) {
    Result<json> r = book.ReadRecord();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : json();
  }

  std::string dir_;
};

TEST_F(CoordCheckpointsTest, RecordedOnlyWhenEveryServerAndEveryTrainingWorkerPassed) {
  CheckpointBook book(Config());
  const std::vector<bool> training = {true, true};
  book.OnLeaseRequest(0, 12);
  book.OnLeaseRequest(1, 8);
  book.OnServerCheckpoint(0, 2, 10, training);
  EXPECT_EQ(book.recorded_clock(), 0);  // server 1 has none at 10
  book.OnServerCheckpoint(1, 2, 10, training);
  EXPECT_EQ(book.recorded_clock(), 0);  // worker 1 asked for a lease at 8 only
  EXPECT_TRUE(Record(book)["sets"].empty());
  book.OnLeaseRequest(1, 10);
  book.RecordWholeSet(training);
  EXPECT_EQ(book.recorded_clock(), 10);
  EXPECT_EQ(book.checkpoints_recorded(), 1u);
  const json sets = Record(book)["sets"];
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0]["clock"], 10);
  EXPECT_EQ(sets[0]["set"], CheckpointSetDir(dir_, 10));
  EXPECT_EQ(sets[0]["epoch"], 1);          // no epoch wholly trained yet
  EXPECT_EQ(sets[0]["lr_iteration"], 20);  // clock x workers
  // Recorded once; an older set is not recorded after a newer one.
  book.RecordWholeSet(training);
  book.OnServerCheckpoint(0, 2, 9, training);
  book.OnServerCheckpoint(1, 2, 9, training);
  EXPECT_EQ(Record(book)["sets"].size(), 1u);
}

TEST_F(CoordCheckpointsTest, AWorkerThatIsDoneOrGoneDoesNotHoldASetBack) {
  CheckpointBook book(Config());
  book.OnLeaseRequest(0, 30);
  book.OnLeaseRequest(1, 5);
  book.OnServerCheckpoint(0, 2, 20, {true, true});
  book.OnServerCheckpoint(1, 2, 20, {true, true});
  EXPECT_EQ(book.recorded_clock(), 0);
  book.RecordWholeSet({true, false});  // worker 1 finished (or was declared dead)
  EXPECT_EQ(book.recorded_clock(), 20);
}

TEST_F(CoordCheckpointsTest, ResumesAtTheFirstEpochNotWhollyTrainedByTheClock) {
  CheckpointBook book(Config());
  const std::vector<bool> training = {true, true};
  book.OnChunkCompleted(1, 6);
  book.OnChunkCompleted(1, 7);
  book.OnEpochCompleted(1);      // epoch 1 done by clock 7
  book.OnChunkCompleted(2, 15);  // epoch 2's last chunk ended at 15
  book.OnEpochCompleted(2);
  book.OnLeaseRequest(0, 16);
  book.OnLeaseRequest(1, 16);
  book.OnServerCheckpoint(0, 2, 10, training);
  book.OnServerCheckpoint(1, 2, 10, training);
  book.OnServerCheckpoint(0, 2, 15, training);
  book.OnServerCheckpoint(1, 2, 15, training);
  const json sets = Record(book)["sets"];
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0]["epoch"], 2);  // at clock 10 epoch 2 was partly trained
  EXPECT_EQ(sets[0]["resume"], "at the start of epoch 2");
  EXPECT_EQ(sets[1]["epoch"], 3);  // at 15 epochs 1 and 2 were whole
  EXPECT_EQ(sets[1]["epochs_completed"], 2);
  // The sets' files were never written: no set of this job is whole.
  EXPECT_FALSE(book.LatestJobSet());
}

// --restore naming a set of another run's --checkpoint_dir (here: the job restarts with a
// new one): the record beside the set says where to resume, not epoch 1.
TEST_F(CoordCheckpointsTest, ASetOfAnotherDirectoryResumesWhereItsOwnRecordSays) {
  JobConfig first = Config();
  first.checkpoint_dir = dir_ + "/first";
  CheckpointBook book(first);
  const std::vector<bool> training = {true, true};
  book.OnChunkCompleted(1, 7);
  book.OnEpochCompleted(1);
  book.OnLeaseRequest(0, 12);
  book.OnLeaseRequest(1, 12);
  for (int s = 0; s < 2; ++s) {
    Result<CheckpointWriter> w = CheckpointWriter::Start(first.checkpoint_dir, 10, s);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(w->Commit().ok());
    book.OnServerCheckpoint(static_cast<size_t>(s), 2, 10, training);
  }
  ASSERT_EQ(Record(book)["sets"].size(), 1u);

  JobConfig again = Config();
  again.checkpoint_dir = dir_ + "/again";
  again.restore = CheckpointSetDir(first.checkpoint_dir, 10);
  CheckpointBook restored(again);
  ASSERT_TRUE(restored.ResolveRestore().ok());
  EXPECT_EQ(restored.start_clock(), 10);
  EXPECT_EQ(restored.start_epoch(), 2);
  ASSERT_TRUE(restored.restored().has_value());
  EXPECT_TRUE(restored.restored()->recorded);

  // Without the record beside it: the set's clock, epoch 1, unrecorded.
  std::filesystem::remove(CheckpointRecordFile(first.checkpoint_dir));
  CheckpointBook bare(again);
  ASSERT_TRUE(bare.ResolveRestore().ok());
  EXPECT_EQ(bare.start_clock(), 10);
  EXPECT_EQ(bare.start_epoch(), 1);
  EXPECT_FALSE(bare.restored()->recorded);
}

TEST_F(CoordCheckpointsTest, NamesAClockAheadOfTheFastestServerEveryPeriod) {
  CheckpointBook book(Config("2s"));
  std::vector<ServerLive> servers(2);
  servers[0].clock = 10;
  servers[0].clocks_per_sec = 4;
  servers[1].clock = 12;
  book.MaybeNameClock(0.5, servers);  // the first report starts the period
  EXPECT_EQ(book.checkpoint_at(), -1);
  book.MaybeNameClock(2.0, servers);
  EXPECT_EQ(book.checkpoint_at(), -1);
  book.MaybeNameClock(2.6, servers);
  // The fastest + 2 + 4 clocks/s x 2.5 s (two report intervals of 1 s, and 0.5 s).
  EXPECT_EQ(book.checkpoint_at(), 12 + 2 + 10);
  // One named clock at a time: not before every server passed it.
  servers[0].clock = 30;
  book.MaybeNameClock(10, servers);
  EXPECT_EQ(book.checkpoint_at(), 24);
}

// Servers that report often get a shorter lead (a lead of 3 s would outrun a short job);
// reports every 2 s or more: 3 s.
TEST_F(CoordCheckpointsTest, TheLeadFollowsTheReportInterval) {
  for (auto [report, expected] :
       {std::pair<const char*, int64_t>{"0.1", 12 + 2 + 2}, {"5", 12 + 2 + 12}}) {
    JobConfig config = Config("2s");
    config.report_every_seconds = std::stod(report);
    CheckpointBook book(config);
    std::vector<ServerLive> servers(1);
    servers[0].clock = 12;
    servers[0].clocks_per_sec = 4;
    book.MaybeNameClock(0.5, servers);
    book.MaybeNameClock(2.6, servers);
    EXPECT_EQ(book.checkpoint_at(), expected) << "--report_every_seconds=" << report;
  }
}

TEST_F(CoordCheckpointsTest, StopsAtOnceWithoutACheckpointDirectoryOrAnyoneTraining) {
  JobConfig config = Config();
  std::vector<ServerLive> servers(2);
  EXPECT_EQ(CheckpointBook(config)
                .OnStop(CoordClock::now(), 1, false, std::chrono::seconds(30), servers)
                .code(),
            StatusCode::kAborted);
  config.checkpoint_dir.clear();
  EXPECT_EQ(CheckpointBook(config)
                .OnStop(CoordClock::now(), 1, true, std::chrono::seconds(30), servers)
                .code(),
            StatusCode::kAborted);
  // With a directory and workers training: a stop set is named; training goes on until
  // it is recorded or the timeout passed.
  CheckpointBook book(Config());
  servers[0].clock = 5;
  servers[1].clock = 6;
  const auto t0 = CoordClock::now();
  EXPECT_TRUE(book.OnStop(t0, 1, true, std::chrono::seconds(30), servers).ok());
  EXPECT_EQ(book.checkpoint_at(), 8);
  EXPECT_TRUE(
      book.OnStop(t0 + std::chrono::seconds(29), 2, true, std::chrono::seconds(30), servers).ok());
  EXPECT_EQ(
      book.OnStop(t0 + std::chrono::seconds(31), 3, true, std::chrono::seconds(30), servers).code(),
      StatusCode::kAborted);
}

}  // namespace
}  // namespace ps
