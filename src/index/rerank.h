// Exact re-ranking: IVF-PQ's approximate candidates ordered again by their
// exact distance to the query, computed from the raw vectors
// (storage/vectors_file.h, memory-mapped).
//
// Thread-safety: a pure function of its arguments; any number of threads
// may re-rank against one VectorsFile at once.
#ifndef KNND_INDEX_RERANK_H_
#define KNND_INDEX_RERANK_H_

#include <cstdint>

#include "knnd/base/metric.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {

// Re-ranks `kc` candidates per query (ids -1 and ids outside the file are
// missing ones) into the k best by exact distance (squared L2, or inner
// product, which is the cosine for normalised vectors), closest first,
// ties by id; pads with id -1 and MissingDistance(metric). `queries` are
// num_queries rows of vectors.dim() floats, already normalised for cosine.
void RerankExact(const VectorsFile& vectors, Metric metric,
                 const float* queries, int64_t num_queries, int kc,
                 const int64_t* candidates, int k, float* distances,
                 int64_t* ids);

}  // namespace knnd

#endif  // KNND_INDEX_RERANK_H_
