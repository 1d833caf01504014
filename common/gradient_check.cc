#include "common/gradient_check.h"

#include <cmath>
#include <string>

namespace ps {

bool GradientsInRange(std::span<const float> grads) {
  bool bad = false;
  for (float g : grads) bad |= !(std::fabs(g) <= kMaxAbsGradient);
  return !bad;
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
