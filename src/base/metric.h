// Metric: the distance an index ranks by, with the names used in configs,
// sidecars, the API and logs. One definition for every layer.
#ifndef KNND_BASE_METRIC_H_
#define KNND_BASE_METRIC_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnd {

// kCosine is inner product over L2-normalised vectors: the FAISS file says
// inner product, its metadata sidecar says the vectors were normalised, and
// searches normalise queries to match.
enum class Metric { kL2, kInnerProduct, kCosine };

const char* MetricName(Metric metric);  // "l2", "inner_product" or "cosine"

// Accepts MetricName()'s names and "ip"; anything else is INVALID_ARGUMENT.
absl::StatusOr<Metric> ParseMetric(absl::string_view name);

// Smaller is closer for L2 only.
inline bool SmallerIsCloser(Metric metric) { return metric == Metric::kL2; }

// The distance of a missing neighbour: +inf for L2, -inf otherwise.
float MissingDistance(Metric metric);

}  // namespace knnd

#endif  // KNND_BASE_METRIC_H_
