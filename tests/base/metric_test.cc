// Metric names as configs, sidecars and the API spell them.
#include "knnd/base/metric.h"

#include <cmath>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace knnd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Metric, NamesRoundTrip) {
  for (Metric metric : {Metric::kL2, Metric::kInnerProduct, Metric::kCosine}) {
    absl::StatusOr<Metric> parsed = ParseMetric(MetricName(metric));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, metric) << MetricName(metric);
  }
  EXPECT_STREQ(MetricName(Metric::kL2), "l2");
  EXPECT_STREQ(MetricName(Metric::kInnerProduct), "inner_product");
  EXPECT_STREQ(MetricName(Metric::kCosine), "cosine");
}

TEST(Metric, IpIsAnAliasOfInnerProduct) {
  absl::StatusOr<Metric> parsed = ParseMetric("ip");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, Metric::kInnerProduct);
}

TEST(Metric, UnknownNameIsRefusedNamingItAndTheAcceptedOnes) {
  for (const char* bad : {"euclidean", "L2", "", "cos"}) {
    absl::StatusOr<Metric> parsed = ParseMetric(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_THAT(std::string(parsed.status().message()),
                AllOf(HasSubstr(std::string("'") + bad + "'"), HasSubstr("l2"),
                      HasSubstr("ip (inner_product)"), HasSubstr("cosine")));
  }
}

TEST(Metric, OnlyL2RanksSmallerAsCloser) {
  EXPECT_TRUE(SmallerIsCloser(Metric::kL2));
  EXPECT_FALSE(SmallerIsCloser(Metric::kInnerProduct));
  EXPECT_FALSE(SmallerIsCloser(Metric::kCosine));
  EXPECT_EQ(MissingDistance(Metric::kL2), HUGE_VALF);
  EXPECT_EQ(MissingDistance(Metric::kInnerProduct), -HUGE_VALF);
  EXPECT_EQ(MissingDistance(Metric::kCosine), -HUGE_VALF);
}

}  // namespace
}  // namespace knnd
