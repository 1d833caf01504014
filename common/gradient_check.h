// The check every gradient passes before an update rule sees it, on a server for each push
// and in the standalone baseline for each step: a NaN, an Inf or a value beyond
// kMaxAbsGradient is refused and nothing of that gradient is applied, because one such
// value would carry the optimizer's state or the weights to infinity.
//
// Thread safety: pure functions; call from any thread.
#pragma once

#include <span>

#include "common/status.h"

namespace ps {

// The largest |gradient| an update accepts. Beyond it a momentum or Adam step can overflow
// float; no healthy model produces such a gradient.
inline constexpr float kMaxAbsGradient = 1e18f;

// True when every value is finite and |g| <= kMaxAbsGradient. One branch-free pass that
// vectorizes (NaN fails every comparison, so !(|g| <= limit) catches NaN, Inf and huge
// values alike).
bool GradientsInRange(std::span<const float> grads);

// OK when GradientsInRange; else InvalidArgument naming the first bad value and its index,
// phrased to follow "has ": "a non-finite gradient (nan) at float 3" or "a gradient of
// <value> at float 3, beyond the limit of +-1e18".
Status CheckGradients(std::span<const float> grads);

}  // namespace ps
