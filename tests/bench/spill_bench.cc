// spill_bench: pull and push rows/s of a sparse table with the model fully in memory and
// with a fraction of it in memory (the rest in the RocksDB spill tier), in the same run,
// with Zipf-distributed keys as CTR features have. Measures the store through ServerCore
// (no sockets), so that the figures are the spill tier's and not the transport's.
//
//   spill_bench [--rows=1000000] [--width=16] [--batch=1024] [--zipf=1.05]
//               [--fraction=0.1] [--seconds=3] [--optimizer=adagrad] [--json=FILE]
//               [--spill_engine=file|rocksdb|file,rocksdb]
//
// Both stores first get every row (one pass in key order, so that the spilled one starts
// with ~90% of its rows on disk), then alternate pulls and pushes of `batch` Zipf keys.
// Hot keys are scattered over the id space (rank -> key by a multiplicative hash).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "server/checkpoint.h"
#include "server/server_core.h"
#include "tests/server/test_messages.h"

DEFINE_uint64(rows, 1000000, "rows of the sparse table");
DEFINE_uint32(width, 16, "floats per row");
DEFINE_uint32(batch, 1024, "keys per pull / push");
DEFINE_double(zipf, 1.05, "Zipf exponent of key popularity");
DEFINE_double(fraction, 0.1, "fraction of the rows (bytes) the spilled run holds in memory");
DEFINE_double(seconds, 3, "time per measurement");
DEFINE_string(optimizer, "adagrad", "the table's optimizer (its state is part of each row)");
DEFINE_string(checkpoint_dir, "",
              "when set: also time writing and restoring a checkpoint of each store here");
DEFINE_double(checkpoint_gb, 0,
              "when > 0: instead, time writing and restoring a checkpoint of a dense table "
              "of about this many GiB (values and optimizer state) under --checkpoint_dir "
              "(default /tmp), against a plain sequential write and read of as many bytes");
DEFINE_string(json, "", "also write the results as one JSON object to this file");
DEFINE_string(spill_engine, "rocksdb,file",
              "what holds the spilled rows: rocksdb, file, or both (rocksdb,file: one spilled "
              "run each, in the same process; the default)");

namespace ps {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Result_ {
  double pull_rows_per_sec = 0, push_rows_per_sec = 0, hit_rate = 0, seconds = 0;
  uint64_t rows_in_memory = 0, rows_spilled = 0, bytes_read = 0, bytes_written = 0;
  double checkpoint_write_s = 0, checkpoint_restore_s = 0;
  uint64_t checkpoint_bytes = 0;
};

class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  uint64_t operator()(std::mt19937_64& rng) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<uint64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

// A checkpoint directory that cannot be written (a flag) ends the bench with a message,
// not a CHECK.
[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "spill_bench: %s\n", why.c_str());
  std::exit(1);
}

uint64_t KeyOfRank(uint64_t rank) { return (rank + 1) * 0x9E3779B97F4A7C15ull; }

