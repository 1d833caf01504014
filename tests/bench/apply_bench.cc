// ps_apply_bench: how fast the server applies an update (common/optimizer.h) to dense rows,
// against memcpy of the same bytes in the same run (issue #10: applying an update should run
// at memory bandwidth).
//
// A table of --sizes_mb MB of values is laid out as the server holds it: rows of --width
// floats, each followed by its optimizer state, contiguous; a gradient of the same shape as
// the values. One update = Apply on every row (as ServePush does). Reported per optimizer and
// size, the median of --iters:
//   rows_GB/s    bytes of rows (values + state) updated per second;
//   traffic_GB/s bytes the update must move: the rows read and written, the gradient read;
//   memcpy_GB/s  memcpy of the rows' bytes (it reads and writes them once);
//   ratio        rows_GB/s / memcpy_GB/s. The update also reads the gradient, so its
//                memory-bound ceiling is 2R / (2R + G) for R row bytes and G gradient bytes
//                (sgd 0.67, momentum/adagrad 0.8, adam ~0.86), printed as `bound`.
//
//   build/bin/ps_apply_bench [--sizes_mb=1,16,64] [--width=256] [--iters=10]
//                            [--optimizers=sgd,momentum,nesterov,adagrad,adam,adamw]
//                            [--server_threads=N] [--json=FILE]
//
// With --server_threads=N (N > 1; 0: one per core, as ps_server takes it) a second table
// follows: the same table held by a ServerCore (server/server_core.h), a push of the whole
// table and a pull of it through HandleOne, with 1 and with N apply threads
// (server/apply_pool.h), in the same run:
//   push1/pushN_GB/s  bytes of rows (values + state) updated per second, checks included
//                     (the NaN scan stays on the request thread);
//   pull1/pullN_GB/s  bytes of values gathered into the reply per second (the reply frame
//                     is allocated per pull, as the server does);
//   memcpy_GB/s       as above; xN the speedups pushN/push1 and pullN/pull1.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "common/gradient_check.h"
#include "common/job_config.h"
#include "common/optimizer.h"
#include "common/wire.h"
#include "server/server_core.h"

DEFINE_string(sizes_mb, "1,16,64", "MB of row values per table");
DEFINE_uint32(width, 256, "floats per row");
DEFINE_int32(iters, 10, "timed updates per point (after one warm-up)");
DEFINE_string(optimizers, "sgd,momentum,nesterov,adagrad,adam,adamw", "optimizers to measure");
DEFINE_double(weight_decay, 0.0, "--weight_decay of the job (0: the default)");
DEFINE_double(clip_grad_norm, 0.0, "--clip_grad_norm of the job (0: off, the default)");
DEFINE_double(pull_lookahead, 0.0,
              "--pull_lookahead of the job: the ServerCore rows' pulls of momentum and nesterov "
              "tables extrapolate (the bench's pushes are all stale)");
DEFINE_string(json, "", "also write the results as a JSON array to this file");
DEFINE_int32(server_threads, 1,
             "also time pushes and pulls through a ServerCore with 1 and this many apply "
             "threads (1: skip; 0: one per core)");

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
double TimeMedian(int iters, Fn fn) {
  fn();  // warm-up: pages faulted in, caches in their steady state
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(t);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A one-server job of one table (`tables`, --tables syntax) trained with `optimizer`.
ps::Result<ps::JobConfig> BenchConfig(const std::string& optimizer, const std::string& tables) {
  return ps::JobConfig::FromFlagMap({{"model", "none"},
                                     {"tables", tables},
                                     {"num_servers", "1"},
                                     {"num_workers", "1"},
                                     {"optimizer", optimizer},
                                     {"base_lr", "0.01"},
                                     {"weight_decay", std::to_string(FLAGS_weight_decay)},
                                     {"clip_grad_norm", std::to_string(FLAGS_clip_grad_norm)},
                                     {"pull_lookahead", std::to_string(FLAGS_pull_lookahead)}});
}

ps::Frames RangeRequest(uint64_t rid, uint64_t rows, const std::vector<float>* grad) {
  capnp::MallocMessageBuilder b;
  auto body = ps::NewHeader(b, rid, 0).getBody();
  auto keys = grad != nullptr ? body.initPush().getKeys() : body.initPull().getKeys();
  keys.initRange().setBegin(0);
  keys.getRange().setEnd(rows);
  ps::Frames f;
  f.push_back(ps::EncodeFrame(b));
  if (grad != nullptr) f.push_back(ps::CopyFrame(grad->data(), grad->size() * sizeof(float)));
  return f;
}

// Seconds per push and per pull of all `rows` rows through a ServerCore with `threads`
// apply threads (the request frames are built outside the timing).
std::pair<double, double> CoreSeconds(const ps::JobConfig& config, int threads, uint64_t rows,
                                      const std::vector<float>& grad) {
  ps::StoreOptions store;
  store.server_threads = threads;
  auto core = ps::ServerCore::Create(config, 0, store).value();
  uint64_t rid = 0;
  auto time_one = [&](bool push) {
    ps::Frames f = RangeRequest(++rid, rows, push ? &grad : nullptr);
    auto t0 = Clock::now();
    ps::Frames reply = core->HandleOne(f);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (reply.size() != (push ? 1u : 2u)) {
      std::fprintf(stderr, "ps_apply_bench: request %llu failed\n",
                   static_cast<unsigned long long>(rid));
      std::exit(1);
    }
    return s;
  };
  std::vector<double> push_s, pull_s;
  time_one(true);  // warm-up
  time_one(false);
  for (int i = 0; i < FLAGS_iters; ++i) {
    push_s.push_back(time_one(true));
    pull_s.push_back(time_one(false));
  }
  return {Median(push_s), Median(pull_s)};
}

}  // namespace

