#include "common/gradient_check.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace ps {

bool GradientsInRange(std::span<const float> grads) {
  // An int32 accumulator, not a bool: GCC vectorizes a float loop only when every value in
  // it is 4 bytes wide (a bool accumulator left this loop scalar, 4x the apply's cost).
  int32_t bad = 0;
  for (float g : grads) bad |= std::fabs(g) <= kMaxAbsGradient ? 0 : 1;
  return bad == 0;
}

Status CheckGradients(std::span<const float> grads) {
  if (GradientsInRange(grads)) return Status::Ok();
  // Only a bad gradient gets here: the scan that names the value may branch.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return InvalidArgument("a non-finite gradient (" + std::to_string(grads[i]) + ") at float " +
                             std::to_string(i));
    }
    if (std::fabs(grads[i]) > kMaxAbsGradient) {
      return InvalidArgument("a gradient of " + std::to_string(grads[i]) + " at float " +
                             std::to_string(i) + ", beyond the limit of +-1e18");
    }
  }
  return Status::Ok();
}

}  // namespace ps