Result_ Run(const JobConfig& config, int64_t budget, SpillEngine engine,
            const std::vector<uint64_t>& stream) {
  StoreOptions so;
  so.memory_budget = budget;
  so.spill_engine = engine;
  auto core = ServerCore::Create(config, 0, so);
  if (!core.ok()) Die(core.status().ToString());
  ServerCore& c = **core;
  const size_t b = FLAGS_batch;
  uint64_t rid = 1;
  // Every row once, in rank order: the coldest rows are the last ones written, so the
  // spilled store starts with the cold tail on disk only where CLOCK put it.
  std::vector<uint64_t> keys(b);
  std::vector<float> grad(b * FLAGS_width, 0.01f);
  for (uint64_t first = 0; first < FLAGS_rows; first += b) {
    for (size_t i = 0; i < b; ++i) keys[i] = KeyOfRank((first + i) % FLAGS_rows);
    Frames p = testing::KeyPush(rid++, 0, keys, grad);
    CHECK(testing::ReplyStatus(c.HandleOne(p)).ok());
  }
  ServerStats before = c.stats();
  double pull_s = 0, push_s = 0;
  uint64_t rows = 0;
  size_t pos = 0;
  auto start = SteadyClock::now();
  while (std::chrono::duration<double>(SteadyClock::now() - start).count() < FLAGS_seconds) {
    keys.assign(stream.begin() + pos, stream.begin() + pos + b);
    pos = (pos + b) % (stream.size() - b);
    Frames pull = testing::KeyPull(rid++, 0, keys);
    auto t0 = SteadyClock::now();
    Frames reply = c.HandleOne(pull);
    auto t1 = SteadyClock::now();
    CHECK(testing::ReplyStatus(reply).ok());
    Frames push = testing::KeyPush(rid++, 0, keys, grad);
    auto t2 = SteadyClock::now();
    CHECK(testing::ReplyStatus(c.HandleOne(push)).ok());
    auto t3 = SteadyClock::now();
    pull_s += std::chrono::duration<double>(t1 - t0).count();
    push_s += std::chrono::duration<double>(t3 - t2).count();
    rows += b;
  }
  ServerStats after = c.stats();
  Result_ r;
  r.pull_rows_per_sec = rows / pull_s;
  r.push_rows_per_sec = rows / push_s;
  const uint64_t hits = after.cache_hits - before.cache_hits;
  const uint64_t misses = after.cache_misses - before.cache_misses;
  r.hit_rate = hits + misses > 0 ? static_cast<double>(hits) / (hits + misses) : 1.0;
  r.rows_in_memory = after.rows_in_memory;
  r.rows_spilled = after.rows_spilled;
  r.bytes_read = after.spill_bytes_read - before.spill_bytes_read;
  r.bytes_written = after.spill_bytes_written - before.spill_bytes_written;
  r.seconds = pull_s + push_s;
  if (!FLAGS_checkpoint_dir.empty()) {
    JobConfig ck = config;
    ck.checkpoint_dir = FLAGS_checkpoint_dir + (budget > 0 ? "/spill" : "/memory");
    std::filesystem::remove_all(ck.checkpoint_dir);
    auto t0 = SteadyClock::now();
    Status w = c.WriteCheckpointTo(ck.checkpoint_dir, 1);
    auto t1 = SteadyClock::now();
    if (!w.ok()) Die(w.ToString());
    r.checkpoint_write_s = std::chrono::duration<double>(t1 - t0).count();
    r.checkpoint_bytes = std::filesystem::file_size(CheckpointFile(ck.checkpoint_dir, 1, 0));
    ck.restore = "latest";
    auto t2 = SteadyClock::now();
    auto restored = ServerCore::Create(ck, 0, so);
    auto t3 = SteadyClock::now();
    if (!restored.ok()) Die(restored.status().ToString());
    r.checkpoint_restore_s = std::chrono::duration<double>(t3 - t2).count();
    std::filesystem::remove_all(ck.checkpoint_dir);
  }
  return r;
}

// Seconds to write `bytes` to `path` sequentially in 4 MiB blocks and fsync it, the floor a
// checkpoint write is measured against; *read_s: to read it back (from the page cache
// unless it was evicted).
double PlainFileWrite(const std::string& path, uint64_t bytes, double* read_s) {
  std::vector<char> block(4 << 20, 1);
  auto t0 = SteadyClock::now();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) Die("cannot write " + path + ": " + std::strerror(errno));
  for (uint64_t done = 0; done < bytes; done += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - done));
    if (std::fwrite(block.data(), 1, n, f) != n)
      Die("cannot write " + path + ": " + std::strerror(errno));
  }
  CHECK_EQ(std::fflush(f), 0);
  CHECK_EQ(::fsync(fileno(f)), 0);
  std::fclose(f);
  auto t1 = SteadyClock::now();
  f = std::fopen(path.c_str(), "rb");
  while (std::fread(block.data(), 1, block.size(), f) == block.size()) {
  }
  std::fclose(f);
  *read_s = std::chrono::duration<double>(SteadyClock::now() - t1).count();
  std::remove(path.c_str());
  return std::chrono::duration<double>(t1 - t0).count();
}

