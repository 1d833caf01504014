// The CPU backend of Kernels: OpenBLAS for Gemm, plain loops for the rest. It is the
// reference every other backend is tested against. Private to kernels/.
#pragma once

#include <memory>

#include "kernels/kernels.h"

namespace ps {

std::unique_ptr<Kernels> MakeCpuKernels();

}  // namespace ps
