// float16 conversion over FAISS's kernels.
#include "knnd/faiss/vector_math.h"

#include <gtest/gtest.h>

namespace knnd {
namespace {

// float16 as the raw-vectors file of re-ranking stores values: exact for
// the representable ones, within 1e-4 near 0.1.
TEST(Rerank, HalfConversionRoundTrips) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 0.000061035156f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_NEAR(HalfToFloat(FloatToHalf(0.1f)), 0.1f, 1e-4);
}

}  // namespace
}  // namespace knnd
