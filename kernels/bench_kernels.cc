// ps_kernel_bench: GEMM GFLOP/s (fp32 on both backends, and TF32 and bf16 on CUDA), the
// GFLOP/s of the Conv2d ops (im2col + GEMM, forward and both backward passes), and the
// GB/s of the memory-bound ops: ReLU, sparse row gather and scatter-add, fp16 and bfloat16
// conversion.
//   ps_kernel_bench [--benchmark_filter=cuda]
// CUDA cases are skipped with an error line where the build or the machine has no GPU.
// With a GPU the header names its peak memory bandwidth, and the CUDA memory-bound cases
// add a counter `of_peak`: the achieved bandwidth as a fraction of that peak.
// Times are wall-clock and every iteration waits for the device, so the numbers include
// one launch-and-sync each; the larger sizes amortize that.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/blas_core.h"
#include "kernels/kernels.h"

namespace ps {
namespace {

// One backend per device and GEMM precision for the whole run: creating a CUDA context takes
// far longer than any measured op. nullptr (with the reason in *error) when the device is
// not available.
Kernels* GetKernels(const std::string& device, std::string* error,
                    GemmPrecision precision = GemmPrecision::kFp32) {
  struct Entry {
    std::unique_ptr<Kernels> kernels;
    std::string error;
  };
  static std::map<std::string, Entry>* cache = new std::map<std::string, Entry>();
  const std::string key = device + "/" + std::to_string(static_cast<int>(precision));
  auto it = cache->find(key);
  if (it == cache->end()) {
    Entry e;
    KernelsOptions options;
    options.gemm_precision = precision;
    Result<std::unique_ptr<Kernels>> k = MakeKernels(device, options);
    if (k.ok()) {
      e.kernels = std::move(k).value();
    } else {
      e.error = k.status().ToString();
    }
    it = cache->emplace(key, std::move(e)).first;
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

// Peak DRAM bandwidth of cuda:0 in bytes/s, 0 when unknown.
double CudaPeakBandwidth() {
  static const double peak = [] {
    if (CudaDeviceCount() == 0) return 0.0;
    Result<double> bw = CudaPeakMemoryBandwidth(0);
    return bw.ok() ? bw.value() : 0.0;
  }();
  return peak;
}

// bytes_per_iteration moved through memory: GB/s, and on CUDA the fraction of peak.
void SetBandwidth(benchmark::State& state, Kernels* k, double bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes_per_iteration));
  if (k->IsCuda() && CudaPeakBandwidth() > 0) {
    state.counters["of_peak"] = benchmark::Counter(bytes_per_iteration / CudaPeakBandwidth(),
                                                   benchmark::Counter::kIsIterationInvariantRate);
  }
  state.SetLabel(k->DeviceName());
}

// Runs op once to warm up (first-use loading of kernels), then once per iteration, each
// followed by a wait for the device. False (with the benchmark marked failed) on error.
template <typename Op>
bool TimeOp(benchmark::State& state, Kernels* k, Op op) {
  Status s = op();
  if (s.ok()) s = k->Synchronize();
  if (!s.ok()) {
    Fail(state, s);
    return false;
  }
  for (auto _ : state) {
    s = op();
    if (s.ok()) s = k->Synchronize();
    if (!s.ok()) {
      Fail(state, s);
      return false;
    }
  }
  return true;
}

// Args: m, n, k. Label: device (with the GEMM precision when not fp32).
void BM_Gemm(benchmark::State& state, const std::string& device, GemmPrecision precision) {
  std::string error;
  Kernels* k = GetKernels(device, &error, precision);
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
  // TimeOp's warm-up call matters here: cuBLAS picks and loads its kernel on first use.
  const bool ok = TimeOp(state, k, [&] {
    return k->Gemm(false, false, m, n, kk, 1.0f, a->get(), b->get(), 0.0f, c->get());
  });
  if (!ok) return;
  // Shown as e.g. "flops=24.2G/s"; JSON output has the raw FLOP/s.
  state.counters["flops"] =
      benchmark::Counter(2.0 * m * n * kk, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(k->DeviceName());
}

enum class ConvPass { kForward, kBackwardData, kBackwardFilter };

// Args: N, C, H, W, F, K, stride, padding. Counter `flops`: the GEMMs' 2 * N * F * C * K * K
// * OH * OW per call (im2col, col2im and the bias are memory traffic on top).
void BM_Conv2d(benchmark::State& state, const std::string& device, ConvPass pass) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  Conv2dShape s;
  s.batch = static_cast<int>(state.range(0));
  s.in_channels = static_cast<int>(state.range(1));
  s.height = static_cast<int>(state.range(2));
  s.width = static_cast<int>(state.range(3));
  s.out_channels = static_cast<int>(state.range(4));
  s.kernel = static_cast<int>(state.range(5));
  s.stride = static_cast<int>(state.range(6));
  s.padding = static_cast<int>(state.range(7));
  if (Status v = s.Validate(); !v.ok()) return Fail(state, v);
  const size_t pixels = static_cast<size_t>(s.OutHeight()) * s.OutWidth();
  auto x = RandomBuffer(k, static_cast<size_t>(s.batch) * s.in_channels * s.height * s.width, 9);
  auto w = RandomBuffer(k, static_cast<size_t>(s.out_channels) * s.ColRows(), 10);
  auto b = RandomBuffer(k, static_cast<size_t>(s.out_channels), 11);
  auto y = RandomBuffer(k, static_cast<size_t>(s.batch) * s.out_channels * pixels, 12);
  auto ws = RandomBuffer(k, s.WorkspaceFloats(), 13);
  for (const auto* r : {&x, &w, &b, &y, &ws}) {
    if (!r->ok()) return Fail(state, r->status());
  }
  const bool ok = TimeOp(state, k, [&] {
    switch (pass) {
      case ConvPass::kForward:
        return k->Conv2dForward(s, x->get(), w->get(), b->get(), y->get(), ws->get());
      case ConvPass::kBackwardData:
        return k->Conv2dBackwardData(s, y->get(), w->get(), x->get(), ws->get());
      case ConvPass::kBackwardFilter:
        return k->Conv2dBackwardFilter(s, x->get(), y->get(), w->get(), b->get(), ws->get());
    }
    return Internal("unknown conv pass");
  });
  if (!ok) return;
  state.counters["flops"] =
      benchmark::Counter(2.0 * s.batch * s.out_channels * s.ColRows() * static_cast<double>(pixels),
                         benchmark::Counter::kIsIterationInvariantRate);
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
  if (!TimeOp(state, k, [&] { return k->Relu(n, y->get()); })) return;
  SetBandwidth(state, k, 2.0 * n * sizeof(float));
}

// Args: rows, width; from or into a table of kTableRows rows, at uniformly random indices.
constexpr int kTableRows = 1 << 16;

struct SparseBuffers {
  DeviceBuffer<float> table;
  DeviceBuffer<float> rows;
  DeviceBuffer<int32_t> indices;
};

Result<SparseBuffers> MakeSparseBuffers(Kernels* k, int rows, int width) {
  SparseBuffers b;
  PS_ASSIGN_OR_RETURN(b.table, RandomBuffer(k, static_cast<size_t>(kTableRows) * width, 5));
  PS_ASSIGN_OR_RETURN(b.rows, RandomBuffer(k, static_cast<size_t>(rows) * width, 6));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, kTableRows - 1);
  std::vector<int32_t> host(rows);
  for (int32_t& i : host) i = pick(rng);
  PS_ASSIGN_OR_RETURN(b.indices, DeviceBuffer<int32_t>::Make(k, host.size()));
  PS_RETURN_IF_ERROR(k->CopyToDevice(b.indices.get(), host.data(), host.size() * sizeof(int32_t)));
  return b;
}

// Reads the indexed table rows and writes them out: 2 floats moved per element.
void BM_GatherRows(benchmark::State& state, const std::string& device) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  const int rows = static_cast<int>(state.range(0));
  const int width = static_cast<int>(state.range(1));
  Result<SparseBuffers> b = MakeSparseBuffers(k, rows, width);
  if (!b.ok()) return Fail(state, b.status());
  const bool ok = TimeOp(state, k, [&] {
    return k->GatherRows(rows, width, b->table.get(), kTableRows, b->indices.get(), b->rows.get());
  });
  if (!ok) return;
  SetBandwidth(state, k,
               static_cast<double>(rows) * (2.0 * width * sizeof(float) + sizeof(int32_t)));
}

