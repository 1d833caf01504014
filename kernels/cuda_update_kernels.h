// The CUDA kernel behind the CUDA backend's ApplyUpdate (kernels/kernels.h): the servers'
// update rules (common/optimizer.cc) on rows kept in device memory. Private to kernels/ and
// included by .cu files only (it names CUDA types). Each launcher queues its kernel on
// `stream`, launches nothing when there is nothing to do, and returns the launch's error
// (cudaGetLastError). Arguments are checked by the caller (CheckUpdateArgs).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/update_rule.h"

namespace ps {

cudaError_t LaunchApplyUpdate(const UpdateRule& rule, float lr, int rows, int width, int stride,
                              float* table, const float* grad, cudaStream_t stream);

// FlagOutOfRange of kernels.h, with at most max_blocks blocks (a grid-stride loop).
cudaError_t LaunchFlagOutOfRange(size_t n, const float* x, float limit, int32_t* flag,
                                 int max_blocks, cudaStream_t stream);

}  // namespace ps
