// IdFilter: a request's allow-list of vector ids, borrowed from the caller
// and sorted ascending, for both searches: as a faiss::IDSelector for
// FAISS's IVF-PQ search, and through Contains() for knnd's FastScan kernel
// (fastscan_kernel.h). Internal to src/faiss/.
//
// No copy and no allocation per search: Contains() binary-searches the
// caller's ids, O(log n), and the FastScan kernel calls it only for
// candidates that already beat the current k-th distance.
//
// Ownership: borrows the ids, which must outlive the filter (one search
// call). Thread-safety: immutable; any number of threads may call it.
#ifndef KNND_FAISS_ID_FILTER_H_
#define KNND_FAISS_ID_FILTER_H_

#include <algorithm>
#include <cstdint>

#include <faiss/impl/IDSelector.h>

#include "absl/types/span.h"

namespace knnd {

class IdFilter final : public faiss::IDSelector {
 public:
  // `sorted_ids` ascending (the request parser sorts them).
  explicit IdFilter(absl::Span<const int64_t> sorted_ids) : ids_(sorted_ids) {}

  bool Contains(int64_t id) const {
    return std::binary_search(ids_.begin(), ids_.end(), id);
  }
  bool is_member(idx_t id) const override { return Contains(id); }

 private:
  const absl::Span<const int64_t> ids_;
};

}  // namespace knnd

#endif  // KNND_FAISS_ID_FILTER_H_
