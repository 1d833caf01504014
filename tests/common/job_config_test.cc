#include "common/job_config.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ps {
namespace {

TEST(JobConfigTest, DefaultsMakeTheMlpTables) {
  Result<JobConfig> c = JobConfig::FromFlagMap({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->table_specs.size(), 6u);
  EXPECT_EQ(c->table_specs[0].name, "fc0.weight");
  EXPECT_EQ(c->table_specs[0].rows, 784u);
  EXPECT_EQ(c->table_specs[0].width, 256u);
  EXPECT_EQ(c->table_specs[1].name, "fc0.bias");
  EXPECT_EQ(c->table_specs[1].rows, 1u);
  EXPECT_EQ(c->table_specs[5].width, 10u);
  // He-normal weights for the ReLU after them, zero biases (the servers initialize them so).
  EXPECT_EQ(c->table_specs[0].init, InitKind::kNormal);
  EXPECT_FLOAT_EQ(c->table_specs[0].init_scale, std::sqrt(2.0f / 784));
  EXPECT_EQ(c->table_specs[1].init, InitKind::kZeros);
  for (size_t i = 0; i < c->table_specs.size(); ++i) EXPECT_EQ(c->table_specs[i].id, i);
}

TEST(JobConfigTest, RoundTripsThroughTheFlagMap) {
  Result<JobConfig> a = JobConfig::FromFlagMap(
      {{"base_lr", "0.05"}, {"epochs", "3"}, {"tables", "emb:sparse:8:normal:0.01"}});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::map<std::string, std::string> m = a->ToFlagMap();
  EXPECT_EQ(m["base_lr"], "0.05");
  Result<JobConfig> b = JobConfig::FromFlagMap(m);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->base_lr, 0.05);
  EXPECT_EQ(b->epochs, 3);
  ASSERT_EQ(b->table_specs.size(), 7u);
  EXPECT_EQ(b->table_specs[6].name, "emb");
  EXPECT_FALSE(b->table_specs[6].dense());
  EXPECT_EQ(b->table_specs[6].init, InitKind::kNormal);
  EXPECT_FLOAT_EQ(b->table_specs[6].init_scale, 0.01f);
}

// --global_batch_size splits one batch across the workers, and the schedule then counts
// global batches; the split survives the flag map the coordinator ships to every process.
TEST(JobConfigTest, GlobalBatchIsSplitAcrossTheWorkers) {
  Result<JobConfig> c =
      JobConfig::FromFlagMap({{"global_batch_size", "512"}, {"num_workers", "32"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->batch_size, 16);
  EXPECT_EQ(c->ScheduleIteration(3200), 100);  // 32 workers' steps: one global batch
  Result<JobConfig> shipped = JobConfig::FromFlagMap(c->ToFlagMap());
  ASSERT_TRUE(shipped.ok()) << shipped.status().ToString();
  EXPECT_EQ(shipped->batch_size, 16);
  ASSERT_TRUE(shipped->SetNumWorkers(1).ok());  // ps_worker --standalone
  EXPECT_EQ(shipped->batch_size, 512);
  // Rounded down: 3 workers of 170 examples.
  Result<JobConfig> three =
      JobConfig::FromFlagMap({{"global_batch_size", "512"}, {"num_workers", "3"}});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->batch_size, 170);
  // Without it, --batch_size is per worker and the schedule counts worker minibatches.
  Result<JobConfig> per_worker = JobConfig::FromFlagMap({{"num_workers", "8"}});
  ASSERT_TRUE(per_worker.ok());
  EXPECT_EQ(per_worker->batch_size, 64);
  EXPECT_EQ(per_worker->ScheduleIteration(800), 800);
}

TEST(JobConfigTest, GlobalBatchRefusesAConflictingBatchAndTooFewExamples) {
  Result<JobConfig> both = JobConfig::FromFlagMap(
      {{"global_batch_size", "512"}, {"num_workers", "8"}, {"batch_size", "32"}});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--batch_size=32"), std::string::npos)
      << both.status().message();
  EXPECT_NE(both.status().message().find("64"), std::string::npos) << both.status().message();
  Result<JobConfig> agreeing = JobConfig::FromFlagMap(
      {{"global_batch_size", "512"}, {"num_workers", "8"}, {"batch_size", "64"}});
  EXPECT_TRUE(agreeing.ok()) << agreeing.status().ToString();
  Result<JobConfig> small =
      JobConfig::FromFlagMap({{"global_batch_size", "4"}, {"num_workers", "8"}});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("--global_batch_size=4"), std::string::npos)
      << small.status().message();
}

// --checkpoint_every counts clocks, or seconds with an "s"; either survives the flag map
// (the coordinator sends the job's settings to every process that way).
TEST(JobConfigTest, CheckpointEveryTakesClocksOrSeconds) {
  Result<JobConfig> clocks =
      JobConfig::FromFlagMap({{"checkpoint_every", "500"}, {"checkpoint_dir", "/tmp/c"}});
  ASSERT_TRUE(clocks.ok()) << clocks.status().ToString();
  EXPECT_EQ(clocks->checkpoint_every, 500);
  EXPECT_EQ(clocks->checkpoint_every_seconds, 0);
  Result<JobConfig> seconds =
      JobConfig::FromFlagMap({{"checkpoint_every", "2.5s"}, {"checkpoint_dir", "/tmp/c"}});
  ASSERT_TRUE(seconds.ok()) << seconds.status().ToString();
  EXPECT_EQ(seconds->checkpoint_every, 0);
  EXPECT_EQ(seconds->checkpoint_every_seconds, 2.5);
  Result<JobConfig> again = JobConfig::FromFlagMap(seconds->ToFlagMap());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->checkpoint_every_seconds, 2.5);
  EXPECT_EQ(again->checkpoint_every, 0);
  for (const char* bad : {"xs", "-3s", "s", "12m"}) {
    Result<JobConfig> r = JobConfig::FromFlagMap({{"checkpoint_every", bad}});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("--checkpoint_every=") + bad),
              std::string::npos)
        << r.status().message();
  }
}

