// Which OpenBLAS kernels a CPU should run (kernels/blas_core.h): the ranking alone; that a
// worker restarts into them is standalone_test's.
#include "kernels/blas_core.h"

#include <gtest/gtest.h>

namespace ps {
namespace {

constexpr CpuFeatures kAvx512{true, true, true};
constexpr CpuFeatures kAvx2{false, true, true};
constexpr CpuFeatures kAvx{false, false, true};
constexpr CpuFeatures kSse{false, false, false};

TEST(BlasCoreTest, TheBestCoreIsTheNewestInstructionSetTheCpuHas) {
  EXPECT_EQ(BestBlasCoreFor(kAvx512), "SkylakeX");
  EXPECT_EQ(BestBlasCoreFor(kAvx2), "Haswell");
  EXPECT_EQ(BestBlasCoreFor(kAvx), "Sandybridge");
  EXPECT_EQ(BestBlasCoreFor(kSse), "");
}

TEST(BlasCoreTest, AnOlderCoreThanTheCpuRunsIsReplacedByTheBest) {
  // OpenBLAS 0.3.21 on family 6 model 207 (Emerald Rapids): Prescott.
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("PRESCOTT", kAvx512), "SkylakeX") << "names are matched ignoring case";
  EXPECT_EQ(BetterBlasCore("Haswell", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Zen", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Core2", kAvx2), "Haswell");
  EXPECT_EQ(BetterBlasCore("Nehalem", kAvx), "Sandybridge");
}

TEST(BlasCoreTest, AGoodEnoughOrUnknownCoreIsLeftAlone) {
  EXPECT_EQ(BetterBlasCore("SkylakeX", kAvx512), "");
  EXPECT_EQ(BetterBlasCore("Cooperlake", kAvx512), "");
  EXPECT_EQ(BetterBlasCore("Haswell", kAvx2), "");
  EXPECT_EQ(BetterBlasCore("Prescott", kSse), "") << "nothing better to run";
  EXPECT_EQ(BetterBlasCore("NeoverseN1", kAvx512), "") << "not an x86 core this table ranks";
  EXPECT_EQ(BetterBlasCore("", kAvx512), "");
  EXPECT_EQ(BetterBlasCore("Prescottish", kAvx512), "") << "whole names only";
}

TEST(BlasCoreTest, ThisProcessNamesItsCore) { EXPECT_FALSE(ChosenBlasCore().empty()); }

}  // namespace
}  // namespace ps
