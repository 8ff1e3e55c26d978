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
#include "knnd/index/list_ids.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {

// Candidates for re-ranking are the kc best IVF-PQ estimates with equal
// estimates decided by ascending id, taken from FAISS's
// kc + CandidateSlack(kc) best (whose order among equal estimates is its
// scan order): 4-bit estimates tie often, and deciding ties by id makes a
// shard's candidates the unsharded index's restricted to that shard, so
// that merged answers equal the unsharded ones (docs/sharding.md) unless
// more than the slack tie at the kc-th place.
inline int CandidateSlack(int kc) { return kc / 4 + 8; }

// Per query, the `kc` best of `kf` (list id, estimate) pairs by estimate
// (ascending when SmallerIsCloser(metric)), equal estimates by ascending
// id (list_ids.IdOf: the id answers carry), missing ones (-1) last, into
// out_ids / out_estimates (kc list ids per query).
void KeepBestCandidates(Metric metric, const int64_t* ids,
                        const float* estimates, int64_t num_queries, int kf,
                        int kc, int64_t* out_ids, float* out_estimates,
                        const ListIds& list_ids = ListIds());

// Re-ranks `kc` candidates per query (list ids; -1 and those outside the
// index are missing ones) into the k best by exact distance (squared L2,
// or inner product, which is the cosine for normalised vectors), closest
// first, ties by id; writes their ids (list_ids.IdOf) and pads with id -1
// and MissingDistance(metric). `queries` are num_queries rows of
// vectors.dim() floats, already normalised for cosine. Row
// list_ids.RowOf(l) of `vectors` holds list id l.
void RerankExact(const VectorsFile& vectors, const ListIds& list_ids,
                 Metric metric, const float* queries, int64_t num_queries,
                 int kc, const int64_t* candidates, int k, float* distances,
                 int64_t* ids);

// The exact distance of each of `kc` candidates per query, in their order
// (no re-ranking): what a shard returns to a merger (docs/sharding.md).
// The candidates (list ids) are replaced by their ids; a missing one (-1,
// or outside the index) gets id -1 and MissingDistance(metric), in
// `candidates` and `distances` alike.
void ExactCandidateDistances(const VectorsFile& vectors,
                             const ListIds& list_ids, Metric metric,
                             const float* queries, int64_t num_queries, int kc,
                             int64_t* candidates, float* distances);

}  // namespace knnd

#endif  // KNND_INDEX_RERANK_H_
