// SpillFile: every row written reads back bit for bit, across overflowing buckets and the
// table doubling (which moves every record and changes generation()).
#include "server/spill_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

namespace ps {
namespace {

class SpillFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spill-file-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

std::vector<char> RowOf(uint64_t key, int round, size_t bytes) {
  std::vector<char> row(bytes);
  std::mt19937_64 rng(key * 31 + static_cast<uint64_t>(round));
  for (char& c : row) c = static_cast<char>(rng());
  return row;
}

TEST_F(SpillFileTest, RowsReadBackExactlyAcrossOverflowAndDoubling) {
  // 2 KB rows: 4 records a bucket, so buckets overflow; sized for 100 rows, so the 3000 rows
  // double the table five times.
  const size_t bytes = 2048;
  auto file = SpillFile::Create(dir_ + "/rows", bytes, 100).value();
  std::vector<uint64_t> keys(3000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i < 10 ? i : i * 0x9E3779B97F4A7C15ull;
  // Round 0 inserts (half as known-absent, half looked up first); round 1 overwrites, by
  // place where the place is still valid.
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> place;  // key -> (place, generation)
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<char> row = RowOf(keys[i], 0, bytes);
    ASSERT_TRUE(
        file->Write(keys[i], row.data(), i % 2 ? SpillFile::kAbsent : SpillFile::kNowhere).ok());
  }
  EXPECT_EQ(file->rows(), keys.size());
  EXPECT_GE(file->generation(), 5u);
  std::vector<char> got(bytes);
  for (uint64_t k : keys) {
    bool found = false;
    uint64_t p = SpillFile::kNowhere;
    ASSERT_TRUE(file->Read(k, got.data(), &found, &p).ok());
    ASSERT_TRUE(found) << k;
    ASSERT_EQ(got, RowOf(k, 0, bytes)) << k;
    place[k] = {p, file->generation()};
  }
  for (uint64_t k : keys) {
    std::vector<char> row = RowOf(k, 1, bytes);
    ASSERT_EQ(place[k].second, file->generation());  // no insert since: places hold
    ASSERT_TRUE(file->Write(k, row.data(), place[k].first).ok());
  }
  // Absent keys are not found; writes did not add records.
  bool found = true;
  uint64_t p;
  ASSERT_TRUE(file->Read(12345, got.data(), &found, &p).ok());
  EXPECT_FALSE(found);
  EXPECT_EQ(file->rows(), keys.size());
  size_t seen = 0;
  ASSERT_TRUE(file->ForEach([&](uint64_t key, const char* row) {
                    ++seen;
                    ASSERT_EQ(std::memcmp(row, RowOf(key, 1, bytes).data(), bytes), 0) << key;
                  })
                  .ok());
  EXPECT_EQ(seen, keys.size());
}

TEST_F(SpillFileTest, OneRowAtATimeOfSmallRows) {
  // 128-byte rows (32 a bucket), written without places: each write looks the key up.
  auto file = SpillFile::Create(dir_ + "/rows", 128, 1).value();
  for (int round = 0; round < 3; ++round) {
    for (uint64_t k = 0; k < 500; ++k) {
      std::vector<char> row = RowOf(k, round, 128);
      ASSERT_TRUE(file->Write(k, row.data(), SpillFile::kNowhere).ok());
    }
  }
  EXPECT_EQ(file->rows(), 500u);
  std::vector<char> got(128);
  for (uint64_t k = 0; k < 500; ++k) {
    bool found = false;
    uint64_t p;
    ASSERT_TRUE(file->Read(k, got.data(), &found, &p).ok());
    ASSERT_TRUE(found);
    ASSERT_EQ(got, RowOf(k, 2, 128));
  }
}

TEST_F(SpillFileTest, AnUncreatableFileIsAnErrorAndTheFileGoesAway) {
  auto bad = SpillFile::Create(dir_ + "/missing/rows", 128, 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing/rows"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(SpillFile::Create(dir_ + "/rows", 6, 10).ok());  // not whole floats
  {
    auto file = SpillFile::Create(dir_ + "/rows", 128, 10).value();
    std::vector<char> row(128, 1);
    ASSERT_TRUE(file->Write(1, row.data(), SpillFile::kAbsent).ok());
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/rows"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/rows"));
}

}  // namespace
}  // namespace ps
