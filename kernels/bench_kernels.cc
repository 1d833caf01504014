// ps_kernel_bench: GEMM GFLOP/s and elementwise GB/s of each backend.
//   ps_kernel_bench [--benchmark_filter=cuda]
// CUDA cases are skipped with an error line where the build or the machine has no GPU.
// Times are wall-clock and every iteration waits for the device, so the numbers include
// one launch-and-sync each; the larger sizes amortize that.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace ps {
namespace {

// One backend per device for the whole run: creating a CUDA context takes far longer than
// any measured op. nullptr (with the reason in *error) when the device is not available.
Kernels* GetKernels(const std::string& device, std::string* error) {
  struct Entry {
    std::unique_ptr<Kernels> kernels;
    std::string error;
  };
  static std::map<std::string, Entry>* cache = new std::map<std::string, Entry>();
  auto it = cache->find(device);
  if (it == cache->end()) {
    Entry e;
    Result<std::unique_ptr<Kernels>> k = MakeKernels(device);
    if (k.ok()) {
      e.kernels = std::move(k).value();
    } else {
      e.error = k.status().ToString();
    }
    it = cache->emplace(device, std::move(e)).first;
  }
  *error = it->second.error;
  return it->second.kernels.get();
}

// A device buffer of n random floats in [-1, 1).
Result<DeviceBuffer<float>> RandomBuffer(Kernels* k, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> host(n);
  for (float& v : host) v = dist(rng);
  PS_ASSIGN_OR_RETURN(DeviceBuffer<float> buf, DeviceBuffer<float>::Make(k, n));
  PS_RETURN_IF_ERROR(k->CopyToDevice(buf.get(), host.data(), n * sizeof(float)));
  return buf;
}

void Fail(benchmark::State& state, const Status& s) { state.SkipWithError(s.ToString().c_str()); }

// Args: m, n, k. Label: device.
void BM_Gemm(benchmark::State& state, const std::string& device) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  const int m = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int kk = static_cast<int>(state.range(2));
  auto a = RandomBuffer(k, static_cast<size_t>(m) * kk, 1);
  auto b = RandomBuffer(k, static_cast<size_t>(kk) * n, 2);
  auto c = RandomBuffer(k, static_cast<size_t>(m) * n, 3);
  if (!a.ok()) return Fail(state, a.status());
  if (!b.ok()) return Fail(state, b.status());
  if (!c.ok()) return Fail(state, c.status());
  // One warm-up call: cuBLAS picks and loads its kernel on first use.
  Status s = k->Gemm(false, false, m, n, kk, 1.0f, a->get(), b->get(), 0.0f, c->get());
  if (s.ok()) s = k->Synchronize();
  if (!s.ok()) return Fail(state, s);
  for (auto _ : state) {
    s = k->Gemm(false, false, m, n, kk, 1.0f, a->get(), b->get(), 0.0f, c->get());
    if (s.ok()) s = k->Synchronize();
    if (!s.ok()) return Fail(state, s);
  }
  // Shown as e.g. "flops=24.2G/s"; JSON output has the raw FLOP/s.
  state.counters["flops"] =
      benchmark::Counter(2.0 * m * n * kk, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(k->DeviceName());
}

// Relu in place over range(0) floats: one read and one write each.
void BM_Relu(benchmark::State& state, const std::string& device) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  const size_t n = static_cast<size_t>(state.range(0));
  auto y = RandomBuffer(k, n, 4);
  if (!y.ok()) return Fail(state, y.status());
  Status s = k->Relu(n, y->get());
  if (s.ok()) s = k->Synchronize();
  if (!s.ok()) return Fail(state, s);
  for (auto _ : state) {
    s = k->Relu(n, y->get());
    if (s.ok()) s = k->Synchronize();
    if (!s.ok()) return Fail(state, s);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * n * sizeof(float));
  state.SetLabel(k->DeviceName());
}

void GemmSizes(benchmark::internal::Benchmark* b) {
  b->Args({64, 256, 784});  // the MLP's first layer at batch 64
  b->Args({256, 256, 256});
  b->Args({512, 512, 512});
  b->Args({1024, 1024, 1024});
  b->Args({2048, 2048, 2048});
  b->ArgNames({"m", "n", "k"});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

void ReluSizes(benchmark::internal::Benchmark* b) {
  b->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24);
  b->ArgNames({"n"});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Gemm, cpu, std::string("cpu"))->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Gemm, cuda, std::string("cuda"))->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Relu, cpu, std::string("cpu"))->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Relu, cuda, std::string("cuda"))->Apply(ReluSizes);

}  // namespace
}  // namespace ps

BENCHMARK_MAIN();
