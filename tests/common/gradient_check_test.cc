// The gradient check a server runs on each push and the standalone baseline on each step:
// every kind of bad value is caught wherever it sits (the fast pass is vectorized, so
// positions inside and at the tail of a vector register matter), and the limit is inclusive.
#include "common/gradient_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace ps {
namespace {

TEST(GradientCheckTest, AcceptsFiniteValuesUpToTheLimit) {
  std::vector<float> g = {0.0f,
                          -0.0f,
                          1.5f,
                          -kMaxAbsGradient,
                          kMaxAbsGradient,
                          std::numeric_limits<float>::denorm_min()};
  EXPECT_TRUE(GradientsInRange(g));
  EXPECT_TRUE(CheckGradients(g).ok());
  EXPECT_TRUE(CheckGradients({}).ok());
}

TEST(GradientCheckTest, RefusesNanInfAndHugeAtEveryPosition) {
  const float bad_values[] = {
      std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(), std::nextafter(kMaxAbsGradient, INFINITY), -2e18f};
  for (float bad : bad_values) {
    for (size_t size : {1u, 7u, 8u, 17u, 33u}) {
      for (size_t at = 0; at < size; ++at) {
        std::vector<float> g(size, 0.25f);
        g[at] = bad;
        EXPECT_FALSE(GradientsInRange(g)) << bad << " at " << at << " of " << size;
        Status s = CheckGradients(g);
        ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << bad << " at " << at;
        EXPECT_NE(s.message().find("at float " + std::to_string(at)), std::string::npos)
            << s.message();
        const bool finite = std::isfinite(bad);
        EXPECT_NE(s.message().find(finite ? "beyond the limit" : "non-finite"), std::string::npos)
            << s.message();
      }
    }
  }
}

TEST(GradientCheckTest, NamesTheFirstBadValue) {
  std::vector<float> g(16, 1.0f);
  g[5] = 1e30f;
  g[9] = std::numeric_limits<float>::quiet_NaN();
  Status s = CheckGradients(g);
  EXPECT_NE(s.message().find("a gradient of "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("at float 5, beyond the limit of +-1e18"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace ps
