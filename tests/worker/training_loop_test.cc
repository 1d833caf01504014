// The training loop against in-process servers: with one worker and staleness 0 it is
// plain sequential SGD on the same data order, to the last bit; its reports carry the
// figures the coordinator needs; a worker that finishes leaves the clock table.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/row_init.h"
#include "common/shard_map.h"
#include "tests/worker/in_process_cluster.h"
#include "worker/network.h"
#include "worker/trainer.h"

namespace ps {
namespace {

// A small synthetic image set: 28x28 "images" whose label is decided by a few pixels, so
// training makes progress.
ImageDataset MakeImages(int64_t count, uint64_t seed) {
  ImageDataset d;
  d.count = count;
  d.rows = 28;
  d.cols = 28;
  d.pixels.resize(static_cast<size_t>(count) * 784);
  d.labels.resize(static_cast<size_t>(count));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < count; ++i) {
    int label = static_cast<int>(rng() % 10);
    d.labels[static_cast<size_t>(i)] = label;
    float* p = d.pixels.data() + i * 784;
    for (int j = 0; j < 784; ++j) p[j] = 0.2f * u(rng);
    for (int j = 0; j < 20; ++j) p[label * 70 + j] += 0.8f;
  }
  return d;
}

class CollectingSink : public ProgressSink {
 public:
  Status Report(const nlohmann::json& line) override {
    lines.push_back(line);
    return Status::Ok();
  }
  std::vector<nlohmann::json> lines;
};

// Config's --mlp_layers=784,16,10 written out as the network it is.
constexpr char kNetwork[] = "input:784,dense:16,relu,dense:10,softmax_ce";

JobConfig Config(int staleness, int workers) {
  return JobConfig::FromFlagMap({{"model", "mlp"},
                                 {"mlp_layers", "784,16,10"},
                                 {"num_servers", "2"},
                                 {"num_workers", std::to_string(workers)},
                                 {"staleness", std::to_string(staleness)},
                                 {"epochs", "2"},
                                 {"batch_size", "32"},
                                 {"base_lr", "0.1"},
                                 {"chunk_examples", "100"},
                                 {"report_every_seconds", "0.000001"}})
      .value();
}

// Trains `config` (one worker) with the loop against in-process servers; returns the
// final model as the servers hold it, one vector per table.
struct LoopRun {
  std::vector<std::vector<float>> params;
  std::vector<nlohmann::json> lines;
  nlohmann::json totals;
};
void RunOneWorker(const JobConfig& config, const ImageDataset& train, const ImageDataset& test,
                  LoopRun* out) {
  Transport transport;
  testing::InProcessCluster cluster(&transport, config);
  auto kernels = MakeKernels("cpu").value();
  auto model = MakeNetworkModel(config, kernels.get(), config.batch_size, train, test).value();
  auto client = KVClient::Create(&transport, config, cluster.endpoints(), {}).value();
  CollectingSink sink;
  LocalChunkSource chunks(config.epochs, static_cast<uint64_t>(config.chunk_examples),
                          config.batch_size);
  TrainingLoop loop(config, {}, client.get(), model.get(), &sink, &chunks);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(loop.Run(stop).ok());
  for (const TableSpec& t : config.table_specs) {
    out->params.emplace_back(t.rows * t.width);
    ASSERT_TRUE(
        client->Wait(client->PullRange(t.id, RowRange{0, t.rows}, out->params.back())).ok());
  }
  out->lines = sink.lines;
  out->totals = loop.Totals();
}

// The same computation in one process: initial rows as the servers make them, the same
// batches (chunks of chunk_examples cut into batches of batch_size, the last one of a chunk
// partial and weighed by n / batch_size), w -= lr * g in float. With local_steps T, rounds
// of T batches (or to the chunk's end): each batch's gradient at the round's copy, which
// moves by -lr * g, and the servers' w -= lr * (the round's sum).
std::vector<std::vector<float>> SequentialSgd(const JobConfig& config, const ImageDataset& train) {
  auto kernels = MakeKernels("cpu").value();
  const int batch = config.batch_size;
  const size_t chunk_size = static_cast<size_t>(config.chunk_examples);
  const size_t tables = config.table_specs.size();
  std::vector<std::vector<float>> w;
  for (const TableSpec& t : config.table_specs) {
    w.emplace_back(t.rows * t.width);
    for (uint64_t r = 0; r < t.rows; ++r) {
      InitializeRow(t, config.seed, r, std::span<float>(w.back().data() + r * t.width, t.width));
    }
  }
  std::vector<std::vector<float>> g, sum;
  for (auto& v : w) {
    g.emplace_back(v.size());
    sum.emplace_back(v.size());
  }
  auto ref_mlp = Network::Create(ParseNetwork(kNetwork).value(), kernels.get(), batch).value();
  const float lr = static_cast<float>(config.base_lr);
  std::vector<float> x(static_cast<size_t>(batch) * 784);
  std::vector<int32_t> y(static_cast<size_t>(batch));
  for (int epoch = 1; epoch <= config.epochs; ++epoch) {
    std::vector<int64_t> order = EpochOrder(config.seed, epoch, train.count);
    for (size_t chunk = 0; chunk < order.size(); chunk += chunk_size) {
      const size_t chunk_end = std::min(order.size(), chunk + chunk_size);
      std::vector<std::vector<float>> local = w;  // the round's copy
      int taken = 0;
      for (size_t b = chunk; b < chunk_end; b += static_cast<size_t>(batch)) {
        const int n = static_cast<int>(std::min<size_t>(batch, chunk_end - b));
        for (int i = 0; i < n; ++i) {
          std::memcpy(x.data() + i * 784, train.pixels.data() + order[b + i] * 784, 784 * 4);
          y[i] = train.labels[order[b + i]];
        }
        std::vector<const float*> params;
        std::vector<float*> grads;
        for (size_t i = 0; i < tables; ++i) {
          params.push_back(local[i].data());
          grads.push_back(g[i].data());
        }
        BatchResult r;
        EXPECT_TRUE(ref_mlp->ForwardBackward(x.data(), y.data(), n, params, grads, &r).ok());
        const float scale = static_cast<float>(n) / static_cast<float>(batch);
        for (size_t i = 0; i < tables; ++i) {
          for (size_t j = 0; j < w[i].size(); ++j) {
            if (n != batch) g[i][j] *= scale;
            sum[i][j] += g[i][j];
          }
        }
        const bool last = ++taken == config.local_steps || b + batch >= chunk_end;
        for (size_t i = 0; i < tables; ++i) {
          for (size_t j = 0; j < w[i].size(); ++j) {
            if (!last) {
              local[i][j] -= lr * g[i][j];
              continue;
            }
            w[i][j] -= lr * sum[i][j];
            sum[i][j] = 0;
          }
        }
        if (last) {
          local = w;
          taken = 0;
        }
      }
    }
  }
  return w;
}

// Runs `config` with the loop and fails unless the servers' model equals SequentialSgd's
// bit for bit; *w gets the latter.
void RunAndCompare(const JobConfig& config, const ImageDataset& train, const ImageDataset& test,
                   LoopRun* run, std::vector<std::vector<float>>* w) {
  ASSERT_NO_FATAL_FAILURE(RunOneWorker(config, train, test, run));
  *w = SequentialSgd(config, train);
  for (size_t i = 0; i < w->size(); ++i) {
    ASSERT_EQ(run->params[i].size(), (*w)[i].size());
    EXPECT_EQ(std::memcmp(run->params[i].data(), (*w)[i].data(), (*w)[i].size() * sizeof(float)), 0)
        << "table " << config.table_specs[i].name << " differs from the sequential computation";
  }
}

TEST(TrainingLoopTest, OneWorkerUnderBspIsSequentialSgdToTheLastBit) {
  const JobConfig config = Config(0, 1);
  const ImageDataset train = MakeImages(300, 1);  // 300/32: the last batch is partial
  const ImageDataset test = MakeImages(100, 2);
  LoopRun run;
  std::vector<std::vector<float>> w;
  ASSERT_NO_FATAL_FAILURE(RunAndCompare(config, train, test, &run, &w));
  // The model moved, so the comparison is not trivially between two initial states.
  std::vector<float> init(config.table_specs[0].width);
  InitializeRow(config.table_specs[0], config.seed, 0, init);
  EXPECT_NE(std::memcmp(init.data(), w[0].data(), init.size() * sizeof(float)), 0);
  const float lr = static_cast<float>(config.base_lr);
  std::vector<nlohmann::json>& lines = run.lines;
  nlohmann::json& totals = run.totals;

  // Reports: train lines with the figures the coordinator aggregates.
  int train_lines = 0, eval_lines = 0;
  for (const auto& line : lines) {
    if (line["kind"] == "train") {
      ++train_lines;
      EXPECT_TRUE(line.contains("wait_seconds"));
      EXPECT_TRUE(line.contains("clock_lag_max"));
      // The rate comes back with push replies; the first line may precede the first one.
      if (train_lines > 1) {
        EXPECT_DOUBLE_EQ(line["lr"].get<double>(), static_cast<double>(lr));
      }
    }
    if (line["kind"] == "eval") ++eval_lines;
  }
  EXPECT_GT(train_lines, 0);
  EXPECT_EQ(eval_lines, 1);  // after epoch 1; the final one is the caller's
  // 3 chunks of 100 (4 batches each: 32, 32, 32, 4) per epoch, 2 epochs.
  EXPECT_EQ(totals["examples"].get<int64_t>(), 600);
  EXPECT_EQ(totals["steps"].get<int64_t>(), 24);
  EXPECT_EQ(totals["clock"].get<int64_t>(), 24);
}

// --local_steps=3, one worker under BSP: each round of 3 batches (or to its chunk's end)
// computes on the worker's copy, moved by SGD between its steps, and pushes the round's
// sum once. The servers' model is the sequential computation's to the last bit, in half
// the clocks (a chunk of 100 is batches 32, 32, 32 | 4: two rounds).
TEST(TrainingLoopTest, LocalStepsPushEachRoundsSumToTheLastBit) {
  JobConfig config = Config(0, 1);
  config.local_steps = 3;
  const ImageDataset train = MakeImages(300, 1);
  const ImageDataset test = MakeImages(100, 2);
  LoopRun run;
  std::vector<std::vector<float>> w;
  ASSERT_NO_FATAL_FAILURE(RunAndCompare(config, train, test, &run, &w));
  // Not the model of a push per step: the rounds changed what was computed.
  const std::vector<std::vector<float>> per_step = SequentialSgd(Config(0, 1), train);
  EXPECT_NE(std::memcmp(per_step[0].data(), w[0].data(), w[0].size() * sizeof(float)), 0);
  EXPECT_EQ(run.totals["examples"].get<int64_t>(), 600);
  EXPECT_EQ(run.totals["steps"].get<int64_t>(), 24);
  EXPECT_EQ(run.totals["clock"].get<int64_t>(), 12);
}

// Two workers under BSP, one 4x slower: the fast one is held (waits), never more than one
// clock ahead, and both finish.
TEST(TrainingLoopTest, BspMakesTheFastWorkerWaitForTheSlowOne) {
  const JobConfig config = Config(0, 2);
  const ImageDataset train = MakeImages(256, 3);
  const ImageDataset test = MakeImages(64, 4);
  Transport transport;
  testing::InProcessCluster cluster(&transport, config);
  std::vector<nlohmann::json> totals(2);
  std::vector<Status> results(2);
  std::vector<CollectingSink> sinks(2);
  LocalChunkSource chunks(config.epochs, static_cast<uint64_t>(config.chunk_examples),
                          config.batch_size);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto kernels = MakeKernels("cpu").value();
      auto model = MakeNetworkModel(config, kernels.get(), config.batch_size, train, test).value();
      KVClientOptions o;
      o.client_id = w;
      auto client = KVClient::Create(&transport, config, cluster.endpoints(), o).value();
      TrainingLoop loop(config, {.worker_id = w, .slowdown = w == 1 ? 4.0 : 1.0}, client.get(),
                        model.get(), &sinks[static_cast<size_t>(w)], &chunks);
      std::atomic<bool> stop{false};
      results[static_cast<size_t>(w)] = loop.Run(stop);
      totals[static_cast<size_t>(w)] = loop.Totals();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  ASSERT_TRUE(results[1].ok()) << results[1].ToString();
  // Leasing: every example of both epochs exactly once, and the fast worker did more.
  const int64_t fast = totals[0]["examples"].get<int64_t>();
  const int64_t slow = totals[1]["examples"].get<int64_t>();
  EXPECT_EQ(fast + slow, 2 * 256);
  EXPECT_GT(totals[0]["wait_seconds"].get<double>(), 0.0);
  for (const auto& line : sinks[0].lines) {
    if (line["kind"] == "train") {
      EXPECT_LE(line["clock_lag_max"].get<int64_t>(), 0);
    }
  }
  ServerStats st = cluster.core(0).stats();
  EXPECT_LE(st.max_clock_lag, 0);
  EXPECT_GT(st.pulls_held, 0u);
}

}  // namespace
}  // namespace ps
