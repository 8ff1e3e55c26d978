// The planner of filtered searches (SearchArgs::allowed_rows or
// allowed_range): per request it chooses among three plans by their
// estimated cost, and runs the IVF plan so that a query gets k matches
// whenever k rows match.
//
//   exact  distances to every matching row, read from the raw-vectors file:
//          recall 1.0, cost ~ matched_rows * dim. Only with the vectors
//          file. A search that re-ranks takes it where it costs no more
//          than the IVF and flat plans (the flat plan's re-ranked answer
//          is nearly the same); one that does not (refine_factor 0), whose
//          other plans answer with estimates, where it costs no more than
//          the IVF plan or the unfiltered search at the request's nprobe:
//          few matches get their exact neighbours.
//   ivf    the IVF scan with the rows as its filter (faiss/id_filter.h), or
//          of the filter's own lists (faiss/filtered_lists.h) when the
//          snapshot keeps them,
//          starting at nprobe / sqrt(selectivity) (a query's closest
//          matches lie farther out than its closest rows), or more where
//          the probed lists would hold, on average, fewer matches than the
//          query needs, and
//          doubling it for each query that found fewer, up to nlist (where
//          every matching row is seen). Cost ~ nlist * dim (coarse search)
//          + the probed lists' look-up tables + scanned codes (every code of
//          a probed list, or only its matches with the filter's lists) *
//          their cost + re-ranking.
//   flat   with the filter's lists, where codes are not residuals (one
//          look-up table per query, knnd's default recipe): every matching
//          row's code, without the coarse search, then re-ranking when the
//          search re-ranks; every match is seen. Cost ~ the query's table +
//          matched_rows * code cost + re-ranking.
//
// Filtered searches that re-rank take the exact distances of every
// candidate their scan returns (k * refine_factor and its slack, rerank.h)
// where the matches lie far from the query (the IVF plan's queries that
// widened for it, SearchIvfWidening's far_out; every query of the flat
// plan, which cannot tell), not only of the k * refine_factor best
// estimates: the refine factor is tuned on unfiltered queries, whose
// neighbours are close; far out the estimates' errors are larger against
// the gaps between the matches' distances.
//
// Thread-safety: pure functions; the index and vectors are only read.
#ifndef KNND_INDEX_FILTER_PLANNER_H_
#define KNND_INDEX_FILTER_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "knnd/base/metric.h"
#include "knnd/faiss/serving_index.h"
#include "knnd/index/list_ids.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {

enum class FilterPlan { kExact, kIvf, kFlat };
const char* FilterPlanName(FilterPlan plan);  // "exact", "ivf" or "flat"

// What a filtered search of one request looks like to the planner.
struct FilterPlanInput {
  int64_t matched_rows = 0;
  int nprobe = 1;
  // Results each query needs from the IVF scan: k, or k * refine_factor
  // candidates with re-ranking.
  int candidates = 1;
  bool has_vectors = false;
  // The search carries the filter's lists (SearchArgs::allowed_lists): the
  // IVF scan reads only the matching codes of a list.
  bool filtered_lists = false;
  // The answer is re-ranked by exact distance (refine_factor > 0).
  bool reranked = false;
};

// The input for a search of `k` results per query, re-ranked from k *
// refine_factor candidates when refine_factor > 0, with a filter admitting
// `matched_rows` rows: what the handler (choosing a filter's form) and the
// search (choosing its plan) both ask the planner.
inline FilterPlanInput PlanInputFor(int64_t matched_rows, int nprobe, int k,
                                    int refine_factor, bool has_vectors) {
  FilterPlanInput input;
  input.matched_rows = matched_rows;
  input.nprobe = nprobe;
  input.candidates = refine_factor > 0 ? k * refine_factor : k;
  input.has_vectors = has_vectors;
  input.reranked = refine_factor > 0;
  return input;
}

// The nprobe the IVF plan starts at: the larger of nprobe /
// sqrt(selectivity) and the lists that hold, on average, `candidates`
// matching rows; within [nprobe, nlist].
int StartingNprobe(const IndexFacts& facts, const FilterPlanInput& input);

FilterPlan ChooseFilterPlan(const IndexFacts& facts,
                            const FilterPlanInput& input);

// The rank at which SearchIvfWidening places an evenly spread filter's
// k-th match among the rows of a query's closest list: k / selectivity
// (the (k / s)-th row), at least k, at most kMaxReferenceRank (or k, when
// k is larger), so that the closest list's scan keeps few results.
constexpr int kMaxReferenceRank = 256;
int ReferenceRank(int k, int64_t matched_rows, int64_t ntotal);

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

#endif  // KNND_INDEX_FILTER_PLANNER_H_
