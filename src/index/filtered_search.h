// The executors of the filtered searches' plans (filter_planner.h chooses
// among them, PrepareFilter once a request; IndexSnapshot::Search
// dispatches on the prepared plan): the IVF plan's widening over the
// serving index, and the exact plan over the raw vectors. The flat plan is
// one ServingIndex search over the filter's lists
// (SearchArgs::allowed_lists_flat, faiss/fastscan_search.h).
//
// Thread-safety: pure functions; the index and vectors are only read.
#ifndef KNND_INDEX_FILTERED_SEARCH_H_
#define KNND_INDEX_FILTERED_SEARCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "knnd/base/metric.h"
#include "knnd/faiss/serving_index.h"
#include "knnd/index/filter_planner.h"
#include "knnd/index/list_ids.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {

// How SearchIvfWidening runs one call: start at `start_nprobe`
// (StartingNprobe), each query needing `need` results (its candidates, or
// every match when fewer match), answering `k` (the request's k) from a
// filter admitting `matched_rows` rows.
struct IvfWidening {
  int start_nprobe = 1;
  int64_t need = 1;
  int k = 1;
  int64_t matched_rows = 1;
};

// The IVF plan: `call` (allowed_rows or allowed_range set) searched at
// plan.start_nprobe, then each query searched again at twice the nprobe,
// up to nlist (each pass scanning only the lists the previous one did not,
// SearchArgs::skip_probes, and merging the results), while
//   - it found fewer than plan.need results, or
//   - its k-th result lies farther out than the lists probed reach: beyond
//     the k-th row of its closest list (what an unfiltered answer reaches)
//     by more than its farthest probed list lies beyond the call's own
//     nprobe-th (ProbeReference, search_args.h), or
//   - its k-th result lies far out (1.5 times farther, in squared
//     distance, than the (k / selectivity)-th row of its closest list,
//     where an evenly spread filter's k-th match would be) and the last
//     widening still brought new results (more than 1 in 20 of `need`).
// A filter that follows the vector space (a topic held by a few clusters;
// everything but the query's own region) has its first k matches in the
// first lists that hold any, not in those holding its nearest ones: this
// widens until the lists probed reach past the matches as far as an
// unfiltered search reaches past its neighbours, and, where the matches
// are far out, until widening stops finding better ones. A filter spread
// evenly over the rows widens as before. Queries are searched in groups of
// rows such that rows * nprobe stays within call.num_queries *
// call.nprobe, the coarse assignment the request's memory estimate counts.
//
// `far_out`, when given, gets one entry per query: 1 where its matches lay
// farther out than the lists first probed reached (by either rule above),
// so that its answer re-ranks deeper (every candidate fetched: the
// estimates' errors grow with the distance, against the gaps between the
// matches' distances).
absl::Status SearchIvfWidening(const ServingIndex& index,
                               const SearchArgs& call, const IvfWidening& plan,
                               std::vector<char>* far_out = nullptr);

// The exact plan: per query the `k` closest of `list_ids_held` (list ids
// of the matching rows) by exact distance from `vectors`, closest first,
// ties by id, answer ids from `list_ids`, padded with -1. `queries` are
// normalised already for cosine.
void SearchExactRows(const VectorsFile& vectors, const ListIds& list_ids,
                     Metric metric, const float* queries, int64_t num_queries,
                     absl::Span<const int64_t> list_ids_held, int k,
                     float* distances, int64_t* ids);

}  // namespace knnd

#endif  // KNND_INDEX_FILTERED_SEARCH_H_
