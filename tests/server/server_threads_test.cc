// --server_threads (StoreOptions::server_threads, server/apply_pool.h): the rows of a push
// or pull split among threads by key give the same model and the same reply bytes as one
// thread, bit for bit; the all-or-nothing checks still hold; spilled sparse tables work.
// Run it repeated (--gtest_repeat=50) to look for races: every test here uses a threshold
// of 0 bytes, so even small requests go through the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/apply_pool.h"
#include "server/row_store.h"
#include "server/server_core.h"
#include "tests/server/test_messages.h"

namespace ps {
namespace {

using testing::KeyPull;
using testing::KeyPush;
using testing::RangePull;
using testing::RangePush;
using testing::ReplyFloats;
using testing::ReplyHeader;
using testing::ReplyStatus;

constexpr uint32_t kDense = 0, kSparse = 1;
constexpr uint32_t kDenseWidth = 5, kSparseWidth = 3;

// Two servers, so that server 1's dense slice does not start at row 0.
JobConfig Job(const std::string& optimizer) {
  return JobConfig::FromFlagMap({{"model", "none"},
                                 {"tables", "d:1001:5:uniform:1,s:sparse:3:normal:0.5"},
                                 {"num_servers", "2"},
                                 {"optimizer", optimizer},
                                 {"base_lr", "0.01"},
                                 {"weight_decay", "0.001"},
                                 {"clip_grad_norm", "2"}})
      .value();
}

std::unique_ptr<ServerCore> Core(const JobConfig& config, int threads, StoreOptions store = {}) {
  store.server_threads = threads;
  store.parallel_min_bytes = 0;
  return ServerCore::Create(config, 1, store).value();
}

std::vector<float> Gradient(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = d(rng);
  return g;
}

// The same sequence of pushes and pulls, from a fixed seed; returns every pull reply's
// value bytes and, at the end, the whole dense slice and every sparse key touched.
std::vector<std::string> RunSequence(ServerCore& core, const std::vector<uint64_t>& sparse_keys) {
  const RowRange held = core.shard_map().DenseRangeOf(kDense, core.server_id());
  std::mt19937_64 rng(42);
  std::vector<std::string> pulled;
  uint64_t rid = 1;
  auto pull = [&](Frames request) {
    Frames reply = core.HandleOne(request);
    EXPECT_TRUE(ReplyStatus(reply).ok()) << ReplyStatus(reply).ToString();
    if (reply.size() < 2) return;
    pulled.emplace_back(static_cast<const char*>(reply[1].data()), reply[1].size());
    pulled.push_back(
        std::to_string(ReplyHeader(reply).get().getBody().getPullReply().getVersion()));
  };
  auto push = [&](Frames request) {
    Frames reply = core.HandleOne(request);
    EXPECT_TRUE(ReplyStatus(reply).ok()) << ReplyStatus(reply).ToString();
  };
  for (int step = 0; step < 6; ++step) {
    // The whole slice, then a part crossing block boundaries.
    push(RangePush(rid++, kDense, held.begin, held.end, Gradient(rng, held.size() * kDenseWidth)));
    const uint64_t b = held.begin + 37 + static_cast<uint64_t>(step), e = held.end - 101;
    push(RangePush(rid++, kDense, b, e, Gradient(rng, (e - b) * kDenseWidth)));
    pull(RangePull(rid++, kDense, held.begin + 3, held.end - 2));
    // Dense rows by key, one of them twice (applied twice, in order).
    std::vector<uint64_t> dense_keys = {held.end - 1, held.begin, held.begin + 250, held.begin,
                                        held.begin + 499};
    push(KeyPush(rid++, kDense, dense_keys, Gradient(rng, dense_keys.size() * kDenseWidth)));
    pull(KeyPull(rid++, kDense, dense_keys));
    // Sparse keys: all of them, with repeats, then a shuffled subset.
    std::vector<uint64_t> keys = sparse_keys;
    keys.insert(keys.end(), sparse_keys.begin(), sparse_keys.begin() + 50);
    push(KeyPush(rid++, kSparse, keys, Gradient(rng, keys.size() * kSparseWidth)));
    std::shuffle(keys.begin(), keys.end(), rng);
    keys.resize(keys.size() / 3);
    push(KeyPush(rid++, kSparse, keys, Gradient(rng, keys.size() * kSparseWidth)));
    pull(KeyPull(rid++, kSparse, keys));
  }
  pull(RangePull(rid++, kDense, held.begin, held.end));
  pull(KeyPull(rid++, kSparse, sparse_keys));
  return pulled;
}

std::vector<uint64_t> SparseKeys(size_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < n; ++i) keys.push_back(i * 0x9E3779B97F4A7C15ULL + 7);
  return keys;
}

class ServerThreadsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ServerThreadsTest, ModelAndPullsBitIdenticalToOneThread) {
  const JobConfig config = Job(GetParam());
  const std::vector<uint64_t> keys = SparseKeys(700);
  auto one = Core(config, 1);
  const std::vector<std::string> expected = RunSequence(*one, keys);
  ASSERT_FALSE(expected.empty());
  for (int threads : {2, 3, 4}) {
    auto many = Core(config, threads);
    const std::vector<std::string> got = RunSequence(*many, keys);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i] == expected[i]) << threads << " threads, pull reply " << i;
    }
    EXPECT_EQ(many->stats().pushes_applied, one->stats().pushes_applied);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ServerThreadsTest,
                         ::testing::Values("sgd", "momentum", "nesterov", "adagrad", "adam",
                                           "adamw"));

