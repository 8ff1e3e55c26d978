// The cost model of filtered searches: per request it chooses among three
// plans by their estimated cost (PrepareFilter, prepared_filter.h, asks it
// once a request; filtered_search.h runs the plans), and says where the IVF
// plan starts, so that a query gets k matches whenever k rows match.
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
// Thread-safety: pure functions.
#ifndef KNND_INDEX_FILTER_PLANNER_H_
#define KNND_INDEX_FILTER_PLANNER_H_

#include <cstdint>

#include "knnd/faiss/index_facts.h"

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
// `matched_rows` rows: what PrepareFilter asks the planner, choosing the
// filter's form and then its plan.
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

}  // namespace knnd

#endif  // KNND_INDEX_FILTER_PLANNER_H_
