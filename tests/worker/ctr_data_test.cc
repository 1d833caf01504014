// --model=wide_deep's data: the Criteo-like generator (deterministic, field ranges, Zipf
// skew, a sane best AUC) and the CTR reader (round trip, errors naming file, line and column).

#include "worker/ctr_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "worker/auc.h"
#include "worker/sparse_data_gen.h"

namespace ps {
namespace {

CtrDataset Generate(const CtrDataGenOptions& o, int64_t n, std::vector<float>* probs = nullptr) {
  Result<CtrDataGenerator> gen = CtrDataGenerator::Create(o);
  EXPECT_TRUE(gen.ok()) << gen.status().ToString();
  CtrDataset d;
  gen->Generate(n, &d, probs);
  return d;
}

TEST(CtrDataGenTest, OneSeedGivesTheSameExamplesAndAnotherSeedOthers) {
  CtrDataGenOptions o;
  const CtrDataset a = Generate(o, 500);
  const CtrDataset b = Generate(o, 500);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.labels, b.labels);
  o.seed = 2;
  const CtrDataset c = Generate(o, 500);
  EXPECT_NE(a.ids, c.ids);
}

TEST(CtrDataGenTest, EachFieldDrawsFromItsOwnRangeWithZipfSkew) {
  CtrDataGenOptions o;
  Result<CtrDataGenerator> gen = CtrDataGenerator::Create(o);
  ASSERT_TRUE(gen.ok());
  CtrDataset d;
  gen->Generate(20000, &d, nullptr);
  ASSERT_EQ(d.dense, 13);
  ASSERT_EQ(d.fields, 26);
  ASSERT_EQ(d.count, 20000);
  ASSERT_EQ(d.ids.size(), 20000u * 26);
  ASSERT_EQ(d.values.size(), 20000u * 13);
  EXPECT_EQ(gen->vocab(0), 10);
  EXPECT_EQ(gen->vocab(25), 100000);
  EXPECT_GT(gen->total_ids(), 200000);
  EXPECT_LT(gen->total_ids(), 1000000);
  uint64_t first = 1;
  std::map<uint64_t, int> last_field;  // id -> count, for the largest field
  for (int f = 0; f < 26; ++f) {
    const uint64_t end = first + static_cast<uint64_t>(gen->vocab(f));
    for (int64_t e = 0; e < d.count; ++e) {
      const uint64_t id = d.ids[d.ids_begin(e) + f];
      ASSERT_GE(id, first) << "field " << f;
      ASSERT_LT(id, end) << "field " << f;
      if (f == 25) ++last_field[id];
    }
    first = end;
  }
  // Zipf(1.1) over 100k values: the most frequent value alone is ~10% of the draws, and the
  // 100 most frequent (0.1% of the values) over a third.
  std::vector<int> counts;
  for (const auto& [id, n] : last_field) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  EXPECT_GT(counts[0], 20000 / 20);
  int top = 0;
  for (size_t i = 0; i < 100 && i < counts.size(); ++i) top += counts[i];
  EXPECT_GT(top, 20000 / 3);
  EXPECT_GT(counts.size(), 2000u);  // and a long tail
}

TEST(CtrDataGenTest, TheBestAucIsThatOfTheTrueProbabilitiesAndInASaneRange) {
  std::vector<float> probs;
  const CtrDataset d = Generate(CtrDataGenOptions{}, 20000, &probs);
  const double best = CtrDataGenerator::BestAuc(probs, d.labels);
  EXPECT_GT(best, 0.75);
  EXPECT_LT(best, 0.95);
  const double positives = std::count(d.labels.begin(), d.labels.end(), 1) / 20000.0;
  EXPECT_GT(positives, 0.15);
  EXPECT_LT(positives, 0.5);
  // Scores that ignore the hidden model are at chance.
  std::vector<float> flat(probs.size(), 0.5f);
  EXPECT_NEAR(CtrDataGenerator::BestAuc(flat, d.labels), 0.5, 1e-9);
}

TEST(CtrDataGenTest, BadOptionsAreRefusedByName) {
  CtrDataGenOptions o;
  o.fields = 1;
  Result<CtrDataGenerator> gen = CtrDataGenerator::Create(o);
  ASSERT_FALSE(gen.ok());
  EXPECT_NE(gen.status().message().find("fields = 1"), std::string::npos) << gen.status().message();
}

class CtrFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ps_ctr_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "bad.tsv").string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(CtrFileTest, WhatTheGeneratorWritesLoadsBackAsGenerated) {
  CtrDataGenOptions o;
  o.seed = 5;
  const CtrDataset want = Generate(o, 300);
  Result<CtrDataGenerator> gen = CtrDataGenerator::Create(o);
  ASSERT_TRUE(gen.ok());
  const std::string path = (dir_ / "train.tsv").string();
  std::vector<int32_t> labels;
  ASSERT_TRUE(gen->WriteCtr(path, 300, &labels, nullptr).ok());
  Result<CtrDataset> got = LoadCtr(path, 13, 26);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->count, 300);
  EXPECT_EQ(got->ids, want.ids);
  EXPECT_EQ(got->labels, want.labels);
  EXPECT_EQ(got->labels, labels);
  ASSERT_EQ(got->values.size(), want.values.size());
  for (size_t i = 0; i < want.values.size(); ++i) {
    ASSERT_NEAR(got->values[i], want.values[i], 5e-5) << i;  // written with 4 decimals
  }
}

TEST_F(CtrFileTest, ABadLineIsRefusedNamingTheFileLineAndColumn) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"1\t0.5\t3\t4\n0\t0.1\t3\n", "bad.tsv:2: expected 4 tab-separated columns"},
      {"2\t0.5\t3\t4\n", "bad.tsv:1: column 1 '2': expected a label 0 or 1"},
      {"1\tx\t3\t4\n", "column 2 'x': expected a finite number"},
      {"1\t0.5\t-3\t4\n", "column 3 '-3': expected an unsigned integer id (field 1)"},
  };
  for (const Case& c : cases) {
    Result<CtrDataset> r = LoadCtr(Write(c.text), 1, 2);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(LoadCtr((dir_ / "missing.tsv").string(), 1, 2).ok());
}

}  // namespace
}  // namespace ps
