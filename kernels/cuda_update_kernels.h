// The CUDA kernel behind the CUDA backend's ApplyUpdate (kernels/kernels.h): the servers'
// update rules (common/optimizer.cc) on rows kept in device memory. Private to kernels/ and
// included by .cu files only (it names CUDA types). The launcher queues one block per row
// on `stream`, launches nothing when there is nothing to do, and returns the launch's error
// (cudaGetLastError). Arguments are checked by the caller (CheckUpdateArgs).
#pragma once

#include <cuda_runtime.h>

#include "common/update_rule.h"

namespace ps {

cudaError_t LaunchApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                              float* table, const float* grad, cudaStream_t stream);

}  // namespace ps