// Reads the source rows and reads and writes the indexed table rows: 3 floats per element.
void BM_ScatterAddRows(benchmark::State& state, const std::string& device) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  const int rows = static_cast<int>(state.range(0));
  const int width = static_cast<int>(state.range(1));
  Result<SparseBuffers> b = MakeSparseBuffers(k, rows, width);
  if (!b.ok()) return Fail(state, b.status());
  // Adding the same rows over and over keeps the table finite for any sane iteration count.
  const bool ok = TimeOp(state, k, [&] {
    return k->ScatterAddRows(rows, width, b->rows.get(), b->indices.get(), kTableRows,
                             b->table.get());
  });
  if (!ok) return;
  SetBandwidth(state, k,
               static_cast<double>(rows) * (3.0 * width * sizeof(float) + sizeof(int32_t)));
}

enum class Conversion { kToHalf, kFromHalf, kToBfloat16, kFromBfloat16 };

// range(0) elements: one float and one 16-bit value moved per element.
void BM_Convert(benchmark::State& state, const std::string& device, Conversion conversion) {
  std::string error;
  Kernels* k = GetKernels(device, &error);
  if (k == nullptr) return state.SkipWithError(error.c_str());
  const size_t n = static_cast<size_t>(state.range(0));
  auto f = RandomBuffer(k, n, 8);
  if (!f.ok()) return Fail(state, f.status());
  Result<DeviceBuffer<uint16_t>> h = DeviceBuffer<uint16_t>::Make(k, n);
  if (!h.ok()) return Fail(state, h.status());
  // Valid 16-bit values for the widening cases.
  Status s = k->ToHalf(n, f->get(), h->get());
  if (!s.ok()) return Fail(state, s);
  const bool ok = TimeOp(state, k, [&] {
    switch (conversion) {
      case Conversion::kToHalf:
        return k->ToHalf(n, f->get(), h->get());
      case Conversion::kFromHalf:
        return k->FromHalf(n, h->get(), f->get());
      case Conversion::kToBfloat16:
        return k->ToBfloat16(n, f->get(), h->get());
      case Conversion::kFromBfloat16:
        return k->FromBfloat16(n, h->get(), f->get());
    }
    return Internal("unknown conversion");
  });
  if (!ok) return;
  SetBandwidth(state, k, static_cast<double>(n) * (sizeof(float) + sizeof(uint16_t)));
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

// Batch 64: a LeNet's two layers on MNIST (5 x 5, padding 2), and 3 x 3 layers of a small
// CIFAR net, one strided.
void ConvSizes(benchmark::internal::Benchmark* b) {
  b->Args({64, 1, 28, 28, 32, 5, 1, 2});
  b->Args({64, 32, 14, 14, 64, 5, 1, 2});
  b->Args({64, 3, 32, 32, 64, 3, 1, 1});
  b->Args({64, 64, 16, 16, 128, 3, 2, 1});
  b->ArgNames({"N", "C", "H", "W", "F", "K", "stride", "pad"});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

void ReluSizes(benchmark::internal::Benchmark* b) {
  b->Arg(1 << 16)->Arg(1 << 20)->Arg(1 << 24);
  b->ArgNames({"n"});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

void SparseSizes(benchmark::internal::Benchmark* b) {
  for (int width : {16, 64, 256}) {
    b->Args({1 << 10, width});
    b->Args({1 << 14, width});
  }
  b->ArgNames({"rows", "width"});
  b->UseRealTime();
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Gemm, cpu, std::string("cpu"), GemmPrecision::kFp32)->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Gemm, cuda, std::string("cuda"), GemmPrecision::kFp32)->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Gemm, cuda_tf32, std::string("cuda"), GemmPrecision::kTf32)->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Gemm, cuda_bf16, std::string("cuda"), GemmPrecision::kBf16)->Apply(GemmSizes);
BENCHMARK_CAPTURE(BM_Conv2d, forward_cpu, std::string("cpu"), ConvPass::kForward)->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Conv2d, forward_cuda, std::string("cuda"), ConvPass::kForward)
    ->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Conv2d, backward_data_cpu, std::string("cpu"), ConvPass::kBackwardData)
    ->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Conv2d, backward_data_cuda, std::string("cuda"), ConvPass::kBackwardData)
    ->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Conv2d, backward_filter_cpu, std::string("cpu"), ConvPass::kBackwardFilter)
    ->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Conv2d, backward_filter_cuda, std::string("cuda"), ConvPass::kBackwardFilter)
    ->Apply(ConvSizes);
