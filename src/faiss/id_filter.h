// IdFilter: a search call's filter of list ids, borrowed from its
// SearchArgs, for both searches: as a faiss::IDSelector for FAISS's IVF-PQ
// search, and through Contains() for knnd's FastScan kernel
// (fastscan_kernel.h). Internal to src/faiss/. It is either the request's
// allow-list, sorted ascending, or an attribute filter: a row bitmap, or
// the bounds of one numeric condition tested against the mapped column.
//
// No copy and no allocation per search: Contains() binary-searches the
// caller's ids, O(log n), or tests one bit, O(1); the FastScan kernel calls
// it only for candidates that already beat the current k-th distance.
// A column range reads the row's presence bit and value, O(1).
//
// Ownership: borrows the ids, bitmap or range, which must outlive the filter
// (one search call). Thread-safety: immutable; any number of threads may call
// it.
#ifndef KNND_FAISS_ID_FILTER_H_
#define KNND_FAISS_ID_FILTER_H_

#include <algorithm>
#include <cstdint>

#include <faiss/impl/IDSelector.h>

#include "absl/types/span.h"
#include "knnd/base/column_range.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/search_args.h"

namespace knnd {

class IdFilter final : public faiss::IDSelector {
 public:
  // The filter of `args`: its allowed_rows or allowed_range when set,
  // else its allowed_ids (ascending; the request parser sorts them).
  explicit IdFilter(const SearchArgs& args)
      : ids_(args.allowed_ids),
        rows_(args.allowed_rows),
        range_(args.allowed_range),
        first_(args.allowed_rows_first),
        sparse_(rows_ != nullptr && args.allowed_rows_count >= 0 &&
                args.allowed_rows_count * kSparseRatio <= rows_->size()) {}

  // An allow-list, ascending.
  explicit IdFilter(absl::Span<const int64_t> sorted_ids)
      : ids_(sorted_ids),
        rows_(nullptr),
        range_(nullptr),
        first_(0),
        sparse_(false) {}

  // A bitmap admitting at most one row in kSparseRatio is sparse: the
  // FastScan kernel then tests a block's ids before its distances, and
  // skips the blocks that hold none of its rows (fastscan_kernel.h).
  static constexpr int64_t kSparseRatio = 32;

  // False when the call has no filter: every id is allowed.
  bool active() const {
    return rows_ != nullptr || range_ != nullptr || !ids_.empty();
  }
  bool Contains(int64_t id) const {
    if (rows_ != nullptr) return rows_->Test(id - first_);
    if (range_ != nullptr) return range_->Test(id - first_);
    return std::binary_search(ids_.begin(), ids_.end(), id);
  }
  bool is_member(idx_t id) const override { return Contains(id); }

  // The row bitmap and the list id of its row 0, or null when the filter
  // is not a bitmap: the kernel tests its bits inline.
  const RowBitmap* bitmap() const { return rows_; }
  // The column range, or null when the filter is not one.
  const ColumnRange* range() const { return range_; }
  int64_t first() const { return first_; }
  // A bitmap known to admit at most one row in kSparseRatio.
  bool sparse() const { return sparse_; }

 private:
  const absl::Span<const int64_t> ids_;
  const RowBitmap* const rows_;
  const ColumnRange* const range_;
  const int64_t first_;
  const bool sparse_;
};

}  // namespace knnd

#endif  // KNND_FAISS_ID_FILTER_H_
