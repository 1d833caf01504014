// ps_export's library (server/model_export.h): a two-server model, trained a step, goes
// through a checkpoint set and through the per-server export files into one safetensors
// file; every value read back equals the servers' own.
#include "server/model_export.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/checkpoint.h"
#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::KeyPush;
using testing::RangePush;
using testing::ReplyStatus;

TEST(ModelExportTest, EveryValueOfEveryServerRoundTripsThroughOneFile) {
  const std::string dir = ::testing::TempDir() + "/model_export_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const JobConfig config =
      JobConfig::FromFlagMap({{"model", "none"},
                              {"tables", "d:10:3:uniform:1,emb:sparse:4:normal:0.1"},
                              {"num_servers", "2"},
                              {"num_workers", "1"},
                              {"optimizer", "adam"},
                              {"base_lr", "0.01"},
                              {"checkpoint_dir", dir + "/ckpt"}})
          .value();
  std::vector<std::unique_ptr<ServerCore>> cores;
  std::vector<uint64_t> all_keys;
  uint64_t rid = 1;
  for (int s = 0; s < 2; ++s) {
    cores.push_back(ServerCore::Create(config, s).value());
    ServerCore& core = *cores.back();
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 400; ++k) {
      if (core.shard_map().ServerOf(1, k * 31 + 5) == s) keys.push_back(k * 31 + 5);
    }
    ASSERT_FALSE(keys.empty());
    all_keys.insert(all_keys.end(), keys.begin(), keys.end());
    std::vector<float> g(keys.size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    Frames p = KeyPush(rid++, 1, keys, g);
    ASSERT_TRUE(ReplyStatus(core.HandleOne(p)).ok());
    const RowRange held = core.shard_map().DenseRangeOf(0, s);
    std::vector<float> gd(held.size() * 3, 0.5f);
    Frames d = RangePush(rid++, 0, held.begin, held.end, gd);
    ASSERT_TRUE(ReplyStatus(core.HandleOne(d)).ok());
    ASSERT_TRUE(core.WriteCheckpoint(7).ok());
    ASSERT_TRUE(core.ExportSafetensors(dir + "/server-" + std::to_string(s) + ".safetensors").ok());
  }
  std::sort(all_keys.begin(), all_keys.end());
  // The coordinator's record carries the job's settings.
  std::ofstream(CheckpointRecordFile(dir + "/ckpt"))
      << nlohmann::json({{"sets", nlohmann::json::array()}, {"config", config.ToFlagMap()}}).dump();

  auto check = [&](const std::string& path) {
    Result<SafetensorsFile> f = ReadSafetensors(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const SafeTensor* dense = f->Find("d");
    ASSERT_NE(dense, nullptr);
    ASSERT_EQ(dense->shape, (std::vector<uint64_t>{10, 3}));
    const auto* dv = reinterpret_cast<const float*>(dense->data.data());
    for (uint64_t r = 0; r < 10; ++r) {
      const int owner = cores[0]->shard_map().ServerOf(0, r);
      std::vector<float> want = cores[static_cast<size_t>(owner)]->ReadRow(0, r).value();
      for (size_t c = 0; c < 3; ++c) EXPECT_EQ(dv[r * 3 + c], want[c]) << "row " << r;
    }
    const SafeTensor* ids = f->Find("emb.ids");
    const SafeTensor* values = f->Find("emb.values");
    ASSERT_NE(ids, nullptr);
    ASSERT_NE(values, nullptr);
    ASSERT_EQ(ids->shape, (std::vector<uint64_t>{all_keys.size()}));
    ASSERT_EQ(values->shape, (std::vector<uint64_t>{all_keys.size(), 4}));
    const auto* iv = reinterpret_cast<const uint64_t*>(ids->data.data());
    const auto* vv = reinterpret_cast<const float*>(values->data.data());
    for (size_t i = 0; i < all_keys.size(); ++i) {
      ASSERT_EQ(iv[i], all_keys[i]);
      const int owner = cores[0]->shard_map().ServerOf(1, iv[i]);
      std::vector<float> want = cores[static_cast<size_t>(owner)]->ReadRow(1, iv[i]).value();
      for (size_t c = 0; c < 4; ++c) EXPECT_EQ(vv[i * 4 + c], want[c]) << "key " << iv[i];
    }
  };
  ASSERT_TRUE(ExportCheckpointSet(CheckpointSetDir(dir + "/ckpt", 7), dir + "/from_ckpt.st").ok());
  check(dir + "/from_ckpt.st");
  ASSERT_TRUE(MergeServerExports({dir + "/server-1.safetensors", dir + "/server-0.safetensors"},
                                 dir + "/from_exports.st")
                  .ok());
  check(dir + "/from_exports.st");
  // A server's file missing: the dense table has a hole, which is an error, not a file.
  EXPECT_FALSE(MergeServerExports({dir + "/server-1.safetensors"}, dir + "/partial.st").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ps
