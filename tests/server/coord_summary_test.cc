// summary.json as a function of the job's state (BuildSummary), and the typed records of
// common/run_summary.h: their JSON keys (which tests and scripts read) and round trips.
#include "server/coord_summary.h"

#include <gtest/gtest.h>

#include <set>

namespace ps {
namespace {

using nlohmann::json;

std::set<std::string> Keys(const json& j) {
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  return keys;
}

Member Worker(const std::string& device, const json& totals) {
  Member m;
  m.device = device;
  m.host = "h1";
  m.result.done = true;
  m.result.totals = totals;
  return m;
}

ServerSummary Server(uint64_t id, uint64_t applied, std::vector<uint64_t> histogram) {
  ServerSummary s;
  s.id = id;
  s.endpoint = "tcp://127.0.0.1:" + std::to_string(9000 + id);
  ServerCounters c;
  c.pushes_applied = applied;
  c.staleness_sum = applied * 2;
  c.staleness_max = 5 + id;
  c.max_clock_lag = 3;
  c.cache_hits = 30;
  c.cache_misses = 10;
  c.peak_rss_bytes = 1000 * (id + 1);
  c.pushes_duplicate = 1;
  c.staleness_histogram = std::move(histogram);
  s.counters = c;
  return s;
}

class CoordSummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = JobConfig::FromFlagMap({{"model", "none"},
                                      {"tables", "d:10:3"},
                                      {"num_servers", "3"},
                                      {"num_workers", "2"},
                                      {"epochs", "2"},
                                      {"batch_size", "auto"},
                                      {"checkpoint_dir", "/tmp/unused"}})
                  .value();
    in_.outcome = Status::Ok();
    in_.config = &config_;
    in_.wall_seconds = 12;
    in_.train_seconds = 10;
    in_.messages_during_training = 50;
    EvalLine eval;
    eval.final = true;
    eval.test_accuracy = 0.875;
    eval.test_loss = 0.25;
    in_.eval = eval;
    in_.workers.push_back(Worker("cpu", {{"examples", 600},
                                         {"steps", 10},
                                         {"seconds", 6.0},
                                         {"wait_seconds", 1.5},
                                         {"pushes_lost", 2},
                                         {"prefetch", true},
                                         {"step_seconds", {{"compute", 1.0}, {"bad", "x"}}}}));
    in_.workers.push_back(Worker("cpu", {{"examples", 400}, {"seconds", 4.0}}));
    in_.workers[1].dead = true;
    in_.workers[1].result.failed = true;
    in_.servers.push_back(Server(0, 100, {90, 9, 1}));
    in_.servers.push_back(Server(1, 300, {300}));
    ServerSummary lost;
    lost.id = 2;
    lost.state = "lost";
    lost.served_by = -1;
    lost.before_loss = json{{"seconds", 3.5}, {"pushes", 40}};
    in_.servers.push_back(lost);
    in_.examples_per_epoch = {500, 500};
    in_.failures = json::array({{{"kind", "worker_lost"}}});
    in_.pushes_rolled_back = 7;
    in_.rollback_estimated = true;
    in_.checkpoints_recorded = 2;
    in_.recorded_clock = 40;
  }

  JobConfig config_;
  SummaryInputs in_;
};

TEST_F(CoordSummaryTest, TotalsOfTheGivenState) {
  const RunSummary s = BuildSummary(in_);
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.examples, 1000u);
  EXPECT_DOUBLE_EQ(s.examples_per_sec, 100.0);
  EXPECT_DOUBLE_EQ(s.wait_seconds, 1.5);
  EXPECT_EQ(s.pushes_applied, 400u);
  EXPECT_DOUBLE_EQ(s.mean_staleness, 2.0);
  EXPECT_EQ(s.max_staleness_seen, 6u);
  EXPECT_EQ(s.max_clock_lag_seen, 3);
  EXPECT_EQ(s.p99_staleness, 1u);  // 390 of 400 at staleness 0, 399 by 1
  EXPECT_TRUE(s.batch_size_auto);
  ASSERT_TRUE(s.job);
  EXPECT_DOUBLE_EQ(s.job->cache_hit_rate, 0.75);
  EXPECT_EQ(s.job->max_server_peak_rss_bytes, 2000u);
  EXPECT_EQ(s.job->pushes_lost_by_workers, 2u);
  EXPECT_EQ(s.job->pushes_lost, 9u);
  EXPECT_TRUE(s.job->pushes_lost_estimated);
  EXPECT_EQ(s.job->pushes_duplicate, 2u);
  EXPECT_DOUBLE_EQ(s.job->coordinator_messages_per_sec, 5.0);
  EXPECT_EQ(s.job->checkpoints_recorded.value_or(0), 2u);
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_EQ(s.workers[0].state, "finished");
  EXPECT_EQ(s.workers[1].state, "lost");
  EXPECT_TRUE(s.workers[1].failed);
  EXPECT_DOUBLE_EQ(s.workers[0].examples_per_sec, 100.0);
  EXPECT_EQ(s.workers[0].step_seconds->size(), 1u);  // the string is left out
  EXPECT_FALSE(s.workers[1].step_seconds);
  EXPECT_EQ(s.workers[0].prefetch, true);
}

TEST_F(CoordSummaryTest, P99OfTheMergedHistogram) {
  EXPECT_EQ(P99Index({}), 0u);
  EXPECT_EQ(P99Index({98, 1, 1}), 1u);
  EXPECT_EQ(P99Index({50, 0, 50}), 2u);
}