// The default threshold: a request under 64 KB stays inline, a larger one goes to the pool;
// both read as with one thread.
TEST(ServerThreadsDefaultsTest, DefaultThresholdGivesTheSameModel) {
  const JobConfig config = JobConfig::FromFlagMap({{"model", "none"},
                                                   {"tables", "d:20000:16:uniform:1"},
                                                   {"num_servers", "1"},
                                                   {"optimizer", "adam"}})
                               .value();
  StoreOptions four;
  four.server_threads = 4;
  auto a = ServerCore::Create(config, 0).value();
  auto b = ServerCore::Create(config, 0, four).value();
  std::mt19937_64 rng(3);
  for (uint64_t end : {uint64_t{100}, uint64_t{20000}}) {  // 6.4 KB, 1.28 MB of values
    std::vector<float> g = Gradient(rng, end * 16);
    Frames pa = RangePush(1, 0, 0, end, g), pb = RangePush(1, 0, 0, end, g);
    ASSERT_TRUE(ReplyStatus(a->HandleOne(pa)).ok());
    ASSERT_TRUE(ReplyStatus(b->HandleOne(pb)).ok());
    Frames qa = RangePull(2, 0, 0, 20000), qb = RangePull(2, 0, 0, 20000);
    Frames ra = a->HandleOne(qa), rb = b->HandleOne(qb);
    ASSERT_EQ(ra.at(1).size(), rb.at(1).size());
    ASSERT_EQ(std::memcmp(ra[1].data(), rb[1].data(), ra[1].size()), 0) << end;
  }
}

// A push with a NaN in its last row is refused whole with 4 threads too: no row changes
// and the version stays.
TEST(ServerThreadsBadPushTest, NanInTheLastRowChangesNothing) {
  const JobConfig config = Job("adam");
  auto core = Core(config, 4);
  const RowRange held = core->shard_map().DenseRangeOf(kDense, 1);
  const std::vector<uint64_t> keys = SparseKeys(300);
  std::mt19937_64 rng(9);
  Frames warm = KeyPush(1, kSparse, keys, Gradient(rng, keys.size() * kSparseWidth));
  ASSERT_TRUE(ReplyStatus(core->HandleOne(warm)).ok());
  auto snapshot = [&] {
    Frames d = RangePull(2, kDense, held.begin, held.end), s = KeyPull(3, kSparse, keys);
    Frames rd = core->HandleOne(d), rs = core->HandleOne(s);
    std::vector<float> all = ReplyFloats(rd), sparse = ReplyFloats(rs);
    all.insert(all.end(), sparse.begin(), sparse.end());
    all.push_back(static_cast<float>(ReplyHeader(rd).get().getBody().getPullReply().getVersion()));
    all.push_back(static_cast<float>(ReplyHeader(rs).get().getBody().getPullReply().getVersion()));
    return all;
  };
  const std::vector<float> before = snapshot();

  std::vector<float> g = Gradient(rng, held.size() * kDenseWidth);
  g.back() = std::numeric_limits<float>::quiet_NaN();
  Frames bad_dense = RangePush(4, kDense, held.begin, held.end, g);
  EXPECT_EQ(ReplyStatus(core->HandleOne(bad_dense)).code(), StatusCode::kInvalidArgument);
  std::vector<float> gs = Gradient(rng, keys.size() * kSparseWidth);
  gs.back() = std::numeric_limits<float>::infinity();
  Frames bad_sparse = KeyPush(5, kSparse, keys, gs);
  EXPECT_EQ(ReplyStatus(core->HandleOne(bad_sparse)).code(), StatusCode::kInvalidArgument);

  const std::vector<float> after = snapshot();
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0);
  EXPECT_EQ(core->stats().pushes_rejected, 2u);
  EXPECT_EQ(core->stats().pushes_applied, 1u);
}

