// Compiles a request's attribute filter (knnd.v1.Filter) over an index's
// attribute store (storage/attribute_store.h) into the set of rows it
// admits, a RowBitmap over the index's rows. Every condition is answered
// from the store's value -> rows indexes (a keyword's postings, a numeric
// column's sorted values), never by scanning rows; and/or/not are word-wise
// bitmap operations. One eq or range condition on a numeric column can
// instead be kept as its bounds (CompileColumnRange), which a search tests
// per row it looks at.
//
// Every mistake is INVALID_ARGUMENT naming where in the filter it is
// ("filter.all_of[1].condition"), the field and the limit.
//
// Thread-safety: pure functions; the store is only read.
#ifndef KNND_INDEX_ATTRIBUTE_FILTER_H_
#define KNND_INDEX_ATTRIBUTE_FILTER_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "knnd/base/column_range.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/storage/attribute_store.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

struct FilterLimits {
  // Conditions plus in-list values (config max_filter_conditions).
  int64_t max_conditions = 1024;
  // Nesting of all_of / any_of / negate; a lone condition is 1
  // (config max_filter_depth).
  int max_depth = 16;
};

// The rows of `store` that `filter` admits. `store` null: the index has no
// attributes, which is INVALID_ARGUMENT naming the filter's first field.
// The filter's size and shape are checked against `limits` before any row
// is touched.
absl::StatusOr<RowBitmap> CompileFilter(const knnd::v1::Filter& filter,
                                        const AttributeStore* store,
                                        const FilterLimits& limits);

// When `filter` is one eq or range condition on a numeric column: the
// condition as a ColumnRange over the store's mapped column, its matching
// rows counted by two binary searches and nothing allocated. It admits the
// rows CompileFilter() would. nullopt for any other filter (compile that
// with CompileFilter()); errors as CompileFilter(). `store` must outlive
// the range.
absl::StatusOr<std::optional<ColumnRange>> CompileColumnRange(
    const knnd::v1::Filter& filter, const AttributeStore* store,
    const FilterLimits& limits);

}  // namespace knnd

#endif  // KNND_INDEX_ATTRIBUTE_FILTER_H_
