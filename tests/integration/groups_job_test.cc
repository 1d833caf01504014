// All-reduce groups in a whole job (scripts/launch_local.sh): 4 workers in groups of 2
// push about half the bytes of 4 ungrouped workers and reach the same accuracy.
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/integration/job_test_util.h"

namespace ps {
namespace {

using itest::json;

constexpr char kTrainImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
constexpr std::chrono::seconds kJobTimeout{240};

json RunJob(const itest::TempDir& dir, const std::string& name, std::vector<std::string> flags) {
  std::vector<std::string> args = {itest::SourceDir() + "/configs/fashion_mnist_mlp.flags",
                                   "--servers",
                                   "2",
                                   "--workers",
                                   "4",
                                   "--",
                                   "--epochs=1"};
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = itest::RunLaunchLocal(args, dir.Join(name), dir.Join(name + ".log"), kJobTimeout);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return json();
  EXPECT_EQ(r->exit_status, 0) << name << ": launch_local.sh failed\n" << r->logs;
  EXPECT_TRUE(r->leftovers.empty()) << itest::Describe(r->leftovers);
  return r->summary;
}

TEST(GroupsJobTest, GroupsOfTwoPushHalfTheBytesAtTheSameAccuracy) {
  if (access(kTrainImages, R_OK) != 0) GTEST_SKIP() << kTrainImages << " is not here";
  itest::TempDir dir("ps_groups_job_test_");
  const json alone = RunJob(dir, "alone", {});
  const json grouped = RunJob(dir, "grouped", {"--group_size=2"});
  ASSERT_TRUE(alone.is_object() && grouped.is_object());
  ASSERT_EQ(grouped.value("status", ""), "ok") << grouped.dump();
  const double bytes_alone = alone.value("bytes_pushed", 0.0);
  const double bytes_grouped = grouped.value("bytes_pushed", 0.0);
  ASSERT_GT(bytes_alone, 0);
  // The same examples; a group pushes one sum per 2 batches (chunk tails add a little).
  EXPECT_GT(bytes_grouped / bytes_alone, 0.40) << bytes_grouped << " vs " << bytes_alone;
  EXPECT_LT(bytes_grouped / bytes_alone, 0.60) << bytes_grouped << " vs " << bytes_alone;
  EXPECT_EQ(grouped["examples_per_epoch"], json::array({60000})) << grouped.dump();
  uint64_t examples = 0;
  for (const json& w : grouped["workers"]) examples += w.value("examples", uint64_t{0});
  EXPECT_EQ(examples, 60000u) << "every example once, whichever member trained it";
  const double acc_alone = alone.value("test_accuracy", 0.0);
  const double acc_grouped = grouped.value("test_accuracy", 0.0);
  EXPECT_GE(acc_grouped, 0.80) << grouped.dump();
  EXPECT_NEAR(acc_grouped, acc_alone, 0.03);
}

}  // namespace
}  // namespace ps
