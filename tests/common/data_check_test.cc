#include "common/data_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A scratch directory, removed at the end; the test runs with it as the current directory
// (relative paths are looked up from there, as the coordinator looks them up from its own).
class DataCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ps_data_check_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    old_cwd_ = fs::current_path();
    fs::current_path(dir_);
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    fs::remove_all(dir_);
  }

  static void Touch(const fs::path& path) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "x";
  }
  static JobConfig SparseLr(const std::string& train, const std::string& test) {
    JobConfig c;
    c.model = "sparse_lr";
    c.train_data = train;
    c.test_data = test;
    return c;
  }
  static JobConfig Mlp(const std::string& data_dir) {
    JobConfig c;
    c.data_dir = data_dir;
    return c;
  }

  fs::path dir_;
  fs::path old_cwd_;
};

TEST_F(DataCheckTest, AMissingGeneratedSparseSetNamesThePathTheSettingAndTheCommand) {
  Status s = CheckJobData(SparseLr("data/sparse_lr/train.svm", "data/sparse_lr/test.svm"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("--train_data"));
  EXPECT_THAT(s.message(), HasSubstr("data/sparse_lr/train.svm does not exist"));
  EXPECT_THAT(s.message(), HasSubstr("relative to " + dir_.string()));
  EXPECT_THAT(s.message(), HasSubstr("scripts/make_sparse_data.sh (from the repository root)"));
}

TEST_F(DataCheckTest, TheSparseSetPassesOnceBothFilesExist) {
  Touch("data/sparse_lr/train.svm");
  Status s = CheckJobData(SparseLr("data/sparse_lr/train.svm", "data/sparse_lr/test.svm"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("--test_data"));
  EXPECT_THAT(s.message(), HasSubstr("data/sparse_lr/test.svm"));
  Touch("data/sparse_lr/test.svm");
  EXPECT_TRUE(CheckJobData(SparseLr("data/sparse_lr/train.svm", "data/sparse_lr/test.svm")).ok());
  // No test file is needed when none is named.
  EXPECT_TRUE(CheckJobData(SparseLr("data/sparse_lr/train.svm", "")).ok());
}

TEST_F(DataCheckTest, AGeneratedSetElsewhereGetsTheCommandWithItsDirectory) {
  const std::string train = (dir_ / "gen" / "train.svm").string();
  Status s = CheckJobData(SparseLr(train, ""));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(),
              HasSubstr("scripts/make_sparse_data.sh --out " + (dir_ / "gen").string()));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("relative to")));
}

// --model=wide_deep's CTR files: the command that makes them is the --ctr generator.
TEST_F(DataCheckTest, AMissingCtrSetNamesTheCtrCommand) {
  JobConfig c = SparseLr("data/ctr/train.tsv", "data/ctr/test.tsv");
  c.model = "wide_deep";
  Status s = CheckJobData(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("--train_data: CTR file data/ctr/train.tsv does not exist"));
  EXPECT_THAT(s.message(),
              HasSubstr("scripts/make_sparse_data.sh --ctr (from the repository root)"));
  c.train_data = (dir_ / "gen" / "train.tsv").string();
  s = CheckJobData(c);
  EXPECT_THAT(s.message(),
              HasSubstr("scripts/make_sparse_data.sh --ctr --out " + (dir_ / "gen").string()));
  Touch("data/ctr/train.tsv");
  Touch("data/ctr/test.tsv");
  c.train_data = "data/ctr/train.tsv";
  EXPECT_TRUE(CheckJobData(c).ok());
}

TEST_F(DataCheckTest, ADirectoryOrAnEmptyPathIsNoDataFile) {
  fs::create_directories("data/sparse_lr/train.svm");
  Status s = CheckJobData(SparseLr("data/sparse_lr/train.svm", ""));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is a directory"));
  s = CheckJobData(SparseLr("", ""));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--train_data is empty"));
}

