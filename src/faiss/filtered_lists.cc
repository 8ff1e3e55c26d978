#include "knnd/faiss/filtered_lists.h"

#include <faiss/invlists/InvertedLists.h>

#include "knnd/faiss/fastscan_kernel.h"

namespace knnd {
namespace {

constexpr int64_t kBlock = 32;

int64_t Blocks(int64_t rows) { return (rows + kBlock - 1) / kBlock; }

}  // namespace

int64_t FilteredLists::Bytes(int64_t nlist, size_t m2, int64_t matched) {
  return Blocks(matched) * kBlock * static_cast<int64_t>(m2) / 2 +
         static_cast<int64_t>(sizeof(int64_t)) * (matched + nlist + 1);
}

std::unique_ptr<const FilteredLists> FilteredLists::Build(
    const faiss::InvertedLists& lists, size_t m2, const RowBitmap& rows,
    int64_t first) {
  std::unique_ptr<FilteredLists> out(new FilteredLists());
  const int64_t nlist = static_cast<int64_t>(lists.nlist);
  const size_t block_bytes = 16 * m2;
  out->row_begin_.resize(static_cast<size_t>(nlist) + 1);
  // The admitted positions of every list first, so that the codes are
  // allocated once.
  std::vector<uint32_t> positions;
  for (int64_t l = 0; l < nlist; ++l) {
    out->row_begin_[l] = static_cast<int64_t>(out->ids_.size());
    const size_t n = lists.list_size(l);
    if (n == 0) continue;
    faiss::InvertedLists::ScopedIds ids(&lists, l);
    for (size_t j = 0; j < n; ++j) {
      if (rows.Test(ids[j] - first)) {
        positions.push_back(static_cast<uint32_t>(j));
        out->ids_.push_back(ids[j]);
      }
    }
  }
  const int64_t total = static_cast<int64_t>(out->ids_.size());
  out->row_begin_[nlist] = total;
  out->ids_.shrink_to_fit();
  out->codes_.assign(static_cast<size_t>(Blocks(total)) * block_bytes, 0);
  for (int64_t l = 0; l < nlist; ++l) {
    const int64_t begin = out->row_begin_[l], end = out->row_begin_[l + 1];
    if (begin == end) continue;
    faiss::InvertedLists::ScopedCodes codes(&lists, l);
    for (int64_t r = begin; r < end; ++r) {
      const uint32_t j = positions[static_cast<size_t>(r)];
      fastscan_kernel::CopyPackedCode(
          codes.get() + (j / kBlock) * block_bytes, j % kBlock,
          out->codes_.data() + static_cast<size_t>(r / kBlock) * block_bytes,
          static_cast<size_t>(r % kBlock), m2);
    }
  }
  return out;
}

int64_t FilteredLists::bytes() const {
  return static_cast<int64_t>(codes_.capacity() +
                              sizeof(int64_t) * (ids_.capacity() +
                                                 row_begin_.capacity()));
}

}  // namespace knnd
