// The planner of filtered searches (SearchArgs::allowed_rows or
// allowed_range): per request it chooses among three plans by their
// estimated cost, and runs the IVF plan so that a query gets k matches
// whenever k rows match.
//
//   exact  distances to every matching row, read from the raw-vectors file:
//          recall 1.0, cost ~ matched_rows * dim. Chosen when it costs no
//          more than the IVF plan (few rows match), and only with the
//          vectors file.
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
//          row's code, without the coarse search, then re-ranking; every
//          match is seen. Cost ~ the query's table + matched_rows * code
//          cost + re-ranking.
//
// Thread-safety: pure functions; the index and vectors are only read.
#ifndef KNND_INDEX_FILTER_PLANNER_H_
#define KNND_INDEX_FILTER_PLANNER_H_

#include <cstdint>

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
  return input;
}

// The nprobe the IVF plan starts at: the larger of nprobe /
// sqrt(selectivity) and the lists that hold, on average, `candidates`
// matching rows; within [nprobe, nlist].
int StartingNprobe(const IndexFacts& facts, const FilterPlanInput& input);

FilterPlan ChooseFilterPlan(const IndexFacts& facts,
                            const FilterPlanInput& input);

// The IVF plan: `call` (allowed_rows or allowed_range set) searched at `start_nprobe`; each
// query that found fewer than `need` results searched again at twice the
// nprobe, up to nlist. Queries are searched in groups of rows such that
// rows * nprobe stays within call.num_queries * call.nprobe, the coarse
// assignment the request's memory estimate counts.
absl::Status SearchIvfWidening(const ServingIndex& index, const SearchArgs& call,
                               int start_nprobe, int64_t need);

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