// Sparse rows spilled past a small budget, fetched in batches on the request thread and
// applied by 2 threads: the same pulls and model as all in memory with one thread.
class ServerThreadsSpillTest : public ::testing::TestWithParam<SpillEngine> {};

TEST_P(ServerThreadsSpillTest, SpilledSparseTableMatchesOneThreadInMemory) {
  const JobConfig config = Job("adam");
  const std::vector<uint64_t> keys = SparseKeys(4000);
  auto memory = Core(config, 1);
  const std::vector<std::string> expected = RunSequence(*memory, keys);

  const RowRange held = memory->shard_map().DenseRangeOf(kDense, 1);
  const size_t dense_stride = kDenseWidth * 2 + 1 + kDenseWidth;  // adam: m, v, t
  const size_t sparse_stride = kSparseWidth * 2 + 1 + kSparseWidth;
  StoreOptions so;
  so.spill_engine = GetParam();
  so.memory_budget = static_cast<int64_t>(held.size() * dense_stride * sizeof(float) +
                                          RowStore::BudgetForRows(1200, sparse_stride, GetParam()));
  auto spilled = Core(config, 2, so);
  const std::vector<std::string> got = RunSequence(*spilled, keys);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(got[i] == expected[i]) << "pull reply " << i;
  EXPECT_GT(spilled->stats().rows_spilled, 0u);
  EXPECT_GT(spilled->stats().cache_misses, 0u);
}

INSTANTIATE_TEST_SUITE_P(Engines, ServerThreadsSpillTest,
                         ::testing::Values(SpillEngine::kFile, SpillEngine::kRocksDB),
                         [](const ::testing::TestParamInfo<SpillEngine>& info) {
                           return std::string(SpillEngineName(info.param));
                         });

TEST(ApplyPoolTest, EveryPartRunsOnceOnItsOwnThread) {
  ApplyPool pool(4);
  ASSERT_EQ(pool.threads(), 4u);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> runs(4, 0);
    std::vector<std::thread::id> ids(4);
    pool.Run([&](size_t part) {
      ++runs[part];
      ids[part] = std::this_thread::get_id();
    });
    for (int r : runs) ASSERT_EQ(r, 1);
    EXPECT_EQ(ids[0], std::this_thread::get_id());  // part 0: the caller
    for (size_t i = 1; i < 4; ++i) EXPECT_NE(ids[i], ids[0]);
  }
}

TEST(ApplyPoolTest, ResolveServerThreads) {
  EXPECT_EQ(ResolveServerThreads(1).value(), 1);
  EXPECT_EQ(ResolveServerThreads(7).value(), 7);
  const int automatic = ResolveServerThreads(0).value();
  EXPECT_GE(automatic, 1);
  EXPECT_LE(automatic, kMaxAutoServerThreads);
  const int shared = ResolveServerThreads(kSharedServerThreads).value();
  EXPECT_GE(shared, 1);
  EXPECT_LE(shared, automatic);
  EXPECT_EQ(ResolveServerThreads(-2).status().code(), StatusCode::kInvalidArgument);
  // A quarter of the cores, 1 to 8: nothing more than the request thread on a small box.
  EXPECT_EQ(SharedServerThreads(1), 1);
  EXPECT_EQ(SharedServerThreads(2), 1);
  EXPECT_EQ(SharedServerThreads(16), 4);
  EXPECT_EQ(SharedServerThreads(128), 8);
  EXPECT_EQ(ResolveServerThreads(kMaxServerThreads + 1).status().code(),
            StatusCode::kInvalidArgument);
  StoreOptions bad;
  bad.server_threads = -2;
  EXPECT_FALSE(ServerCore::Create(Job("sgd"), 0, bad).ok());
}

TEST(ApplyPoolTest, SparseKeyPartIsStableAndSpreads) {
  std::vector<size_t> count(4, 0);
  for (uint64_t k = 0; k < 4000; ++k) {
    const size_t p = SparseKeyPart(k, 4);
    ASSERT_LT(p, 4u);
    ASSERT_EQ(p, SparseKeyPart(k, 4));
    ++count[p];
  }
  for (size_t c : count) EXPECT_GT(c, 800u);  // consecutive ids spread over the parts
}

}  // namespace
}  // namespace ps
