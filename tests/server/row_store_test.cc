// The spill tier: rows past the memory budget go to disk (a spill file or RocksDB) and come back
// unchanged; where a row lives never changes a result; concurrent clients lose no update under
// eviction; the process's memory stays within the budget plus a stated overhead.
#include "server/row_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "server/server_core.h"
#include "tests/server/test_messages.h"
#include "tests/worker/in_process_cluster.h"
#include "worker/kv_client.h"

namespace ps {
namespace {

using testing::KeyPull;
using testing::KeyPush;
using testing::ReplyFloats;
using testing::ReplyStatus;

TableSpec SparseSpec(uint32_t width) {
  TableSpec t;
  t.name = "emb";
  t.width = width;
  t.init = InitKind::kNormal;
  t.init_scale = 0.1f;
  return t;
}

// A budget that holds `rows` rows of `stride` floats in memory.
uint64_t BudgetForRows(uint64_t rows, size_t stride,
                       SpillEngine engine = RowStoreOptions().engine) {
  return RowStore::BudgetForRows(rows, stride, engine);
}

// The tests that read rows back run against both spill engines.
class RowStoreEngineTest : public ::testing::TestWithParam<SpillEngine> {};
std::string EngineName(const ::testing::TestParamInfo<SpillEngine>& info) {
  return SpillEngineName(info.param);
}

float Value(uint64_t key, size_t j, int round) {
  return static_cast<float>(key % 1000003) * 0.001f + static_cast<float>(j) +
         0.5f * static_cast<float>(round);
}

TEST_P(RowStoreEngineTest, MoreRowsThanTheBudgetReadBackExactly) {
  const size_t stride = 12;
  RowStoreOptions o;
  o.engine = GetParam();
  o.memory_budget = BudgetForRows(2000, stride, GetParam());
  auto store = RowStore::Open(SparseSpec(8), 7, stride, o).value();
  ASSERT_TRUE(store->spills());
  ASSERT_GE(store->capacity(), 2000u);
  ASSERT_LT(store->capacity(), 2100u);

  // 20000 rows with scattered ids, written twice (the second round over rows that were
  // evicted dirty and read back), in batches of 500.
  std::vector<uint64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = (i * 0x9E3779B97F4A7C15ull) ^ (i << 7);
  std::vector<float*> rows;
  for (int round = 0; round < 2; ++round) {
    for (size_t first = 0; first < keys.size(); first += 500) {
      std::span<const uint64_t> batch(keys.data() + first, 500);
      ASSERT_TRUE(store->Fetch(batch, /*for_write=*/true, &rows).ok());
      for (size_t i = 0; i < batch.size(); ++i) {
        for (size_t j = 0; j < stride; ++j) rows[i][j] = Value(batch[i], j, round);
      }
    }
  }
  RowStoreStats s = store->stats();
  EXPECT_EQ(s.rows, keys.size());
  EXPECT_LE(s.rows_in_memory, store->capacity());
  EXPECT_EQ(s.rows_spilled, keys.size() - s.rows_in_memory);
  EXPECT_GT(s.bytes_written, 0u);
  EXPECT_GT(s.misses, 0u);

  // Read back in a shuffled order, with repeated keys inside a batch.
  std::vector<uint64_t> order = keys;
  std::mt19937_64 rng(3);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t first = 0; first < order.size(); first += 400) {
    std::vector<uint64_t> batch(order.begin() + first, order.begin() + first + 400);
    batch.push_back(batch.front());
    ASSERT_TRUE(store->Fetch(batch, /*for_write=*/false, &rows).ok());
    for (size_t i = 0; i < batch.size(); ++i) {
      for (size_t j = 0; j < stride; ++j) {
        ASSERT_EQ(rows[i][j], Value(batch[i], j, 1)) << "key " << batch[i] << " float " << j;
      }
    }
  }
  // ForEach sees every row once, resident or spilled, with its current value.
  size_t seen = 0;
  ASSERT_TRUE(store
                  ->ForEach([&](uint64_t key, const float* row) {
                    ++seen;
                    for (size_t j = 0; j < stride; ++j) ASSERT_EQ(row[j], Value(key, j, 1));
                  })
                  .ok());
  EXPECT_EQ(seen, keys.size());
}

TEST_P(RowStoreEngineTest, NewRowsStartWithTheInitializerWhereverTheyLive) {
  const size_t stride = 4;
  RowStoreOptions small;
  small.engine = GetParam();
  small.memory_budget = BudgetForRows(1100, stride, GetParam());
  auto spilled = RowStore::Open(SparseSpec(2), 11, stride, small).value();
  auto memory = RowStore::Open(SparseSpec(2), 11, stride, RowStoreOptions{}).value();
  ASSERT_FALSE(memory->spills());
  std::vector<float*> a, b;
  for (uint64_t first = 0; first < 5000; first += 1000) {
    std::vector<uint64_t> keys;
    for (uint64_t k = first; k < first + 1000; ++k) keys.push_back(k * 977);
    ASSERT_TRUE(spilled->Fetch(keys, false, &a).ok());
    ASSERT_TRUE(memory->Fetch(keys, false, &b).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(std::memcmp(a[i], b[i], stride * sizeof(float)), 0) << keys[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, RowStoreEngineTest,
                         ::testing::Values(SpillEngine::kFile, SpillEngine::kRocksDB), EngineName);

// Rows read back from the spill file remember where they lie; when new rows make the file
// double (moving every record) those places go stale, and a later write-back must still
// land on the row's record. Each batch mixes rows read back (and changed) with new rows.
TEST(RowStoreTest, ChangedRowsSurviveTheSpillFileDoubling) {
  const size_t stride = 4;
  RowStoreOptions o;
  o.engine = SpillEngine::kFile;
  o.memory_budget = BudgetForRows(1100, stride, o.engine);  // the file starts at ~8x that
  auto store = RowStore::Open(SparseSpec(2), 5, stride, o).value();
  std::map<uint64_t, float> expected;  // key -> float 0 of its row
  std::vector<float*> rows;
  uint64_t next_new = 0;
  std::mt19937_64 rng(17);
  for (int batch = 0; batch < 120; ++batch) {
    std::vector<uint64_t> keys;
    for (int i = 0; i < 300; ++i) keys.push_back(next_new++ * 7919 + 1);
    for (int i = 0; i < 200 && !expected.empty(); ++i) {
      keys.push_back(std::next(expected.begin(), rng() % expected.size())->first);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    ASSERT_TRUE(store->Fetch(keys, /*for_write=*/true, &rows).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = expected.find(keys[i]);
      if (it != expected.end()) {
        ASSERT_EQ(rows[i][0], it->second) << "key " << keys[i];
      }
      const float v = static_cast<float>(batch) + 0.25f * static_cast<float>(i % 4);
      for (size_t j = 0; j < stride; ++j) rows[i][j] = v;
      expected[keys[i]] = v;
    }
  }
  ASSERT_GT(expected.size(), 8 * store->capacity());  // the file doubled at least once
  std::vector<uint64_t> all;
  for (const auto& [k, v] : expected) all.push_back(k);
  for (size_t first = 0; first < all.size(); first += 1000) {
    std::span<const uint64_t> batch(all.data() + first, std::min<size_t>(1000, all.size() - first));
    ASSERT_TRUE(store->Fetch(batch, /*for_write=*/false, &rows).ok());
    for (size_t i = 0; i < batch.size(); ++i) {
      for (size_t j = 0; j < stride; ++j) ASSERT_EQ(rows[i][j], expected[batch[i]]) << batch[i];
    }
  }
}

TEST(RowStoreTest, ABudgetTooSmallIsRefusedWithTheFigures) {
  RowStoreOptions o;
  o.memory_budget = 1000;
  auto r = RowStore::Open(SparseSpec(8), 1, 8, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1000 bytes"), std::string::npos) << r.status().message();
}

TEST(ParseByteSizeTest, UnitsAndErrors) {
  EXPECT_EQ(ParseByteSize("b", "512MB").value(), 512ull << 20);
  EXPECT_EQ(ParseByteSize("b", "4GB").value(), 4ull << 30);
  EXPECT_EQ(ParseByteSize("b", "4g").value(), 4ull << 30);
  EXPECT_EQ(ParseByteSize("b", "64KiB").value(), 64ull << 10);
  EXPECT_EQ(ParseByteSize("b", "1048576").value(), 1048576u);
  EXPECT_EQ(ParseByteSize("b", "0").value(), 0u);
  for (const char* bad : {"", "MB", "12XB", "-5MB", "1.5GB", "99999999999999999"}) {
    auto r = ParseByteSize("memory_budget", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--memory_budget"), std::string::npos);
  }
  auto c = JobConfig::FromFlagMap({{"memory_budget", "256MB"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->memory_budget, 256ull << 20);
}

// ---- through the server ----

JobConfig SparseJob(const std::string& optimizer, uint32_t width) {
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "emb:sparse:" + std::to_string(width) + ":normal:0.1"},
                                 {"num_servers", "1"},
                                 {"num_workers", "1"},
                                 {"staleness", "0"},
                                 {"optimizer", optimizer},
                                 {"base_lr", "0.05"}})
      .value();
}

// One BSP worker's steps: pull a batch of Zipf-ish keys, push a gradient computed from the
// pulled values. Run against the full model in memory and against ~20% of it: every pull
// and the final weights are equal bit for bit.
class SpillServerEngineTest : public ::testing::TestWithParam<SpillEngine> {};

TEST_P(SpillServerEngineTest, SameWeightsBitForBitWithTwentyPercentInMemory) {
  const uint32_t width = 8;
  JobConfig config = SparseJob("adam", width);
  const uint64_t kRows = 20000;
  const size_t stride = width + 2 * width + 1;  // adam: m, v, t
  auto memory = ServerCore::Create(config, 0).value();
  StoreOptions so;
  so.spill_engine = GetParam();
  so.memory_budget = static_cast<int64_t>(BudgetForRows(kRows / 5, stride, GetParam()));
  auto spilled = ServerCore::Create(config, 0, so).value();

  std::mt19937_64 rng(5);
  uint64_t rid = 1;
  for (int step = 0; step < 60; ++step) {
    std::vector<uint64_t> keys;
    for (int i = 0; i < 1500; ++i) {
      // Skewed: low ids far more often (u^3 maps uniform to a heavy head).
      double u = std::uniform_real_distribution<double>(0, 1)(rng);
      keys.push_back(static_cast<uint64_t>(u * u * u * kRows) * 7919);
    }
    Frames pa = KeyPull(rid, 0, keys), pb = KeyPull(rid, 0, keys);
    Frames ra = memory->HandleOne(pa), rb = spilled->HandleOne(pb);
    ASSERT_TRUE(ReplyStatus(ra).ok() && ReplyStatus(rb).ok());
    std::vector<float> va = ReplyFloats(ra), vb = ReplyFloats(rb);
    ASSERT_EQ(va.size(), vb.size());
    ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << "step " << step;
    std::vector<float> grad(va.size());
    for (size_t i = 0; i < va.size(); ++i) grad[i] = va[i] - 0.3f * static_cast<float>(i % 7);
    ++rid;
    Frames qa = KeyPush(rid, 0, keys, grad), qb = KeyPush(rid, 0, keys, grad);
    ASSERT_TRUE(ReplyStatus(memory->HandleOne(qa)).ok());
    ASSERT_TRUE(ReplyStatus(spilled->HandleOne(qb)).ok());
    ++rid;
  }
  ServerStats s = spilled->stats();
  EXPECT_GT(s.rows_spilled, 0u);
  EXPECT_GT(s.cache_misses, 0u);
  EXPECT_EQ(memory->stats().rows_spilled, 0u);
  EXPECT_EQ(s.rows_held, memory->stats().rows_held);
  for (uint64_t r = 0; r < kRows; r += 3) {
    auto a = memory->ReadRow(0, r * 7919).value();
    auto b = spilled->ReadRow(0, r * 7919).value();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, SpillServerEngineTest,
                         ::testing::Values(SpillEngine::kFile, SpillEngine::kRocksDB), EngineName);

// A request with more rows than the budget holds is served in parts.
TEST(SpillServerTest, RequestLargerThanTheBudget) {
  JobConfig config = SparseJob("sgd", 4);
  StoreOptions so;
  so.memory_budget = static_cast<int64_t>(BudgetForRows(1100, 4));
  auto core = ServerCore::Create(config, 0, so).value();
  std::vector<uint64_t> keys(5000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 31 + 1;
  std::vector<float> before = ReplyFloats([&] {
    Frames p = KeyPull(1, 0, keys);
    return core->HandleOne(p);
  }());
  ASSERT_EQ(before.size(), keys.size() * 4);
  std::vector<float> grad(before.size(), 2.0f);
  Frames push = KeyPush(2, 0, keys, grad);
  ASSERT_TRUE(ReplyStatus(core->HandleOne(push)).ok());
  Frames pull = KeyPull(3, 0, keys);
  std::vector<float> after = ReplyFloats(core->HandleOne(pull));
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[i] - 0.05f * 2.0f) << i;
}

// Several clients push and pull overlapping rows at once through real sockets while the
// server evicts; every update is applied exactly once. Gradients are multiples of 1/8, so
// the sums are exact in any order.
TEST(SpillServerTest, ConcurrentClientsLoseNoUpdateUnderEviction) {
  const int kClients = 4, kRounds = 12;
  const uint32_t width = 4;
  const uint64_t kShared = 3000, kOwn = 1500;
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "emb:sparse:4:zeros"},
                                             {"num_servers", "2"},
                                             {"num_workers", "4"},
                                             {"base_lr", "1"},
                                             {"memory_budget", "256KB"}})
                         .value();
  Transport transport;
  testing::InProcessCluster cluster(&transport, config);
  std::vector<std::thread> threads;
  std::vector<Status> results(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      KVClientOptions o;
      o.client_id = c;
      o.request_timeout = std::chrono::seconds(60);
      auto client = KVClient::Create(&transport, config, cluster.endpoints(), o);
      if (!client.ok()) {
        results[c] = client.status();
        return;
      }
      std::vector<uint64_t> keys;
      for (uint64_t k = 0; k < kShared; ++k) keys.push_back(k);
      for (uint64_t k = 0; k < kOwn; ++k) keys.push_back((static_cast<uint64_t>(c + 1) << 32) + k);
      std::vector<float> grad(keys.size() * width);
      for (size_t i = 0; i < keys.size(); ++i) {
        for (uint32_t j = 0; j < width; ++j) grad[i * width + j] = -0.125f * (c + 1) * (j + 1);
      }
      std::vector<float> seen(keys.size() * width);
      for (int r = 0; r < kRounds; ++r) {
        Ticket push = (*client)->Push(0, keys, grad);
        Ticket pull = (*client)->Pull(0, keys, seen);
        Status s = (*client)->Wait(push);
        if (s.ok()) s = (*client)->Wait(pull);
        if (!s.ok()) {
          results[c] = s;
          return;
        }
      }
      // Own rows saw only this client's pushes: after the last pull, exactly kRounds.
      for (size_t i = kShared; i < keys.size(); ++i) {
        for (uint32_t j = 0; j < width; ++j) {
          if (seen[i * width + j] != 0.125f * (c + 1) * (j + 1) * kRounds) {
            results[c] = Internal("own row " + std::to_string(keys[i]) + " float " +
                                  std::to_string(j) + " = " + std::to_string(seen[i * width + j]));
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c)
    ASSERT_TRUE(results[c].ok()) << c << ": " << results[c].ToString();

  KVClientOptions o;
  auto client = KVClient::Create(&transport, config, cluster.endpoints(), o).value();
  std::vector<uint64_t> shared;
  for (uint64_t k = 0; k < kShared; ++k) shared.push_back(k);
  std::vector<float> out(shared.size() * width);
  ASSERT_TRUE(client->Wait(client->Pull(0, shared, out)).ok());
  const float sum_c = 1 + 2 + 3 + 4;
  for (size_t i = 0; i < shared.size(); ++i) {
    for (uint32_t j = 0; j < width; ++j) {
      ASSERT_EQ(out[i * width + j], 0.125f * sum_c * (j + 1) * kRounds) << "row " << i;
    }
  }
  uint64_t spilled = 0, misses = 0;
  for (int s = 0; s < 2; ++s) {
    spilled += cluster.core(s).stats().rows_spilled;
    misses += cluster.core(s).stats().cache_misses;
  }
  EXPECT_GT(spilled, 0u);
  EXPECT_GT(misses, 0u);
}

// ---- export ----

TEST(ExportTest, SafetensorsRoundTripOfASpilledModel) {
  JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                             {"tables", "d:10:3:uniform:1,emb:sparse:4:zeros"},
                                             {"num_servers", "2"},
                                             {"optimizer", "adagrad"},
                                             {"base_lr", "1"}})
                         .value();
  StoreOptions so;
  so.memory_budget = 512 << 10;  // ~4k rows of emb: most of the 20k spill
  auto core = ServerCore::Create(config, 1, so).value();
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 20000; ++k) keys.push_back(k * 1000003 + 5);
  std::vector<float> grad(keys.size() * 4);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 13) - 6.0f;
  Frames push = KeyPush(1, 1, keys, grad);
  ASSERT_TRUE(ReplyStatus(core->HandleOne(push)).ok());
  ASSERT_GT(core->stats().rows_spilled, 0u);
  RowRange held = core->shard_map().DenseRangeOf(0, 1);

  std::string path = ::testing::TempDir() + "/export_test.safetensors";
  ASSERT_TRUE(core->ExportSafetensors(path).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(std::string(file.data() + 8, n));
  const char* data = file.data() + 8 + n;
  auto tensor = [&](const std::string& name, const std::string& dtype,
                    std::vector<uint64_t> shape) -> const char* {
    EXPECT_TRUE(header.contains(name)) << name;
    const auto& t = header[name];
    EXPECT_EQ(t["dtype"], dtype);
    EXPECT_EQ(t["shape"].get<std::vector<uint64_t>>(), shape);
    auto off = t["data_offsets"].get<std::vector<uint64_t>>();
    uint64_t elems = 1;
    for (uint64_t d : shape) elems *= d;
    EXPECT_EQ(off[1] - off[0], elems * (dtype == "U64" ? 8 : 4));
    EXPECT_LE(8 + n + off[1], file.size());
    return data + off[0];
  };
  EXPECT_EQ(header["__metadata__"]["d.row_begin"], std::to_string(held.begin));
  const float* d = reinterpret_cast<const float*>(tensor("d", "F32", {held.size(), 3}));
  for (uint64_t r = held.begin; r < held.end; ++r) {
    auto row = core->ReadRow(0, r).value();
    for (int j = 0; j < 3; ++j) ASSERT_EQ(d[(r - held.begin) * 3 + j], row[j]);
  }
  const uint64_t* ids = reinterpret_cast<const uint64_t*>(tensor("emb.ids", "U64", {keys.size()}));
  const float* values =
      reinterpret_cast<const float*>(tensor("emb.values", "F32", {keys.size(), 4}));
  // Sorted ids; each row's values as the server holds them (adagrad's first step is
  // -lr * sign(g) for g != 0, 0 for g == 0).
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(ids[i], keys[i]);  // keys were generated ascending
    for (int j = 0; j < 4; ++j) {
      float g = grad[i * 4 + j];
      float want = g > 0 ? -1.0f : (g < 0 ? 1.0f : 0.0f);
      ASSERT_NEAR(values[i * 4 + j], want, 1e-5) << "row " << i;
    }
  }
}

uint64_t RssBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

// Training-like traffic over a sparse model five times the budget: the process's peak RSS
// grows by at most the budget plus kOverhead (request frames, allocator slack, the spill
// file's bucket counts; with RocksDB its flush and compaction buffers and table readers).
TEST(SpillServerTest, PeakRssStaysWithinBudgetPlusOverhead) {
  const uint64_t kBudget = 12ull << 20;
  [[maybe_unused]] const uint64_t kOverhead = 16ull << 20;
  const uint32_t width = 16;
  const size_t stride = width + 2 * width + 1;  // adam
  JobConfig config = SparseJob("adam", width);
  StoreOptions so;
  so.memory_budget = static_cast<int64_t>(kBudget);
  auto core = ServerCore::Create(config, 0, so).value();
  const uint64_t model_rows = 5 * kBudget / (stride * sizeof(float));
  // Reset the peak to now (Linux >= 4.0), so that earlier tests do not count.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const uint64_t base = RssBytes("VmRSS:");
  std::vector<uint64_t> keys(4096);
  std::vector<float> grad(keys.size() * width, 0.01f);
  uint64_t rid = 1;
  std::mt19937_64 rng(9);
  // A pass over the model in batches, then half a pass in random order.
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t first = 0; first < model_rows / (pass + 1); first += keys.size()) {
      for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = pass == 0 ? (first + i) % model_rows : rng() % model_rows;
      }
      Frames p = KeyPush(rid++, 0, keys, grad);
      ASSERT_TRUE(ReplyStatus(core->HandleOne(p)).ok());
    }
  }
  const uint64_t peak = RssBytes("VmHWM:");
  ServerStats s = core->stats();
  std::printf(
      "model %.1f MB (%lu rows), budget %.1f MB: peak RSS growth %.1f MB (%.1f MB total), "
      "rows in memory %lu, spilled %lu, disk written %.1f MB, read %.1f MB\n",
      model_rows * stride * 4 / 1048576.0, static_cast<unsigned long>(model_rows),
      kBudget / 1048576.0, (peak - base) / 1048576.0, peak / 1048576.0,
      static_cast<unsigned long>(s.rows_in_memory), static_cast<unsigned long>(s.rows_spilled),
      s.spill_bytes_written / 1048576.0, s.spill_bytes_read / 1048576.0);
  EXPECT_GT(s.rows_spilled, s.rows_in_memory * 3);
#ifndef PS_SANITIZED  // ASan's shadow memory and quarantine are not the server's
  if (peak > 0 && base > 0) {
    EXPECT_LE(peak - base, kBudget + kOverhead);
  }
#endif
}

}  // namespace
}  // namespace ps
