// FilteredLists: the inverted lists of a FastScan index cut down to the rows
// one attribute filter admits: their 4-bit codes, list after list, repacked
// into dense 32-vector blocks (fastscan_kernel.h's layout, a list's rows
// starting anywhere in a block), with their list ids and where each list's
// rows begin. Built once for a filter the snapshot keeps
// (index/filter_cache.h) and admitting few rows; a search carrying it
// (SearchArgs::allowed_lists) reads only these codes: the IVF scan the
// rows of each probed list, instead of every code of the list and a bitmap
// test per candidate, or, where codes are not residuals (one table per
// query), every row at once without the coarse search (the flat plan,
// index/filter_planner.h).
//
// A list's admitted vectors keep their order, so a scan of the filtered
// list returns what the filtered scan of the whole list returns, ids and
// distances and ties alike (fastscan_search.h).
//
// Ownership: owns its heap copy (bytes()); nothing borrowed once built.
// Thread-safety: immutable after Build; any number of threads may read it.
#ifndef KNND_FAISS_FILTERED_LISTS_H_
#define KNND_FAISS_FILTERED_LISTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "knnd/base/row_bitmap.h"

namespace faiss {
struct InvertedLists;
}  // namespace faiss

namespace knnd {

class FilteredLists {
 public:
  // The lists of `lists` (FastScan: blocks of 32 codes of 16 * m2 bytes)
  // cut down to the list ids l with rows.Test(l - first).
  static std::unique_ptr<const FilteredLists> Build(
      const faiss::InvertedLists& lists, size_t m2, const RowBitmap& rows,
      int64_t first);

  // The heap bytes Build allocates for `matched` admitted rows over
  // `nlist` lists with m2 sub-quantizers per code: what a caller checks
  // before building.
  static int64_t Bytes(int64_t nlist, size_t m2, int64_t matched);

  int64_t nlist() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  // The rows of `list`: [begin(list), begin(list) + size(list)).
  int64_t begin(int64_t list) const { return row_begin_[list]; }
  size_t size(int64_t list) const {
    return static_cast<size_t>(row_begin_[list + 1] - row_begin_[list]);
  }
  // Every row's code (row r: vector r % 32 of block r / 32) and list id.
  const uint8_t* codes() const { return codes_.data(); }
  const int64_t* ids() const { return ids_.data(); }
  // Admitted vectors in all lists.
  int64_t rows() const { return static_cast<int64_t>(ids_.size()); }
  // Heap bytes held (codes, ids and offsets).
  int64_t bytes() const;

 private:
  FilteredLists() = default;

  std::vector<int64_t> row_begin_;  // nlist + 1, into ids_
  std::vector<uint8_t> codes_;
  std::vector<int64_t> ids_;
};

}  // namespace knnd

#endif  // KNND_FAISS_FILTERED_LISTS_H_
