// --model=wide_deep end to end: ps_make_sparse_data --ctr writes a small Criteo-like set
// with its best reachable AUC, configs/ctr_wide_deep.flags trains it through
// scripts/launch_local.sh with two servers and two workers, and the test AUC must come
// within 0.02 of that best; a config with a bad layer is refused before anything starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

std::string Config() { return itest::SourceDir() + "/configs/ctr_wide_deep.flags"; }

// The best AUC, from the truth file's first line "best_auc X".
double BestAuc(const std::string& truth) {
  std::ifstream in(truth);
  std::string key;
  double best = 0;
  in >> key >> best;
  EXPECT_EQ(key, "best_auc") << truth;
  return best;
}

TEST(WideDeepJobTest, ReachesTheGeneratorsBestAucWithinTwoHundredths) {
  itest::TempDir dir("ps_wide_deep_test_");
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(30));
  // Smaller vocabularies than the default set (5k ids in the largest field, not 100k) and
  // 300k examples, one epoch: ~4 s of training that ends ~0.009 under the best.
  auto gen = itest::ChildProcess::Spawn(
      {itest::BinaryPath("ps_make_sparse_data"), "--ctr", "--examples=300000", "--max_vocab=5000",
       "--seed=3", "--out=" + dir.Join("train.tsv"), "--test_out=" + dir.Join("test.tsv"),
       "--test_examples=10000", "--truth=" + dir.Join("truth.txt")},
      dir.Join("gen.log"));
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  auto gen_rc = gen->WaitExit(deadline);
  ASSERT_TRUE(gen_rc.ok() && *gen_rc == 0) << itest::TailOfFile(dir.Join("gen.log"), 20);
  const double best = BestAuc(dir.Join("truth.txt"));

  auto r = itest::RunLaunchLocal(
      {Config(), "--servers", "2", "--workers", "2", "--", "--train_data=" + dir.Join("train.tsv"),
       "--test_data=" + dir.Join("test.tsv"), "--chunk_examples=4096"},
      dir.Join("run"), dir.Join("launch.log"), std::chrono::seconds(120));
  ASSERT_NO_FATAL_FAILURE(itest::ExpectFinishedOk(r));
  const json& s = r->summary;
  EXPECT_GE(s.value("test_auc", 0.0), best - 0.02) << "best " << best << "\n" << s.dump();
  std::cout << "test_auc " << s.value("test_auc", 0.0) << " (best " << best << "), "
            << s.value("examples_per_sec", 0.0) << " examples/s\n";
  EXPECT_EQ(s["examples_per_epoch"], json::array({300000}));
  EXPECT_EQ(s.value("pushes_rejected", uint64_t{1}), 0u) << s.dump();
}

// Each bad layer is refused by ps_coordinator with a message naming it: the launch fails, no
// server or worker is started, and nothing trains.
TEST(WideDeepJobTest, ABadLayerIsRefusedAtStartAndNothingTrains) {
  struct Case {
    const char* network;
    const char* message;
  };
  const Case cases[] = {
      {"input:13:fields=26,embed:8,concat,dense:1,sigmoid_ce",
       "layer 1 (embed 'embed:8'): unknown layer kind 'embed'"},
      {"input:13:fields=26,embedding:8,concat,dense:4,wide,sigmoid_ce",
       "layer 4 (wide 'wide'): the input 4 is not one logit"},
      {"input:13:fields=26,embedding,concat,dense:1,sigmoid_ce",
       "layer 1 (embedding 'embedding'): missing field DIM"},
  };
  for (const Case& c : cases) {
    itest::TempDir dir("ps_wide_deep_test_");
    const std::string run_dir = dir.Join("run");
    auto r = itest::RunLaunchLocal({Config(), "--", std::string("--network=") + c.network}, run_dir,
                                   dir.Join("launch.log"), std::chrono::seconds(60));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    itest::ExpectRefusedBeforeAnythingStarted(*r, run_dir, c.network, c.message);
  }
}

}  // namespace
}  // namespace ps