// --checkpoint_gb: one server, one dense table of width 64 under Adagrad (128 floats a
// row), sized to the requested bytes.
int CheckpointGbMain() {
  const std::string dir =
      FLAGS_checkpoint_dir.empty() ? "/tmp/ps_ckpt_bench" : FLAGS_checkpoint_dir;
  const uint64_t row_bytes = 128 * sizeof(float);
  const uint64_t rows =
      static_cast<uint64_t>(FLAGS_checkpoint_gb * (uint64_t{1} << 30)) / row_bytes;
  auto config = JobConfig::FromFlagMap({{"model", "none"},
                                        {"tables", "w:" + std::to_string(rows) + ":64:normal:0.01"},
                                        {"num_servers", "1"},
                                        {"num_workers", "1"},
                                        {"optimizer", "adagrad"},
                                        {"base_lr", "0.01"}});
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 2;
  }
  std::filesystem::remove_all(dir);
  std::error_code made;
  std::filesystem::create_directories(dir, made);
  if (made) Die("cannot create " + dir + ": " + made.message());
  auto t0 = SteadyClock::now();
  auto core = ServerCore::Create(*config, 0);
  if (!core.ok()) Die(core.status().ToString());
  const double create_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  auto t1 = SteadyClock::now();
  Status w = (*core)->WriteCheckpointTo(dir, 1);
  if (!w.ok()) Die(w.ToString());
  const double write_s = std::chrono::duration<double>(SteadyClock::now() - t1).count();
  const uint64_t bytes = std::filesystem::file_size(CheckpointFile(dir, 1, 0));
  core->reset();
  JobConfig ck = *config;
  ck.checkpoint_dir = dir;
  ck.restore = "latest";
  auto t2 = SteadyClock::now();
  auto restored = ServerCore::Create(ck, 0);
  if (!restored.ok()) Die(restored.status().ToString());
  const double restore_s = std::chrono::duration<double>(SteadyClock::now() - t2).count();
  restored->reset();
  double read_s = 0;
  const double plain_s = PlainFileWrite(dir + "/plain.bin", bytes, &read_s);
  std::filesystem::remove_all(dir);
  const double gb = bytes / double(uint64_t{1} << 30);
  std::printf("checkpoint of %.2f GiB (%lu rows x 128 floats) in %s\n", gb,
              static_cast<unsigned long>(rows), dir.c_str());
  std::printf("  checkpoint write   %6.2f s  %5.2f GiB/s  (CRC, fsync, rename)\n", write_s,
              gb / write_s);
  std::printf("  plain file write   %6.2f s  %5.2f GiB/s  (4 MiB fwrite + fsync)\n", plain_s,
              gb / plain_s);
  std::printf(
      "  restore            %6.2f s  %5.2f GiB/s  (includes creating the table: %.2f s "
      "alone)\n",
      restore_s, gb / restore_s, create_s);
  std::printf("  plain file read    %6.2f s  %5.2f GiB/s  (page cache likely warm)\n", read_s,
              gb / read_s);
  if (!FLAGS_json.empty()) {
    nlohmann::json j = {{"bytes", bytes},           {"write_s", write_s},
                        {"plain_write_s", plain_s}, {"restore_s", restore_s},
                        {"create_s", create_s},     {"plain_read_s", read_s}};
    std::ofstream(FLAGS_json) << j.dump(2) << "\n";
  }
  return 0;
}