// Asking for checkpoints without saying where is refused at start, naming both flags: the
// job would otherwise train on and write nothing.
TEST(JobConfigTest, CheckpointEveryWithoutADirectoryIsRefused) {
  for (const char* every : {"200", "30s"}) {
    Result<JobConfig> r = JobConfig::FromFlagMap({{"checkpoint_every", every}});
    ASSERT_FALSE(r.ok()) << every;
    EXPECT_NE(r.status().message().find(std::string("--checkpoint_every=") + every),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("--checkpoint_dir"), std::string::npos)
        << r.status().message();
  }
  EXPECT_TRUE(JobConfig::FromFlagMap({{"checkpoint_every", "0"}}).ok());
}

// Each bad value is rejected with a message naming the flag, the value and what is allowed.
TEST(JobConfigTest, BadValuesNameTheFlagTheValueAndTheRange) {
  struct Case {
    std::string flag, value, expect;
  };
  std::vector<Case> cases = {
      {"base_lr", "-0.1", "--base_lr=-0.1"},
      {"base_lr", "abc", "a number in"},
      {"epochs", "0", "[1, 100000]"},
      {"num_servers", "-2", "--num_servers=-2"},
      {"batch_size", "1.5", "an integer"},
      {"optimizer", "rmsprop", "one of sgd"},
      {"model", "resnet", "one of mlp|sparse_lr|none"},
      {"mlp_layers", "784,x,10", "positive integers"},
      {"mlp_layers", "784", "at least two"},
      {"tables", "a:b", "NAME:ROWS:WIDTH"},
      {"tables", "a:10:0", "bad width"},
      {"tables", "a:10:4:gauss", "zeros|uniform|normal"},
      {"tables", "t:2:2,t:3:3", "declared twice"},
  };
  for (const Case& c : cases) {
    Result<JobConfig> r = JobConfig::FromFlagMap({{c.flag, c.value}});
    ASSERT_FALSE(r.ok()) << c.flag << "=" << c.value;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.flag << "=" << c.value << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(c.flag), std::string::npos) << r.status().message();
  }
}

TEST(JobConfigTest, UnknownSettingIsRejected) {
  Result<JobConfig> r = JobConfig::FromFlagMap({{"learning_rate", "0.1"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--learning_rate"), std::string::npos);
}

TEST(JobConfigTest, GroupsAreForDenseModelsAndNeedAPositiveTimeout) {
  EXPECT_TRUE(JobConfig::FromFlagMap({{"group_size", "2"}}).ok());
  Result<JobConfig> r =
      JobConfig::FromFlagMap({{"group_size", "2"}, {"model", "none"}, {"tables", "d:4:2"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--group_size=2"), std::string::npos);
  EXPECT_NE(r.status().message().find("--model=none"), std::string::npos);
  EXPECT_FALSE(JobConfig::FromFlagMap({{"group_size", "0"}}).ok());
  EXPECT_FALSE(JobConfig::FromFlagMap({{"group_timeout_seconds", "0"}}).ok());
}

// --local_steps: dense models without groups; a clock is then a round of local_steps
// batches, which the schedule counts; the setting reaches every process.
TEST(JobConfigTest, LocalStepsAreForDenseModelsAloneAndCountInTheSchedule) {
  Result<JobConfig> c = JobConfig::FromFlagMap(
      {{"local_steps", "4"}, {"global_batch_size", "512"}, {"num_workers", "4"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ScheduleIteration(100), 100);  // 4 workers' 25 rounds: 100 global batches
  EXPECT_EQ(JobConfig::FromFlagMap(c->ToFlagMap())->local_steps, 4);
  Result<JobConfig> sparse = JobConfig::FromFlagMap(
      {{"local_steps", "4"}, {"model", "sparse_lr"}, {"train_data", "x"}, {"test_data", "y"}});
  ASSERT_FALSE(sparse.ok());
  EXPECT_NE(sparse.status().message().find("--local_steps=4"), std::string::npos)
      << sparse.status().message();
  EXPECT_NE(sparse.status().message().find("--model=sparse_lr"), std::string::npos);
  Result<JobConfig> grouped = JobConfig::FromFlagMap({{"local_steps", "2"}, {"group_size", "2"}});
  ASSERT_FALSE(grouped.ok());
  EXPECT_NE(grouped.status().message().find("--group_size=2"), std::string::npos)
      << grouped.status().message();
  EXPECT_FALSE(JobConfig::FromFlagMap({{"local_steps", "0"}}).ok());
}

TEST(JobConfigTest, ModelNoneNeedsTables) {
  EXPECT_FALSE(JobConfig::FromFlagMap({{"model", "none"}}).ok());
  Result<JobConfig> r = JobConfig::FromFlagMap({{"model", "none"}, {"tables", "d:4:2"}});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->table_specs.size(), 1u);
  EXPECT_EQ(r->table_specs[0].id, 0u);
}

}  // namespace
}  // namespace ps
