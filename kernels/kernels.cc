// Backend selection. kernels.h is the only header callers see; the backends hide behind
// cpu_kernels.h and cuda_kernels.h.
#include "kernels/kernels.h"

#include <charconv>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include "kernels/cpu_kernels.h"
#if PS_WITH_CUDA
#include "kernels/cuda_kernels.h"
#endif

namespace ps {
namespace {

constexpr std::string_view kCudaPrefix = "cuda:";

Status BadDevice(std::string_view device) {
  return InvalidArgument("unknown device \"" + std::string(device) +
                         "\": expected \"cpu\", \"cuda\", \"cuda:N\" (N = 0, 1, ...) or "
                         "\"auto\"");
}

}  // namespace

Result<std::unique_ptr<Kernels>> MakeKernels(std::string_view device,
                                             const KernelsOptions& options) {
  // The CPU backend computes in fp32 whatever the options say (see KernelsOptions).
  if (device == "cpu") return MakeCpuKernels();
  if (device == "auto") {
#if PS_WITH_CUDA
    if (CudaDeviceCount() > 0) {
      Result<std::unique_ptr<Kernels>> k = MakeCudaKernels(0, options);
      if (!k.ok()) return k.status().WithContext("device \"auto\" found a GPU");
      return k;
    }
#endif
    return MakeCpuKernels();
  }
  int index = 0;
  if (device == "cuda") {
    index = 0;
  } else if (device.substr(0, kCudaPrefix.size()) == kCudaPrefix) {
    const std::string_view digits = device.substr(kCudaPrefix.size());
    // Digits only: from_chars alone would take "-1".
    const bool all_digits =
        !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!all_digits || ec != std::errc() || end != digits.data() + digits.size()) {
      return BadDevice(device);
    }
  } else {
    return BadDevice(device);
  }
#if PS_WITH_CUDA
  return MakeCudaKernels(index, options);
#else
  (void)options;
  return FailedPrecondition("device \"" + std::string(device) +
                            "\" was asked for, but this build has no CUDA support (configure "
                            "with nvcc available and PS_WITH_CUDA=AUTO or ON)");
#endif
}

int CudaDeviceCount() {
#if PS_WITH_CUDA
  return CudaDeviceCountWithReason(nullptr);
#else
  return 0;
#endif
}

Result<double> CudaPeakMemoryBandwidth(int device) {
#if PS_WITH_CUDA
  return CudaPeakMemoryBandwidthImpl(device);
#else
  return FailedPrecondition("peak memory bandwidth of cuda:" + std::to_string(device) +
                            " was asked for, but this build has no CUDA support");
#endif
}

void EnableFlushToZero() {
#if defined(__x86_64__) || defined(__i386__)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
  // Other architectures: left as is; the flags live in a different register there.
}

}  // namespace ps
