#include "knnd/base/metric.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace knnd {

const char* MetricName(Metric metric) {
  switch (metric) {
    case Metric::kL2: return "l2";
    case Metric::kInnerProduct: return "inner_product";
    case Metric::kCosine: return "cosine";
  }
  return "unknown";
}

absl::StatusOr<Metric> ParseMetric(absl::string_view name) {
  if (name == "l2") return Metric::kL2;
  if (name == "ip" || name == "inner_product") return Metric::kInnerProduct;
  if (name == "cosine") return Metric::kCosine;
  return absl::InvalidArgumentError(absl::StrCat(
      "metric '", name, "' is not one of l2, ip (inner_product), cosine"));
}

float MissingDistance(Metric metric) {
  return SmallerIsCloser(metric) ? std::numeric_limits<float>::infinity()
                                 : -std::numeric_limits<float>::infinity();
}

}  // namespace knnd
