// LIBSVM reading: small files written here, gzip and plain, every label spelling, comments,
// 64-bit ids, hashing, and every way a line can be malformed (with file:line in the error).
#include "worker/libsvm_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ps {
namespace {

namespace fs = std::filesystem;

class LibsvmReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("libsvm_reader_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out << text;
    EXPECT_TRUE(out.good()) << path;
    return path;
  }
  std::string WriteGz(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f == nullptr) return path;
    EXPECT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
              static_cast<int>(text.size()));
    EXPECT_EQ(gzclose(f), Z_OK);
    return path;
  }

  fs::path dir_;
};

TEST_F(LibsvmReaderTest, RoundTripsASmallFile) {
  const std::string path = Write("small.svm",
                                 "1 3:0.5 10:1\n"
                                 "0 1:2\n"
                                 "1\n"  // an example with no features
                                 "0 7:-1.25e-1 3:4\n");
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 4);
  EXPECT_EQ(ds->offsets, (std::vector<int64_t>{0, 2, 3, 3, 5}));
  EXPECT_EQ(ds->features, (std::vector<uint64_t>{3, 10, 1, 7, 3}));
  EXPECT_EQ(ds->values, (std::vector<float>{0.5f, 1.0f, 2.0f, -0.125f, 4.0f}));
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{1, 0, 1, 0}));
}

TEST_F(LibsvmReaderTest, ReadsGzipAndStopsAtMaxExamples) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += (i % 2 ? "+1 " : "-1 ") + std::to_string(i) + ":1\n";
  const std::string path = WriteGz("data.svm.gz", text);
  Result<SparseDataset> all = LoadLibsvm(path);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->count, 100);
  EXPECT_EQ(all->features[99], 99u);
  EXPECT_EQ(all->labels[99], 1);

  Result<SparseDataset> some = LoadLibsvm(path, {.max_examples = 7});
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(some->count, 7);
  EXPECT_EQ(some->offsets.size(), 8u);
  EXPECT_EQ(some->features.size(), 7u);

  Result<SparseDataset> bad = LoadLibsvm(path, {.max_examples = -1});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LibsvmReaderTest, MapsEveryLabelSpellingToZeroOrOne) {
  const std::string path = Write("labels.svm", "-1 1:1\n+1 1:1\n0 1:1\n1 1:1\n1.0 1:1\n-1.0 1:1\n");
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{0, 1, 0, 1, 1, 0}));
}

TEST_F(LibsvmReaderTest, SkipsCommentsBlankLinesAndCarriageReturns) {
  const std::string path = Write("comments.svm",
                                 "# a header comment\n"
                                 "\n"
                                 "   \t \n"
                                 "1 2:1 # a trailing comment 3:oops\n"
                                 "#0 5:1\n"
                                 "0\t4:2\t 6:3\r\n"
                                 "1 9:1");  // no final newline
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 3);
  EXPECT_EQ(ds->features, (std::vector<uint64_t>{2, 4, 6, 9}));
  EXPECT_EQ(ds->values, (std::vector<float>{1, 2, 3, 1}));
  EXPECT_EQ(ds->labels, (std::vector<int32_t>{1, 0, 1}));
}

TEST_F(LibsvmReaderTest, EmptyFileHasNoExamples) {
  Result<SparseDataset> ds = LoadLibsvm(Write("empty.svm", ""));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->count, 0);
  EXPECT_EQ(ds->offsets, (std::vector<int64_t>{0}));
}

TEST_F(LibsvmReaderTest, ReadsIdsUpTo2To64Minus1) {
  const std::string path = Write(
      "big.svm", "1 0:1 18446744073709551614:2 18446744073709551615:3 9223372036854775808:4\n");
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->features,
            (std::vector<uint64_t>{0, UINT64_MAX - 1, UINT64_MAX, uint64_t{1} << 63}));
}

TEST_F(LibsvmReaderTest, ReadsALineLongerThanTheReadBuffer) {
  // Over 1 MiB on one line: the buffer must grow rather than split the line.
  std::string line = "1";
  const int n = 150'000;
  for (int i = 1; i <= n; ++i) line += " " + std::to_string(i) + ":1";
  Result<SparseDataset> ds = LoadLibsvm(Write("long.svm", "0 5:1\n" + line + "\n0 6:1\n"));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->count, 3);
  EXPECT_EQ(ds->offsets[2] - ds->offsets[1], n);
  EXPECT_EQ(ds->features[ds->offsets[2] - 1], static_cast<uint64_t>(n));
  EXPECT_EQ(ds->features.back(), 6u);
}

