// JobConfig::FromFlagfile: a job's settings read as gflags reads a flagfile (what
// ps_worker --standalone does with --job_flagfile and --job_flags), including the repo's
// own configs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/job_config.h"

namespace ps {
namespace {

class JobFlagfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ps_job_flagfile_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  std::string dir_;
};

TEST_F(JobFlagfileTest, ReadsLinesCommentsBooleansAndNestedFiles) {
  const std::string inner = Write("inner.flags", "--epochs=7\n--optimizer=adam\n");
  const std::string outer = Write("outer.flags",
                                  "# a comment\n"
                                  "  --base_lr=0.05  \r\n"
                                  "\n"
                                  "--epochs=2\n"
                                  "--flagfile=" +
                                      inner +
                                      "\n"
                                      "--hash_features\n"
                                      "--optimizer=momentum\n");
  Result<JobConfig> c = JobConfig::FromFlagfile(outer, "");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->base_lr, 0.05);
  EXPECT_EQ(c->epochs, 7) << "the nested file's line comes after --epochs=2";
  EXPECT_EQ(c->optimizer, "momentum") << "a later line overrides the nested file";
  EXPECT_TRUE(c->hash_features);

  Result<JobConfig> off = JobConfig::FromFlagfile(outer, "--nohash_features");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->hash_features);
}

TEST_F(JobFlagfileTest, OverridesComeLast) {
  const std::string f = Write("job.flags", "--epochs=5\n--batch_size=32\n");
  const std::string more = Write("more.flags", "--batch_size=16\n--seed=9\n");
  Result<JobConfig> c =
      JobConfig::FromFlagfile(f, "  --epochs=1   --flagfile=" + more + " --seed=3 ");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->epochs, 1);
  EXPECT_EQ(c->batch_size, 16);
  EXPECT_EQ(c->seed, 3u);
}

TEST_F(JobFlagfileTest, ErrorsNameTheFileAndLine) {
  Result<JobConfig> missing = JobConfig::FromFlagfile(dir_ + "/none.flags", "");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  const std::string bad = Write("bad.flags", "--epochs=1\nepochs=2\n");
  Result<JobConfig> c = JobConfig::FromFlagfile(bad, "");
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(bad + ":2"), std::string::npos) << c.status().message();

  const std::string ok = Write("ok.flags", "--epochs=1\n");
  EXPECT_EQ(JobConfig::FromFlagfile(ok, "--epochs=1 x").status().code(),
            StatusCode::kInvalidArgument);
  Result<JobConfig> unknown = JobConfig::FromFlagfile(ok, "--no_such_setting=1");
  EXPECT_NE(unknown.status().message().find("no_such_setting"), std::string::npos)
      << unknown.status().message();

  const std::string loop = Write("loop.flags", "--flagfile=" + dir_ + "/loop.flags\n");
  EXPECT_EQ(JobConfig::FromFlagfile(loop, "").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(JobFlagfileTest, ReadsTheShippedConfigs) {
  const char* source = std::getenv("PS_SOURCE_DIR");
  if (source == nullptr) GTEST_SKIP() << "PS_SOURCE_DIR is not set (ctest sets it)";
  // Nested flagfiles are named relative to the repository root, where jobs are run.
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(source);
  for (const auto& entry : std::filesystem::directory_iterator(std::string(source) + "/configs")) {
    if (entry.path().extension() != ".flags") continue;
    Result<JobConfig> c = JobConfig::FromFlagfile(entry.path().string(), "");
    // A config naming data elsewhere still parses: FromFlagfile does not read the data.
    EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.status().ToString();
  }
  std::filesystem::current_path(cwd);
}

}  // namespace
}  // namespace ps
