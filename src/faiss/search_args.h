// SearchArgs: one search call, the one argument struct of the search path:
// the request handler fills it for a whole request (SearchJob::args), the
// Batcher for each batch it runs, IndexSnapshot::Search reads all of it and
// passes it on to ServingIndex::Search, which reads the fields of the first
// group (the re-ranking ones are the snapshot's). An attribute filter does
// not travel in it from the handler: it comes prepared beside it
// (index/prepared_filter.h), and IndexSnapshot::Search sets the allowed_*
// fields below from it for the call it makes to ServingIndex.
//
// Thread-safety: a plain value; the buffers it points to belong to the
// caller.
#ifndef KNND_FAISS_SEARCH_ARGS_H_
#define KNND_FAISS_SEARCH_ARGS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "knnd/base/column_range.h"
#include "knnd/base/row_bitmap.h"

namespace knnd {

class FilteredLists;
struct ProbeReference;

// Buffers are owned by the caller and hold num_queries * k entries
// (num_queries * k * refine_factor with return_candidates).
struct SearchArgs {
  const float* queries = nullptr;  // num_queries * dim, row-major
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 1;
  // Sorted ascending; empty means no filter. Ids as answers carry them
  // (with an id table, the user's ids: IndexSnapshot translates them to
  // the list ids ServingIndex searches).
  absl::Span<const int64_t> allowed_ids;
  float* distances = nullptr;
  int64_t* ids = nullptr;
  // > 0: take refine_factor * k candidates from IVF-PQ and return the k
  // best by exact distance over the raw vectors. Needs has_vectors.
  int refine_factor = 0;
  // With refine_factor > 0, for a merger of shards (docs/sharding.md): no
  // re-ranking; `ids`, `distances` and `approx_distances` hold
  // num_queries * k * refine_factor entries, every IVF-PQ candidate in the
  // order of its PQ estimate (in approx_distances) with its exact distance
  // (in distances).
  bool return_candidates = false;
  float* approx_distances = nullptr;
  // Optional out: time spent computing exact distances (0 without refine).
  absl::Duration* rerank_time = nullptr;
  // An attribute filter's rows (index/attribute_filter.h), when not null:
  // only list ids l with allowed_rows->Test(l - allowed_rows_first) can be
  // returned. The request's allowed_ids are folded into it when it is
  // compiled, so allowed_ids is then empty. IndexSnapshot sets it and
  // allowed_rows_first (a shard's first list id) from the prepared filter
  // (index/prepared_filter.h), whose plan it runs.
  const RowBitmap* allowed_rows = nullptr;
  int64_t allowed_rows_first = 0;
  // allowed_rows's lists cut down to its rows (filtered_lists.h), when the
  // snapshot keeps them with the filter: a FastScan index's IVF scan reads
  // these instead of testing allowed_rows per code. Never set without
  // allowed_rows.
  const FilteredLists* allowed_lists = nullptr;
  // With allowed_lists, where the index's codes are not residuals (one
  // look-up table per query): every row of allowed_lists is scanned, with
  // no coarse search and nprobe unused (the flat plan of
  // index/filter_planner.h).
  bool allowed_lists_flat = false;
  // allowed_rows->Count() when the caller has counted it (the prepared
  // filter has), so that the search does not count again; -1: not known.
  // Never set without allowed_rows, and never to another value.
  int64_t allowed_rows_count = -1;
  // Instead of allowed_rows, a filter of one numeric condition tested per
  // row (base/column_range.h): list id l can be returned only when
  // allowed_range->Test(l - allowed_rows_first). Never set together with
  // allowed_rows or allowed_ids.
  const ColumnRange* allowed_range = nullptr;
  // The first skip_probes lists of each query's coarse order (closest
  // first) are not scanned: the IVF plan's widening (index/filtered_search.h)
  // scanned them in its previous pass and merges this pass's results, the
  // best k of the other nprobe - skip_probes lists, with that pass's.
  // 0 <= skip_probes < nprobe; not read by the flat plan.
  int skip_probes = 0;
  // Optional out, for the IVF plan's widening (index/filtered_search.h):
  // num_queries entries of where each query's filtered scan stands
  // (ProbeReference). Written only with a filter (allowed_rows or
  // allowed_range) and not allowed_lists_flat; reference_nprobe >= 1
  // then, and 1 <= reference_k <= reference_rank, or both 0 (the closest
  // list not searched: nearest_kth and nearest_rank left as they are).
  ProbeReference* probe_reference = nullptr;
  int reference_nprobe = 0;
  int reference_k = 0;
  int reference_rank = 0;
};

// Where one query's filtered scan stands against the geometry it searched,
// in the index's own terms: squared L2 distances, or for an
// inner-product index similarities (larger is closer). `frontier`: the
// coarse distance of the farthest list probed (the nprobe-th closest);
// `anchor`: that of the reference_nprobe-th closest list, where an
// unfiltered search would stop. `nearest_kth` and `nearest_rank`: the
// estimated distances of the reference_k-th and reference_rank-th closest
// rows of the query's closest list, searched without the filter (its
// farthest row when the list holds fewer; MissingDistance when it is
// empty; a FastScan index estimates them from the list's first 128 rows,
// the ranks scaled to their share): how far an unfiltered answer reaches,
// and how far the k-th match of a filter spread evenly over the rows
// would.
struct ProbeReference {
  float frontier = 0;
  float anchor = 0;
  float nearest_kth = 0;
  float nearest_rank = 0;
};

// Whether `args` carries an attribute filter (allowed_rows or
// allowed_range).
inline bool FiltersRows(const SearchArgs& args) {
  return args.allowed_rows != nullptr || args.allowed_range != nullptr;
}

// Entries per query in the result buffers: k, or with re-ranking and
// return_candidates every candidate, k * refine_factor.
inline int ResultWidth(const SearchArgs& args) {
  return args.return_candidates && args.refine_factor > 0
             ? args.k * args.refine_factor
             : args.k;
}

}  // namespace knnd

#endif  // KNND_FAISS_SEARCH_ARGS_H_