BENCHMARK_CAPTURE(BM_Relu, cpu, std::string("cpu"))->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Relu, cuda, std::string("cuda"))->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_GatherRows, cpu, std::string("cpu"))->Apply(SparseSizes);
BENCHMARK_CAPTURE(BM_GatherRows, cuda, std::string("cuda"))->Apply(SparseSizes);
BENCHMARK_CAPTURE(BM_ScatterAddRows, cpu, std::string("cpu"))->Apply(SparseSizes);
BENCHMARK_CAPTURE(BM_ScatterAddRows, cuda, std::string("cuda"))->Apply(SparseSizes);
BENCHMARK_CAPTURE(BM_Convert, to_half_cpu, std::string("cpu"), Conversion::kToHalf)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, to_half_cuda, std::string("cuda"), Conversion::kToHalf)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, from_half_cpu, std::string("cpu"), Conversion::kFromHalf)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, from_half_cuda, std::string("cuda"), Conversion::kFromHalf)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, to_bf16_cpu, std::string("cpu"), Conversion::kToBfloat16)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, to_bf16_cuda, std::string("cuda"), Conversion::kToBfloat16)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, from_bf16_cpu, std::string("cpu"), Conversion::kFromBfloat16)
    ->Apply(ReluSizes);
BENCHMARK_CAPTURE(BM_Convert, from_bf16_cuda, std::string("cuda"), Conversion::kFromBfloat16)
    ->Apply(ReluSizes);

// The run's header: which GPU, and its peak memory bandwidth to read the GB/s against.
void AddDeviceContext() {
  if (CudaDeviceCount() == 0) {
    benchmark::AddCustomContext("cuda", "no GPU visible (or no CUDA build): cuda cases skipped");
    return;
  }
  std::string error;
  Kernels* k = GetKernels("cuda", &error);
  benchmark::AddCustomContext("cuda:0", k != nullptr ? k->DeviceName() : error);
  Result<double> bw = CudaPeakMemoryBandwidth(0);
  if (bw.ok()) {
    char text[96];
    std::snprintf(text, sizeof(text), "%.0f GB/s (2 x memory clock x bus width)", *bw / 1e9);
    benchmark::AddCustomContext("cuda:0 peak memory bandwidth", text);
  } else {
    benchmark::AddCustomContext("cuda:0 peak memory bandwidth",
                                "unavailable: " + bw.status().ToString());
  }
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  if (ps::Status s = ps::RestartWithBestBlasCore(argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ps::AddDeviceContext();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
