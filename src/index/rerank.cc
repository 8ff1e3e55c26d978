#include "knnd/index/rerank.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "knnd/faiss/vector_math.h"

namespace knnd {
namespace {

// Exact distance of `query` to row `id`; `scratch` holds dim floats for
// decoding float16 rows.
float RowDistance(const VectorsFile& vectors, Metric metric,
                  const float* query, int64_t id, float* scratch) {
  return ExactDistance(metric, query, vectors.RowAsFloats(id, scratch),
                       static_cast<size_t>(vectors.dim()));
}

}  // namespace

void RerankExact(const VectorsFile& vectors, Metric metric,
                 const float* queries, int64_t num_queries, int kc,
                 const int64_t* candidates, int k, float* distances,
                 int64_t* ids) {
  const bool ascending = SmallerIsCloser(metric);
  const float pad = MissingDistance(metric);
  const int dim = vectors.dim();
  std::vector<float> scratch(static_cast<size_t>(dim));
  std::vector<std::pair<float, int64_t>> scored;
  scored.reserve(static_cast<size_t>(kc));
  auto closer = [ascending](const std::pair<float, int64_t>& a,
                            const std::pair<float, int64_t>& b) {
    if (a.first != b.first) {
      return ascending ? a.first < b.first : a.first > b.first;
    }
    return a.second < b.second;
  };
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* query = queries + q * dim;
    scored.clear();
    for (int j = 0; j < kc; ++j) {
      const int64_t id = candidates[q * kc + j];
      if (id < 0 || id >= vectors.count()) continue;
      scored.emplace_back(
          RowDistance(vectors, metric, query, id, scratch.data()), id);
    }
    const size_t keep = std::min(scored.size(), static_cast<size_t>(k));
    std::partial_sort(scored.begin(), scored.begin() + keep, scored.end(),
                      closer);
    for (int j = 0; j < k; ++j) {
      const bool have = static_cast<size_t>(j) < keep;
      distances[q * k + j] = have ? scored[j].first : pad;
      ids[q * k + j] = have ? scored[j].second : -1;
    }
  }
}

}  // namespace knnd