// The NaN/range scan every push passes before its update (common/gradient_check.h), against
// memcpy of the same bytes: it reads the gradient once, so it should run near memcpy's rate.
// A scalar scan once cost 4x the SGD update itself.
void PrintGradientCheckRows(const std::vector<int>& sizes, nlohmann::json* results) {
  std::printf("\n%-9s %8s %10s %12s %7s\n", "check", "size_MB", "GB/s", "memcpy_GB/s", "ratio");
  for (int mb : sizes) {
    std::vector<float> grad((static_cast<size_t>(mb) << 20) / 4, 0.001f), copy(grad.size());
    const double bytes = static_cast<double>(grad.size()) * sizeof(float);
    bool ok = true;
    const double check_s = TimeMedian(FLAGS_iters, [&] { ok &= ps::GradientsInRange(grad); });
    const double memcpy_s = TimeMedian(
        FLAGS_iters, [&] { std::memcpy(copy.data(), grad.data(), grad.size() * sizeof(float)); });
    if (!ok) std::fprintf(stderr, "ps_apply_bench: the check refused a healthy gradient\n");
    const double check_gbs = bytes / check_s / 1e9, memcpy_gbs = bytes / memcpy_s / 1e9;
    std::printf("%-9s %8d %10.2f %12.2f %7.2f\n", "gradients", mb, check_gbs, memcpy_gbs,
                check_gbs / memcpy_gbs);
    results->push_back({{"optimizer", "gradient_check"},
                        {"size_mb", mb},
                        {"rows_gb_per_s", check_gbs},
                        {"memcpy_gb_per_s", memcpy_gbs},
                        {"ratio", check_gbs / memcpy_gbs}});
  }
}

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps_apply_bench [--sizes_mb=1,16,64] [--width=256] [--iters=10]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  ps::Result<std::vector<int>> sizes = ps::ParseIntList("sizes_mb", FLAGS_sizes_mb);
  if (!sizes.ok()) {
    std::fprintf(stderr, "ps_apply_bench: %s\n", sizes.status().ToString().c_str());
    return 2;
  }
  if (FLAGS_width == 0 || FLAGS_iters <= 0) {
    std::fprintf(stderr, "ps_apply_bench: --width and --iters must be positive\n");
    return 2;
  }
  std::printf("%-9s %8s %6s %10s %13s %12s %7s %6s\n", "optimizer", "size_MB", "width", "rows_GB/s",
              "traffic_GB/s", "memcpy_GB/s", "ratio", "bound");
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& name : Split(FLAGS_optimizers)) {
    auto config = BenchConfig(name, "w:1:1");
    if (!config.ok()) {
      std::fprintf(stderr, "ps_apply_bench: %s\n", config.status().ToString().c_str());
      return 2;
    }
    auto opt = ps::MakeOptimizer(*config);
    if (!opt.ok()) {
      std::fprintf(stderr, "ps_apply_bench: %s\n", opt.status().ToString().c_str());
      return 2;
    }
    const size_t width = FLAGS_width;
    const size_t state = (*opt)->StateFloats(width);
    const size_t stride = width + state;
    for (int mb : *sizes) {
      const size_t rows = std::max<size_t>(1, (static_cast<size_t>(mb) << 20) / 4 / width);
      std::vector<float> table(rows * stride, 0.5f);
      std::vector<float> grad(rows * width, 0.001f);
      std::vector<float> copy(table.size());
      const double row_bytes = static_cast<double>(table.size()) * sizeof(float);
      const double grad_bytes = static_cast<double>(grad.size()) * sizeof(float);
      const double update_s = TimeMedian(FLAGS_iters, [&] {
        for (size_t r = 0; r < rows; ++r) {
          float* row = table.data() + r * stride;
          (*opt)->Apply(std::span<float>(row, width), std::span<float>(row + width, state),
                        std::span<const float>(grad.data() + r * width, width), 0.01f);
        }
      });
      const double memcpy_s = TimeMedian(FLAGS_iters, [&] {
        std::memcpy(copy.data(), table.data(), table.size() * sizeof(float));
      });
      const double rows_gbs = row_bytes / update_s / 1e9;
      const double traffic_gbs = (2 * row_bytes + grad_bytes) / update_s / 1e9;
      const double memcpy_gbs = row_bytes / memcpy_s / 1e9;
      const double bound = 2 * row_bytes / (2 * row_bytes + grad_bytes);
      std::printf("%-9s %8d %6zu %10.2f %13.2f %12.2f %7.2f %6.2f\n", name.c_str(), mb, width,
                  rows_gbs, traffic_gbs, memcpy_gbs, rows_gbs / memcpy_gbs, bound);
      results.push_back({{"optimizer", name},
                         {"size_mb", mb},
                         {"width", width},
                         {"rows_gb_per_s", rows_gbs},
                         {"traffic_gb_per_s", traffic_gbs},
                         {"memcpy_gb_per_s", memcpy_gbs},
                         {"ratio", rows_gbs / memcpy_gbs},
                         {"bound", bound}});
    }
  }
  PrintGradientCheckRows(*sizes, &results);
  ps::Result<int> threads = ps::ResolveServerThreads(FLAGS_server_threads);
  if (!threads.ok()) {
    std::fprintf(stderr, "ps_apply_bench: %s\n", threads.status().ToString().c_str());
    return 2;
  }
  if (*threads > 1) {
    const int n = *threads;
    std::printf("\nthrough ServerCore, 1 vs %d apply threads\n", n);
    std::printf("%-9s %8s %6s %11s %11s %6s %11s %11s %6s %12s\n", "optimizer", "size_MB", "width",
                "push1_GB/s", "pushN_GB/s", "xN", "pull1_GB/s", "pullN_GB/s", "xN", "memcpy_GB/s");
    for (const std::string& name : Split(FLAGS_optimizers)) {
      for (int mb : *sizes) {
        const size_t width = FLAGS_width;
        const uint64_t rows = std::max<uint64_t>(1, (static_cast<uint64_t>(mb) << 20) / 4 / width);
        auto config =
            BenchConfig(name, "w:" + std::to_string(rows) + ":" + std::to_string(width) + ":zeros");
        if (!config.ok()) {
          std::fprintf(stderr, "ps_apply_bench: %s\n", config.status().ToString().c_str());
          return 2;
        }
        const size_t stride = width + ps::MakeOptimizer(*config).value()->StateFloats(width);
        const double row_bytes = static_cast<double>(rows * stride * sizeof(float));
        const double value_bytes = static_cast<double>(rows * width * sizeof(float));
        std::vector<float> grad(rows * width, 0.001f);
        std::vector<float> table(rows * stride, 0.5f), copy(table.size());
        const double memcpy_s = TimeMedian(FLAGS_iters, [&] {
          std::memcpy(copy.data(), table.data(), table.size() * sizeof(float));
        });
        const auto [push1, pull1] = CoreSeconds(*config, 1, rows, grad);
        const auto [pushn, pulln] = CoreSeconds(*config, n, rows, grad);
        const double memcpy_gbs = row_bytes / memcpy_s / 1e9;
        std::printf("%-9s %8d %6zu %11.2f %11.2f %6.2f %11.2f %11.2f %6.2f %12.2f\n", name.c_str(),
                    mb, width, row_bytes / push1 / 1e9, row_bytes / pushn / 1e9, push1 / pushn,
                    value_bytes / pull1 / 1e9, value_bytes / pulln / 1e9, pull1 / pulln,
                    memcpy_gbs);
        results.push_back({{"optimizer", name},
                           {"size_mb", mb},
                           {"width", width},
                           {"server_threads", n},
                           {"push1_gb_per_s", row_bytes / push1 / 1e9},
                           {"pushn_gb_per_s", row_bytes / pushn / 1e9},
                           {"pull1_gb_per_s", value_bytes / pull1 / 1e9},
                           {"pulln_gb_per_s", value_bytes / pulln / 1e9},
                           {"memcpy_gb_per_s", memcpy_gbs}});
      }
    }
  }
  if (!FLAGS_json.empty()) std::ofstream(FLAGS_json) << results.dump(2) << "\n";
  return 0;
}
