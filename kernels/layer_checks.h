// Argument checks that the CPU and CUDA backends share for the layer ops of kernels.h, so
// that both reject the same calls with the same messages. Private to kernels/.
#pragma once

#include "common/status.h"
#include "kernels/kernels.h"

namespace ps {

// InvalidArgument unless 0 < keep_prob <= 1 (NaN included).
Status CheckKeepProb(const char* op, float keep_prob);

// InvalidArgument unless batch, channels and spatial are >= 0 and their product fits a
// size_t index.
Status CheckChannelSizes(const char* op, int batch, int channels, int spatial);

// InvalidArgument unless rows, cols >= 0 and both strides >= cols.
Status CheckCopy2d(int rows, int cols, int src_stride, int dst_stride);

// ApplyUpdate's: InvalidArgument unless rows, width >= 0 and
// stride >= width + rule.StateFloats(width).
Status CheckUpdateArgs(const UpdateRule& rule, int rows, int width, int stride);

// The shape's Validate(), with the op's name in front of the message.
Status CheckShape(const char* op, const Conv2dShape& shape);
Status CheckShape(const char* op, const Pool2dShape& shape);

}  // namespace ps