TEST_F(LibsvmReaderTest, HashingIsDeterministicAndChangesIds) {
  EXPECT_EQ(HashFeature(12345), HashFeature(12345));
  EXPECT_NE(HashFeature(1), HashFeature(2));
  EXPECT_NE(HashFeature(7), 7u);
  // Pinned: a change here reshuffles every hashed table of every saved model. The first is
  // XXH3_64bits of 8 zero bytes, xxHash's published value.
  EXPECT_EQ(HashFeature(0), 0xc77b3abb6f87acd9ULL);
  EXPECT_EQ(HashFeature(1), 0x2fbc593564db792eULL);

  const std::string path = Write("hash.svm", "1 1:1 2:1 18446744073709551615:1\n0 2:1\n");
  Result<SparseDataset> plain = LoadLibsvm(path);
  Result<SparseDataset> hashed = LoadLibsvm(path, {.hash_features = true});
  ASSERT_TRUE(plain.ok() && hashed.ok());
  ASSERT_EQ(hashed->features.size(), plain->features.size());
  for (size_t i = 0; i < plain->features.size(); ++i) {
    EXPECT_EQ(hashed->features[i], HashFeature(plain->features[i]));
    EXPECT_NE(hashed->features[i], plain->features[i]);
  }
  EXPECT_EQ(hashed->features[1], hashed->features[3]);  // the same id, twice
  EXPECT_EQ(hashed->values, plain->values);
  EXPECT_EQ(hashed->labels, plain->labels);
}

TEST_F(LibsvmReaderTest, MalformedLinesNameFileLineAndExpectation) {
  struct Case {
    std::string line;
    std::string expected;  // part of the message
  };
  const std::vector<Case> cases = {
      {"2 1:1", "expected a label (+1, 1, -1 or 0), got '2'"},
      {"yes 1:1", "expected a label (+1, 1, -1 or 0), got 'yes'"},
      {"1:1 2:1", "expected a label (+1, 1, -1 or 0), got '1:1'"},
      {"1 5", "expected IDX:VALUE, got '5'"},
      {"1 abc", "expected IDX:VALUE, got 'abc'"},
      {"1 x:1", "expected IDX:VALUE with IDX an integer in [0, 2^64), got 'x:1'"},
      {"1 -3:1", "with IDX an integer"},
      {"1 :1", "with IDX an integer"},
      {"1 3.5:1", "with IDX an integer"},
      {"1 18446744073709551616:1", "with IDX an integer"},
      {"1 3:abc", "expected IDX:VALUE with VALUE a number, got '3:abc'"},
      {"1 3:", "with VALUE a number"},
      {"1 3:1:2", "with VALUE a number"},
      {"1 3:nan", "expected IDX:VALUE with VALUE a finite float, got '3:nan'"},
      {"1 3:-inf", "with VALUE a finite float"},
      {"1 3:1e39", "with VALUE a finite float"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    // Two good lines and a comment first: the bad one is line 4.
    const std::string path = Write("bad.svm", "1 1:1\n# comment\n0 2:1\n" + c.line + "\n1 3:1\n");
    Result<SparseDataset> ds = LoadLibsvm(path);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ds.status().message().find(path + ":4: "), std::string::npos)
        << ds.status().message();
    EXPECT_NE(ds.status().message().find(c.expected), std::string::npos) << ds.status().message();
  }
}

TEST_F(LibsvmReaderTest, LongBadTokensAreCutInTheMessage) {
  const std::string path = Write("long_bad.svm", "1 " + std::string(10'000, 'z') + "\n");
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_FALSE(ds.ok());
  EXPECT_LT(ds.status().message().size(), path.size() + 200);
}

TEST_F(LibsvmReaderTest, MissingFileIsNotFound) {
  const std::string path = (dir_ / "nope.svm").string();
  Result<SparseDataset> ds = LoadLibsvm(path);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find(path), std::string::npos) << ds.status().message();

  Result<SparseDataset> dir = LoadLibsvm(dir_.string());
  EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