int Main() {
  if (FLAGS_checkpoint_gb > 0) return CheckpointGbMain();
  auto config = JobConfig::FromFlagMap(
      {{"model", "none"},
       {"tables", "emb:sparse:" + std::to_string(FLAGS_width) + ":normal:0.01"},
       {"num_servers", "1"},
       {"num_workers", "1"},
       {"optimizer", FLAGS_optimizer},
       {"base_lr", "0.01"}});
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 2;
  }
  auto opt = MakeOptimizer(*config).value();
  const size_t stride = FLAGS_width + opt->StateFloats(FLAGS_width);
  std::vector<SpillEngine> engines;
  for (size_t at = 0; at <= FLAGS_spill_engine.size();) {
    size_t comma = std::min(FLAGS_spill_engine.find(',', at), FLAGS_spill_engine.size());
    auto engine = ParseSpillEngine(FLAGS_spill_engine.substr(at, comma - at));
    if (!engine.ok()) Die("--spill_engine: " + engine.status().ToString());
    engines.push_back(*engine);
    at = comma + 1;
  }
  // The budget that holds `fraction` of the rows (each engine gives rows its own share).
  const uint64_t resident = static_cast<uint64_t>(FLAGS_fraction * FLAGS_rows);

  Zipf zipf(FLAGS_rows, FLAGS_zipf);
  std::mt19937_64 rng(42);
  std::vector<uint64_t> stream(2 << 20);
  for (uint64_t& k : stream) k = KeyOfRank(zipf(rng));

  std::printf(
      "sparse table: %lu rows x %u floats (+%zu optimizer state), %s, Zipf s=%.2f, "
      "batches of %u keys\n",
      static_cast<unsigned long>(FLAGS_rows), FLAGS_width, stride - FLAGS_width,
      FLAGS_optimizer.c_str(), FLAGS_zipf, FLAGS_batch);
  Result_ mem = Run(*config, 0, SpillEngine::kFile, stream);
  std::vector<Result_> spills;
  std::vector<int64_t> budgets;
  for (SpillEngine e : engines) {
    budgets.push_back(static_cast<int64_t>(RowStore::BudgetForRows(resident, stride, e)));
    spills.push_back(Run(*config, budgets.back(), e, stream));
  }
  auto line = [](const char* name, const Result_& r) {
    std::printf(
        "%-24s pull %10.0f rows/s  push %10.0f rows/s  hit rate %.4f  in memory %8lu  "
        "spilled %8lu  disk read %.1f MB written %.1f MB\n",
        name, r.pull_rows_per_sec, r.push_rows_per_sec, r.hit_rate,
        static_cast<unsigned long>(r.rows_in_memory), static_cast<unsigned long>(r.rows_spilled),
        r.bytes_read / 1048576.0, r.bytes_written / 1048576.0);
  };
  line("in memory", mem);
  for (size_t i = 0; i < engines.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "%.0f%% in memory (%s)", FLAGS_fraction * 100,
                  SpillEngineName(engines[i]));
    line(name, spills[i]);
  }
  if (!FLAGS_checkpoint_dir.empty()) {
    std::printf(
        "checkpoint of the in memory store: %.1f MB written in %.2f s, restored in %.2f s\n",
        mem.checkpoint_bytes / 1048576.0, mem.checkpoint_write_s, mem.checkpoint_restore_s);
    for (size_t i = 0; i < engines.size(); ++i) {
      const Result_& r = spills[i];
      std::printf(
          "checkpoint of the spilled (%s) store: %.1f MB written in %.2f s, restored in "
          "%.2f s\n",
          SpillEngineName(engines[i]), r.checkpoint_bytes / 1048576.0, r.checkpoint_write_s,
          r.checkpoint_restore_s);
    }
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    std::printf("spilled (%s) / in memory: pull %.2fx  push %.2fx   (budget %.1f MB)\n",
                SpillEngineName(engines[i]), spills[i].pull_rows_per_sec / mem.pull_rows_per_sec,
                spills[i].push_rows_per_sec / mem.push_rows_per_sec, budgets[i] / 1048576.0);
  }
  if (!FLAGS_json.empty()) {
    auto to_json = [](const Result_& r) {
      return nlohmann::json{{"pull_rows_per_sec", r.pull_rows_per_sec},
                            {"push_rows_per_sec", r.push_rows_per_sec},
                            {"hit_rate", r.hit_rate},
                            {"rows_in_memory", r.rows_in_memory},
                            {"rows_spilled", r.rows_spilled},
                            {"bytes_read", r.bytes_read},
                            {"bytes_written", r.bytes_written}};
    };
    nlohmann::json j;
    j["memory"] = to_json(mem);
    // "spill" is the first engine's run (as before); each engine also under its name.
    j["spill"] = to_json(spills[0]);
    j["budget_bytes"] = budgets[0];
    for (size_t i = 0; i < engines.size(); ++i) {
      j[std::string("spill_") + SpillEngineName(engines[i])] = to_json(spills[i]);
      j[std::string("budget_bytes_") + SpillEngineName(engines[i])] = budgets[i];
    }
    std::ofstream(FLAGS_json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  gflags::SetUsageMessage("spill_bench [--rows=N] [--fraction=F] [--zipf=S] [--seconds=S]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return ps::Main();
}
