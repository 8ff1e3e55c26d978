// base/saturating.h: int64 sums and products that stop at the limits.
#include "knnd/base/saturating.h"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace knnd {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(Saturating, ExactWithinRange) {
  EXPECT_EQ(SatAdd(2, 3), 5);
  EXPECT_EQ(SatSub(2, 3), -1);
  EXPECT_EQ(SatMul(-4, 3), -12);
  EXPECT_EQ(SatMul(2, 3, 4, 5), 120);
  EXPECT_EQ(SatAdd(kMax - 1, 1), kMax);
  EXPECT_FALSE(Saturated(kMax - 1));
}

TEST(Saturating, StopsAtTheLimitsInsteadOfWrapping) {
  EXPECT_EQ(SatAdd(kMax, 1), kMax);
  EXPECT_EQ(SatAdd(kMin, -1), kMin);
  EXPECT_EQ(SatSub(kMin, 1), kMin);
  EXPECT_EQ(SatSub(kMax, -1), kMax);
  EXPECT_EQ(SatMul(kMax, 2), kMax);
  EXPECT_EQ(SatMul(kMax, -2), kMin);
  EXPECT_EQ(SatMul(kMin, -1), kMax);
  // The front's k = 2^31 - 1 with refine_factor = 2^32 - 1, 16 bytes an
  // entry, over 3 shards: wrapped, a negative estimate.
  const int64_t k = (int64_t{1} << 31) - 1;
  const int64_t refine = (int64_t{1} << 32) - 1;
  EXPECT_EQ(SatMul(3, k, refine, 16), kMax);
  EXPECT_TRUE(Saturated(SatMul(3, k, refine, 16)));
  // Once saturated, a product or sum of positive factors stays there.
  EXPECT_EQ(SatAdd(SatMul(k, refine, 16), 1), kMax);
  EXPECT_EQ(SatMul(SatMul(k, refine, 16), 1), kMax);
}

static_assert(SatMul(int64_t{1} << 40, int64_t{1} << 40) == kMax,
              "constexpr, usable in constants");

}  // namespace
}  // namespace knnd
