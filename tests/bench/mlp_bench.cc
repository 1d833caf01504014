// ps_mlp_bench: the time of one worker step's compute, Network::ForwardBackward
// (worker/network.h), on the CPU and on cuda:0, for the job's default MLP
// (--mlp_layers=784,256,128,10, the network MlpNetwork writes) at
// batch sizes around the default 64. Host buffers in and out, as the worker calls it.
//   build/bin/ps_mlp_bench [--benchmark_filter=cpu]
// CUDA cases are skipped with an error line where the build or the machine has no GPU.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/network_config.h"
#include "kernels/blas_core.h"
#include "kernels/kernels.h"
#include "worker/network.h"

namespace ps {
namespace {

// Arg: the batch size. Label: the device.
void BM_MlpStep(benchmark::State& state, const std::string& device) {
  if (device == "cuda" && CudaDeviceCount() == 0) return state.SkipWithError("no CUDA device");
  Result<std::unique_ptr<Kernels>> kernels = MakeKernels(device);
  if (!kernels.ok()) return state.SkipWithError(kernels.status().ToString().c_str());
  Result<NetworkSpec> spec = ParseNetwork(MlpNetwork({784, 256, 128, 10}).value());
  if (!spec.ok()) return state.SkipWithError(spec.status().ToString().c_str());
  const int batch = static_cast<int>(state.range(0));
  Result<std::unique_ptr<Network>> mlp = Network::Create(*spec, kernels->get(), batch);
  if (!mlp.ok()) return state.SkipWithError(mlp.status().ToString().c_str());

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<std::vector<float>> params, grads;
  std::vector<const float*> p;
  std::vector<float*> g;
  for (size_t n : (*mlp)->ParamSizes()) {
    params.emplace_back(n);
    for (float& v : params.back()) v = normal(rng);
    grads.emplace_back(n);
  }
  for (const auto& t : params) p.push_back(t.data());
  for (auto& t : grads) g.push_back(t.data());
  std::vector<float> x(static_cast<size_t>(batch) * 784);
  for (float& v : x) v = pixel(rng);
  std::vector<int32_t> y(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) y[static_cast<size_t>(i)] = i % 10;

  // The first step loads kernels and allocates; it is not timed.
  Status s = (*mlp)->ForwardBackward(x.data(), y.data(), batch, p, g, nullptr);
  if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  for (auto _ : state) {
    s = (*mlp)->ForwardBackward(x.data(), y.data(), batch, p, g, nullptr);
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations() * batch);  // examples/s
  state.SetLabel((*kernels)->DeviceName());
}

BENCHMARK_CAPTURE(BM_MlpStep, cpu, std::string("cpu"))
    ->Arg(32)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpStep, cuda, std::string("cuda"))
    ->Arg(32)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  if (ps::Status s = ps::RestartWithBestBlasCore(argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
