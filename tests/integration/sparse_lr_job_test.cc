// Sparse logistic regression end to end: ps_make_sparse_data writes a LIBSVM data set from
// a known ground truth (100k features), configs/sparse_lr.flags trains it through
// scripts/launch_local.sh, and the model must recover the truth well above chance; the same
// network written out (--model=wide_deep --network=input:sparse,wide,sigmoid_ce) trains alike.
#include <gtest/gtest.h>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

TEST(SparseLrJobTest, RecoversTheGroundTruthThroughTheParameterServer) {
  itest::TempDir dir("ps_sparse_lr_test_");
  const auto deadline = itest::DeadlineIn(std::chrono::seconds(120));
  auto gen = itest::ChildProcess::Spawn(
      {itest::BinaryPath("ps_make_sparse_data"), "--features=100000", "--examples=60000",
       "--nnz=15", "--seed=7", "--out=" + dir.Join("train.svm"),
       "--test_out=" + dir.Join("test.svm"), "--test_examples=10000"},
      dir.Join("gen.log"));
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  auto gen_rc = gen->WaitExit(deadline);
  ASSERT_TRUE(gen_rc.ok() && *gen_rc == 0) << itest::TailOfFile(dir.Join("gen.log"), 20);

  auto r = itest::RunLaunchLocal(
      {itest::SourceDir() + "/configs/sparse_lr.flags", "--servers", "2", "--workers", "2", "--",
       "--train_data=" + dir.Join("train.svm"), "--test_data=" + dir.Join("test.svm"), "--epochs=2",
       "--chunk_examples=4096"},
      dir.Join("run"), dir.Join("launch.log"), std::chrono::seconds(120));
  ASSERT_NO_FATAL_FAILURE(itest::ExpectFinishedOk(r));
  const json& s = r->summary;
  // Chance is 0.5; the generator's truth scores about 0.93 on such data.
  EXPECT_GE(s.value("test_auc", 0.0), 0.75) << s.dump();
  EXPECT_EQ(s["examples_per_epoch"], json::array({60000, 60000}));
  // Only touched features exist on the servers: far fewer rows than a dense table.
  uint64_t rows = 0;
  for (const json& server : s["servers"]) rows += server.value("rows_held", uint64_t{0});
  EXPECT_GT(rows, 1000u);
  EXPECT_LE(rows, 100001u);

  // --model=sparse_lr is shorthand for this network.
  auto same = itest::RunLaunchLocal(
      {itest::SourceDir() + "/configs/sparse_lr.flags", "--servers", "2", "--workers", "2", "--",
       "--model=wide_deep", "--network=input:sparse,wide,sigmoid_ce",
       "--train_data=" + dir.Join("train.svm"), "--test_data=" + dir.Join("test.svm"), "--epochs=2",
       "--chunk_examples=4096"},
      dir.Join("run_network"), dir.Join("launch_network.log"), std::chrono::seconds(120));
  ASSERT_NO_FATAL_FAILURE(itest::ExpectFinishedOk(same));
  // Two asynchronous workers: close, not bit for bit.
  EXPECT_NEAR(same->summary.value("test_auc", 0.0), s.value("test_auc", 0.0), 0.01)
      << same->summary.dump();
}

}  // namespace
}  // namespace ps