TEST_F(CoordSummaryTest, FailedJobSaysWhy) {
  in_.outcome = Internal("worker 1 failed: boom");
  in_.eval.reset();
  const json j = BuildSummary(in_).ToJson();
  EXPECT_EQ(j["status"], "failed");
  EXPECT_NE(j["error"].get<std::string>().find("boom"), std::string::npos);
  EXPECT_EQ(j["test_accuracy"], 0.0);
}

// The keys integration tests, scripts/ and ps_status users read: a job's summary.json.
TEST_F(CoordSummaryTest, JobSummaryKeys) {
  const json j = BuildSummary(in_).ToJson();
  const std::set<std::string> expected = {"status",
                                          "test_accuracy",
                                          "test_loss",
                                          "epochs",
                                          "checkpoints_recorded",
                                          "last_recorded_checkpoint_clock",
                                          "wall_seconds",
                                          "train_seconds",
                                          "train_start_time",
                                          "coordinator_cpu_seconds",
                                          "coordinator_messages_per_sec",
                                          "examples",
                                          "examples_per_epoch",
                                          "batch_size",
                                          "examples_per_sec",
                                          "pushes_applied",
                                          "pushes_rejected",
                                          "pushes_dropped",
                                          "pulls_held",
                                          "staleness",
                                          "max_clock_lag_seen",
                                          "max_staleness_seen",
                                          "mean_staleness",
                                          "p99_staleness",
                                          "wait_seconds",
                                          "bytes_pushed",
                                          "bytes_pulled",
                                          "rows_in_memory",
                                          "rows_spilled",
                                          "cache_hit_rate",
                                          "spill_bytes_read",
                                          "spill_bytes_written",
                                          "max_server_peak_rss_bytes",
                                          "workers",
                                          "failures",
                                          "joins",
                                          "heartbeat_timeout",
                                          "pushes_lost_by_workers",
                                          "pushes_rolled_back",
                                          "pushes_lost_estimated",
                                          "pushes_lost",
                                          "pushes_duplicate",
                                          "servers",
                                          "config"};
  EXPECT_EQ(Keys(j), expected);
  EXPECT_EQ(j["batch_size"], "auto");
  EXPECT_EQ(
      Keys(j["workers"][0]),
      (std::set<std::string>{"id", "device", "host", "examples", "steps", "seconds", "wait_seconds",
                             "compute_seconds", "batch_size", "examples_per_sec", "failed", "group",
                             "state", "joined", "pushes_lost", "step_seconds", "prefetch"}));
  EXPECT_EQ(j["servers"][2], json::parse(R"({"id":2,"endpoint":"","state":"lost",
      "served_by":-1,"before_loss":{"seconds":3.5,"pushes":40}})"));
  EXPECT_EQ(j["servers"][0]["staleness_histogram"], json::parse("[90,9,1]"));
  EXPECT_EQ(j["servers"][0].size(), 23u);  // id, endpoint and 21 counters
}

TEST_F(CoordSummaryTest, RoundTripsThroughJson) {
  in_.restored = RestoredFrom{"/c/clock-20", 20, 2, true};
  const RunSummary s = BuildSummary(in_);
  const json j = s.ToJson();
  EXPECT_EQ(j["restored"]["set"], "/c/clock-20");
  EXPECT_EQ(RunSummary::FromJson(j).ToJson(), j);
}

// What a standalone run writes (worker/standalone.cc): no servers, no failure log.
TEST(RunSummary, StandaloneHasNoJobFields) {
  RunSummary s;
  s.mode = "standalone";
  s.ok = true;
  s.epochs = 1;
  s.batch_size = 64;
  s.examples_per_epoch = {100};
  WorkerSummary w;
  w.device = "cpu";
  w.host = "localhost";
  w.step_seconds = std::map<std::string, double>{{"compute", 1.0}, {"pull", 0.5}};
  s.workers.push_back(w);
  const json j = s.ToJson();
  EXPECT_EQ(j["mode"], "standalone");
  EXPECT_EQ(j["batch_size"], 64);
  EXPECT_FALSE(j.contains("failures"));
  EXPECT_FALSE(j.contains("pushes_lost"));
  EXPECT_FALSE(j["workers"][0].contains("state"));
  EXPECT_EQ(j["servers"], json::array());
  const RunSummary back = RunSummary::FromJson(j);
  EXPECT_FALSE(back.job);
  EXPECT_EQ(back.ToJson(), j);
}

TEST(RunSummary, MetricsLines) {
  TrainLine t;
  t.epoch = 2;
  t.step = 7;
  t.clock = 7;
  t.examples = 640;
  t.loss = 0.5;
  t.staleness_max_total = 3;
  json j = t.ToJson();
  EXPECT_EQ(KindOf(j), MetricsLineKind::kTrain);
  EXPECT_FALSE(j.contains("worker"));
  EXPECT_EQ(j["staleness_max_total"], 3);
  EXPECT_EQ(TrainLine::FromJson(j).ToJson(), j);
  j["worker"] = 4;
  EXPECT_EQ(TrainLine::FromJson(j).worker, 4);

  EvalLine e;
  e.epoch = 1;
  e.final = true;
  e.test_auc = 0.9;
  const json ej = e.ToJson();
  EXPECT_EQ(KindOf(ej), MetricsLineKind::kEval);
  EXPECT_EQ(ej["test_auc"], 0.9);
  EXPECT_EQ(EvalLine::FromJson(ej).ToJson(), ej);
  EXPECT_EQ(KindOf(json{{"kind", 7}}), MetricsLineKind::kOther);
  EXPECT_EQ(KindOf(json::array()), MetricsLineKind::kOther);
  // A mistyped field keeps its default rather than throwing.
  EXPECT_EQ(TrainLine::FromJson(json{{"examples", "many"}}).examples, 0);
}

}  // namespace
}  // namespace ps
