// Parsing and validation of a SearchRequest against the served index and the
// server's limits. Every rejection is INVALID_ARGUMENT with a message that
// names the field, its value and the limit, e.g. "k=5000 exceeds max_k=1024",
// except refine_factor > 0 on an index without raw vectors:
// FAILED_PRECONDITION.
//
// Thread-safety: pure functions.
#ifndef KNND_SERVING_SEARCH_REQUEST_H_
#define KNND_SERVING_SEARCH_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/serving/search_limits.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// A validated request. `queries` points into the request message (or into
// `aligned_copy` when the byte payload was not 4-byte aligned), so the
// request must outlive it.
struct ParsedSearch {
  const float* queries = nullptr;
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 0;
  int refine_factor = 0;  // 0: no re-ranking
  std::vector<int64_t> allowed_ids;  // sorted, unique
  // The rows request.filter admits, allowed_ids folded in (which is then
  // empty); set by ParseFilter(), shared with the snapshot's filter cache
  // when it keeps them (filter_cached). Or, for one eq or range condition
  // on a numeric attribute and no allowed_ids where that costs less,
  // filter_range instead: its bounds, tested per row by the search
  // (base/column_range.h).
  std::shared_ptr<const RowBitmap> filter_rows;
  // filter_rows's lists, when the filter cache keeps them with it
  // (IndexSnapshot::FilterLists); else null.
  std::shared_ptr<const FilteredLists> filter_lists;
  std::optional<ColumnRange> filter_range;
  int64_t filter_matched_rows = 0;  // rows the filter admits
  // How the filter cache took part: kNone (no lookup: no filter, an
  // allow-list, no cache, or bounds for the exact plan), kHit, or kMiss.
  enum class FilterCacheUse { kNone, kHit, kMiss };
  FilterCacheUse filter_cache = FilterCacheUse::kNone;
  // filter_rows is held by the filter cache (counted with the index's heap,
  // not with the request's).
  bool filter_cached = false;
  std::vector<float> aligned_copy;
};

absl::StatusOr<ParsedSearch> ParseSearchRequest(
    const knnd::v1::SearchRequest& request, const IndexInfo& index,
    const SearchLimits& limits);

// Compiles request.filter, when set, against the pinned `snapshot`'s
// attributes into parsed.filter_rows, with parsed.allowed_ids folded in,
// or into parsed.filter_range (which borrows `snapshot`) when that applies:
// INVALID_ARGUMENT as attribute_filter.h says (unknown attribute, wrong
// type, malformed filter, over limits.filter). Runs before the request is
// admitted, so that a bad filter never queues.
// Without allowed_ids, the snapshot's filter cache (filter_cache.h) is
// asked first and a hit's bitmap (and lists) used as it is, nothing
// compiled. On a miss, one condition's bounds serve the exact plan
// (which lists the matches from the column's sorted rows) where the
// snapshot would keep no lists for it (IndexSnapshot::KeepsFilterLists);
// otherwise a compiled bitmap is kept (with its lists where the snapshot
// makes them), and a filter searched through its bounds is compiled and
// kept the second time it misses.
absl::Status ParseFilter(const knnd::v1::SearchRequest& request,
                         const IndexSnapshot& snapshot,
                         const SearchLimits& limits, ParsedSearch& parsed);

// Whether the answer holds every re-ranking candidate (refine_factor * k
// per query, with their PQ estimates) for a merger of shards: asked by
// return_candidates, with re-ranking, and without a filter. A merger of
// filtered answers takes the k best exact distances over every shard's
// (shard_merge.h: each shard planned alone), so a shard's own k best exact
// are all it can use: k per query, and refine_factor times fewer payloads.
bool AnswersWithCandidates(const knnd::v1::SearchRequest& request,
                           const ParsedSearch& parsed);

}  // namespace knnd

#endif  // KNND_SERVING_SEARCH_REQUEST_H_
