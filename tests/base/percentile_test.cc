// Nearest-rank percentiles: the examples percentile.h documents, and the
// edges (no samples, p 0 and p 1).
#include "knnd/base/percentile.h"

#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace knnd {
namespace {

TEST(Percentile, MedianOfFourIsTheSecondSmallest) {
  std::vector<double> samples = {4, 1, 3, 2};
  EXPECT_EQ(Percentile(samples, 0.5), 2);
}

TEST(Percentile, P99OfAHundredIsThe99thSmallest) {
  std::vector<double> samples;
  for (int i = 1; i <= 100; ++i) samples.push_back(i);
  std::shuffle(samples.begin(), samples.end(), std::mt19937(3));
  EXPECT_EQ(Percentile(samples, 0.99), 99);
  EXPECT_EQ(Percentile(samples, 0.5), 50);
  EXPECT_EQ(Percentile(samples, 0.999), 100);  // rank ceil(99.9) = 100
}

TEST(Percentile, NoSamplesIsZero) {
  std::vector<double> none;
  EXPECT_EQ(Percentile(none, 0.5), 0);
  EXPECT_EQ(Percentile(none, 0), 0);
  EXPECT_EQ(Percentile(none, 1), 0);
}

TEST(Percentile, ZeroIsTheSmallestAndOneTheLargest) {
  std::vector<double> samples = {7, -3, 12, 5, 0.5};
  EXPECT_EQ(Percentile(samples, 0), -3);
  EXPECT_EQ(Percentile(samples, 1), 12);
  std::vector<double> one = {42};
  EXPECT_EQ(Percentile(one, 0), 42);
  EXPECT_EQ(Percentile(one, 0.5), 42);
  EXPECT_EQ(Percentile(one, 1), 42);
}

}  // namespace
}  // namespace knnd
