// The CUDA backend of Kernels: cuBLAS for Gemm, handwritten kernels for the rest, all on
// one stream the object owns. Private to kernels/; built only when PS_WITH_CUDA is set.
// No CUDA type appears here, so plain C++ translation units may include it.
#pragma once

#include <memory>
#include <string>

#include "kernels/kernels.h"

namespace ps {

// Number of visible CUDA devices. When the runtime reports an error (no driver, no
// device) returns 0 and, if `why` is not null, stores the runtime's message in *why.
int CudaDeviceCountWithReason(std::string* why);

// A backend on GPU `device` (0-based). FailedPrecondition when that GPU is not visible;
// Internal or Unavailable when the runtime or cuBLAS fails to set up.
Result<std::unique_ptr<Kernels>> MakeCudaKernels(int device, const KernelsOptions& options);

// CudaPeakMemoryBandwidth of kernels.h.
Result<double> CudaPeakMemoryBandwidthImpl(int device);

}  // namespace ps