TEST_F(DataCheckTest, AnMlpJobNeedsTheFourIdxFilesGzippedOrPlain) {
  Status s = CheckJobData(Mlp("fmnist"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("--data_dir: directory fmnist does not exist"));
  EXPECT_THAT(s.message(), HasSubstr("t10k-labels-idx1-ubyte"));  // the hint lists the files

  Touch("fmnist/train-images-idx3-ubyte.gz");
  Touch("fmnist/train-labels-idx1-ubyte");  // plain files are read too
  Touch("fmnist/t10k-images-idx3-ubyte.gz");
  s = CheckJobData(Mlp("fmnist"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("IDX file fmnist/t10k-labels-idx1-ubyte.gz does not exist"));

  Touch("fmnist/t10k-labels-idx1-ubyte.gz");
  EXPECT_TRUE(CheckJobData(Mlp("fmnist")).ok());
}

TEST_F(DataCheckTest, TheDefaultDataDirNamesThePackageThatInstallsIt) {
  if (fs::exists(JobConfig{}.data_dir)) {
    // Installed here: the default job's data passes.
    EXPECT_TRUE(CheckJobData(JobConfig{}).ok()) << CheckJobData(JobConfig{}).ToString();
    return;
  }
  Status s = CheckJobData(JobConfig{});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("scripts/install_deps.sh"));
}

TEST_F(DataCheckTest, AModelWithoutDataNeedsNone) {
  JobConfig c = SparseLr("nowhere.svm", "");
  c.model = "none";
  EXPECT_TRUE(CheckJobData(c).ok());
}

// --max_iter=0: a cosine that ends with the job, its length read from the labels file's
// header (a plain file here; gzip goes through the same gzread).
TEST_F(DataCheckTest, MaxIterZeroEndsTheScheduleWithTheJob) {
  fs::create_directories("idx");
  {
    std::ofstream f("idx/train-labels-idx1-ubyte", std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0x03, 0xE8};  // 1000 labels
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  JobConfig c = Mlp("idx");
  c.lr_policy = "cosine";
  c.max_iter = 0;
  c.epochs = 3;
  c.global_batch_size = 128;
  ASSERT_TRUE(ResolveWholeJobMaxIter(&c).ok());
  EXPECT_EQ(c.max_iter, 3 * 8) << "ceil(1000 / 128) global batches an epoch";

  c.max_iter = 0;
  c.global_batch_size = 0;
  c.batch_size = 100;
  ASSERT_TRUE(ResolveWholeJobMaxIter(&c).ok());
  EXPECT_EQ(c.max_iter, 3 * 10) << "minibatches of --batch_size without a global batch";

  c.max_iter = 77;
  ASSERT_TRUE(ResolveWholeJobMaxIter(&c).ok());
  EXPECT_EQ(c.max_iter, 77) << "a given end stays";

  c.max_iter = 0;
  c.lr_policy = "fixed";
  ASSERT_TRUE(ResolveWholeJobMaxIter(&c).ok());
  EXPECT_EQ(c.max_iter, 0) << "a schedule without an end needs none";
}

TEST_F(DataCheckTest, MaxIterZeroIsRefusedWhereTheExampleCountIsUnknownOrTheFileIsNotIdx) {
  JobConfig sparse = SparseLr("train.svm", "");
  sparse.lr_policy = "poly";
  sparse.max_iter = 0;
  Status s = ResolveWholeJobMaxIter(&sparse);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--model=sparse_lr needs --max_iter=N"));

  Touch("bad/train-labels-idx1-ubyte");  // "x": no header
  JobConfig mlp = Mlp("bad");
  mlp.lr_policy = "cosine";
  mlp.max_iter = 0;
  s = ResolveWholeJobMaxIter(&mlp);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not start with an IDX header"));
  EXPECT_EQ(mlp.max_iter, 0);
}

}  // namespace
}  // namespace ps
