// The coordinator's journal (server/coord_journal.h) and the state it keeps
// (server/coord_resume.h): written, reopened and read back; a missing or damaged journal
// is a clear error.
#include "server/coord_journal.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "server/coord_resume.h"

namespace ps {
namespace {

using nlohmann::json;

class CoordJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/coord_journal_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path() const { return dir_ + "/coordinator.db"; }

  std::string dir_;
};

TEST_F(CoordJournalTest, WrittenPartsReadBackAfterReopening) {
  {
    Result<std::unique_ptr<CoordJournal>> j = CoordJournal::Create(Path(), {.sync = false});
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    ASSERT_TRUE((*j)->Write({{"meta", {{"format", 1}}}, {"leases", {{"done", 3}}}}).ok());
    // A later write replaces only the parts it names.
    ASSERT_TRUE((*j)->Write({{"leases", {{"done", 4}}}}).ok());
  }
  Result<std::unique_ptr<CoordJournal>> j = CoordJournal::Open(Path());
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  Result<CoordJournal::Parts> parts = (*j)->ReadAll();
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ(parts->at("meta"), json({{"format", 1}}));
  EXPECT_EQ(parts->at("leases"), json({{"done", 4}}));
}

TEST_F(CoordJournalTest, CreateReplacesAnEarlierJournal) {
  {
    auto j = CoordJournal::Create(Path(), {.sync = false});
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->Write({{"old", 1}}).ok());
  }
  auto j = CoordJournal::Create(Path(), {.sync = false});
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  Result<CoordJournal::Parts> parts = (*j)->ReadAll();
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->empty());
}

TEST_F(CoordJournalTest, AMissingJournalIsNotFound) {
  Result<std::unique_ptr<CoordJournal>> j = CoordJournal::Open(Path());
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kNotFound);
  EXPECT_NE(j.status().message().find("nothing to resume"), std::string::npos)
      << j.status().message();
}

TEST_F(CoordJournalTest, ADamagedJournalIsAClearError) {
  {
    auto j = CoordJournal::Create(Path(), {.sync = false});
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->Write({{"meta", {{"format", 1}}}}).ok());
  }
  // Every file of the database overwritten with garbage.
  for (const auto& e : std::filesystem::directory_iterator(Path())) {
    std::ofstream(e.path(), std::ios::trunc) << "not a database";
  }
  Result<std::unique_ptr<CoordJournal>> j = CoordJournal::Open(Path());
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInternal);
  EXPECT_NE(j.status().message().find(Path()), std::string::npos) << j.status().message();
  EXPECT_NE(j.status().message().find("cannot resume"), std::string::npos) << j.status().message();
}

TEST(CoordResumeTest, AMemberRoundTripsWithoutItsPeer) {
  Member m;
  m.peer = "routing-id";
  m.endpoint = "tcp://127.0.0.1:5000";
  m.host = "h";
  m.pid = 42;
  m.dead = true;
  m.result.done = true;
  m.result.totals = {{"examples", 7}};
  Member back = MemberFromJson(json::parse(MemberToJson(m).dump()));
  EXPECT_TRUE(back.peer.empty());
  EXPECT_EQ(back.endpoint, m.endpoint);
  EXPECT_EQ(back.host, "h");
  EXPECT_EQ(back.pid, 42u);
  EXPECT_TRUE(back.dead);
  EXPECT_TRUE(back.result.done);
  EXPECT_EQ(back.result.totals, m.result.totals);
}

// A table with a chunk outstanding and some done, journaled and restored, goes on as the
// original: the outstanding chunk stays with its worker, and the queue is the same.
TEST(CoordResumeTest, ALeaseTableRoundTripsAndGoesOnTheSame) {
  LeaseTable a(2, 10);
  ASSERT_TRUE(a.SetDatasetSize(35).ok());
  std::optional<LeaseTable::Lease> first = a.Acquire(0);
  std::optional<LeaseTable::Lease> second = a.Acquire(1);
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(a.Complete(0, first->epoch, first->chunk).ok());
  Result<LeaseTable::State> state =
      LeaseStateFromJson(json::parse(LeaseStateToJson(a.Snapshot()).dump()));
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  LeaseTable b(2, 10);
  ASSERT_TRUE(b.Restore(*state).ok());
  EXPECT_EQ(b.outstanding(), 1u);
  EXPECT_TRUE(b.Complete(1, second->epoch, second->chunk).ok());  // still worker 1's
  ASSERT_TRUE(a.Complete(1, second->epoch, second->chunk).ok());
  EXPECT_FALSE(b.Complete(0, first->epoch, first->chunk).ok());  // done before
  std::optional<LeaseTable::Lease> next_a = a.Acquire(0), next_b = b.Acquire(0);
  ASSERT_TRUE(next_a && next_b);
  EXPECT_EQ(next_a->chunk, next_b->chunk);
  EXPECT_EQ(b.examples_per_epoch(), a.examples_per_epoch());
  // A state of another job's epochs does not fit.
  LeaseTable c(3, 10);
  EXPECT_FALSE(c.Restore(*state).ok());
  EXPECT_FALSE(LeaseStateFromJson(json::object()).ok());
}

TEST(CoordResumeTest, ALeaseAnswerRoundTrips) {
  LeaseAnswer a;
  a.worker = 2;
  a.request_id = 99;
  a.batch_size = 32;
  a.evaluate_epoch = 1;
  a.chunk = LeaseTable::Lease{2, 5, 50, 60};
  LeaseAnswer b = LeaseAnswerFromJson(json::parse(LeaseAnswerToJson(a).dump()));
  EXPECT_EQ(b.worker, 2);
  EXPECT_EQ(b.request_id, 99u);
  EXPECT_EQ(b.batch_size, 32u);
  EXPECT_EQ(b.evaluate_epoch, 1);
  ASSERT_TRUE(b.chunk.has_value());
  EXPECT_EQ(b.chunk->chunk, 5u);
  EXPECT_EQ(b.chunk->end, 60u);
  EXPECT_FALSE(b.finished);
}

}  // namespace
}  // namespace ps
