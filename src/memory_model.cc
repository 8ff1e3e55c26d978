#include "knnd/memory_model.h"

namespace knnd {

int64_t EstimateSearchBytes(const IndexInfo& index, const SearchShape& shape) {
  const int64_t nq = shape.num_queries;
  const int64_t d = index.dim;
  const int64_t k = shape.k;
  int64_t bytes = nq * d * 4;
  if (index.has_pretransform) {
    bytes += nq * d * 4;  // a pre-transform makes a transformed copy
  }
  bytes += 2 * nq * k * 12;
  bytes += nq * shape.nprobe * 12;
  bytes += 2 * int64_t{index.pq_m} * (int64_t{1} << index.pq_nbits) * 4 +
           2 * d * 4;
  bytes += shape.filter_ids * 16;
  bytes += nq * shape.refine_factor * k * 12;
  return bytes;
}

}  // namespace knnd
