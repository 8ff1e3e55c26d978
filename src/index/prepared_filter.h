// PreparedFilter: a request's attribute filter prepared once, against the
// pinned version it will run on, as one value: its form (a bitmap of the
// rows it admits, shared with the version's filter cache when kept there,
// with the rows' lists when the cache keeps them too; or one numeric
// condition's bounds), the rows it admits, the plan (filter_planner.h) and
// the nprobe the IVF plan starts at, and how the filter cache took part.
//
// PrepareFilter() makes it before the request is admitted, so that a bad
// filter never queues; the handler reads it for the memory estimate and the
// answer's header (filter_matched_rows, filter_plan); IndexSnapshot::Search
// runs its plan (filtered_search.h) without planning again.
//
// Thread-safety: a PreparedFilter is an immutable value once made;
// PrepareFilter is safe to call from any thread (the filter cache locks).
#ifndef KNND_INDEX_PREPARED_FILTER_H_
#define KNND_INDEX_PREPARED_FILTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "knnd/base/column_range.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/filtered_lists.h"
#include "knnd/index/attribute_filter.h"
#include "knnd/index/filter_planner.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

struct PreparedFilter {
  // The form: `rows` (a bitmap over the version's rows), or `range` (one
  // eq or range condition on a numeric attribute, tested per row by the
  // search; it borrows the snapshot's attribute store). Exactly one is set.
  std::shared_ptr<const RowBitmap> rows;
  // rows's lists cut down to its rows (filtered_lists.h), when the filter
  // cache keeps them with it; else null.
  std::shared_ptr<const FilteredLists> lists;
  std::optional<ColumnRange> range;
  int64_t matched_rows = 0;  // rows the filter admits
  FilterPlan plan = FilterPlan::kIvf;
  int start_nprobe = 1;  // where the IVF plan starts (StartingNprobe)
  // How the filter cache took part: kNone (no lookup: an allow-list, no
  // cache, or bounds for the exact plan), kHit, or kMiss.
  enum class CacheUse { kNone, kHit, kMiss };
  CacheUse cache_use = CacheUse::kNone;
  // `rows` is held by the filter cache (counted with the version's heap,
  // not with the request's).
  bool cached = false;
};

// What the plan of a filtered search depends on besides the filter: the
// request's validated shape.
struct FilteredSearchShape {
  int64_t num_queries = 1;
  int k = 1;
  int nprobe = 1;
  int refine_factor = 0;
};

// Compiles `filter` against `snapshot`'s attributes and plans its search.
// `allowed_ids` (sorted, unique; the request's allow-list) is folded into
// a compiled bitmap, and then emptied; a filter with an allow-list always
// compiles (bounds cannot hold it). Without one, the snapshot's filter
// cache is asked first and a hit's bitmap (and lists) used as it is,
// nothing compiled; on a miss, one numeric condition's bounds serve the
// exact plan (which lists its few matches from the column's sorted rows)
// where the snapshot would keep no lists for it
// (IndexSnapshot::KeepsFilterLists), and the IVF plan where a test per code
// it reads costs less than compiling a bitmap; otherwise a compiled bitmap
// is kept (with its lists where the snapshot makes them), and a filter
// searched through its bounds is compiled and kept the second time it
// misses. INVALID_ARGUMENT as attribute_filter.h says (unknown attribute,
// wrong type, malformed filter, over `limits`).
absl::StatusOr<PreparedFilter> PrepareFilter(const knnd::v1::Filter& filter,
                                             std::vector<int64_t>& allowed_ids,
                                             const FilteredSearchShape& shape,
                                             const IndexSnapshot& snapshot,
                                             const FilterLimits& limits);

// A filter already in form (`rows`, with its `lists` or null; or `range`),
// planned for `shape` on `snapshot`: what PrepareFilter() ends with, for
// tests and benchmarks that make the form themselves.
PreparedFilter PrepareRows(const IndexSnapshot& snapshot,
                           std::shared_ptr<const RowBitmap> rows,
                           std::shared_ptr<const FilteredLists> lists,
                           const FilteredSearchShape& shape);
PreparedFilter PrepareRange(const IndexSnapshot& snapshot, ColumnRange range,
                            const FilteredSearchShape& shape);

}  // namespace knnd

#endif  // KNND_INDEX_PREPARED_FILTER_H_
