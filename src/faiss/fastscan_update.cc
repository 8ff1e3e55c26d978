#include "knnd/faiss/fastscan_update.h"

#include <algorithm>
#include <vector>

#include <faiss/IndexIVFPQFastScan.h>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/faiss_types.h"
#include "knnd/faiss/fastscan_checks.h"
#include "knnd/faiss/fastscan_index.h"
#include "knnd/faiss/fastscan_writer.h"
#include "knnd/faiss/serving_index.h"

namespace knnd {
namespace {

using faiss_types::CatchFaiss;

const faiss::IndexIVFPQFastScan& IvfOf(const faiss::Index& index) {
  FastScanParts parts;
  CheckFastScanIndex(index, parts);  // checked when opened
  return *parts.ivf;
}

}  // namespace

FastScanUpdate::FastScanUpdate(std::unique_ptr<FastScanIndex> base,
                               std::unique_ptr<faiss::Index> added)
    : base_(std::move(base)), added_(std::move(added)) {}

FastScanUpdate::~FastScanUpdate() = default;

absl::StatusOr<std::unique_ptr<FastScanUpdate>> FastScanUpdate::Open(
    const std::string& base_path) {
  absl::StatusOr<std::unique_ptr<ServingIndex>> opened =
      ServingIndex::Open(base_path);
  if (!opened.ok()) return opened.status();
  if (dynamic_cast<FastScanIndex*>(opened->get()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        base_path,
        " is a FAISS IVF-PQ index; only knnd FastScan indexes "
        "(knnctl build's default recipe) are updated: rebuild it"));
  }
  std::unique_ptr<FastScanIndex> base(
      static_cast<FastScanIndex*>(opened->release()));
  std::unique_ptr<faiss::Index> added = EmptyFastScanCopy(base->faiss_index());
  if (added == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot copy the quantizers of ", base_path));
  }
  return std::unique_ptr<FastScanUpdate>(
      new FastScanUpdate(std::move(base), std::move(added)));
}

absl::Status FastScanUpdate::Add(const float* vectors, int64_t n,
                                 const int64_t* ids) {
  return CatchFaiss(absl::StatusCode::kInternal,
                    absl::StrCat("encoding ", n, " vectors failed"),
                    [&] { added_->add_with_ids(n, vectors, ids); });
}

absl::StatusOr<FastScanUpdate::QuantizationError> FastScanUpdate::MeasureError(
    const float* vectors, int64_t n) const {
  return MeasureQuantizationError(*added_, vectors, n);
}

std::vector<int64_t> FastScanUpdate::BaseListSizes() const {
  const faiss::IndexIVFPQFastScan& ivf = IvfOf(base_->faiss_index());
  std::vector<int64_t> sizes(ivf.nlist);
  for (size_t l = 0; l < ivf.nlist; ++l) {
    sizes[l] = static_cast<int64_t>(ivf.invlists->list_size(l));
  }
  return sizes;
}

std::vector<int64_t> FastScanUpdate::NewListSizes(
    absl::Span<const int64_t> new_row_of_base) const {
  const faiss::IndexIVFPQFastScan& base = IvfOf(base_->faiss_index());
  const faiss::IndexIVFPQFastScan& added = IvfOf(*added_);
  std::vector<int64_t> sizes(base.nlist);
  for (size_t l = 0; l < base.nlist; ++l) {
    const size_t n = base.invlists->list_size(l);
    const faiss::Index::idx_t* ids =
        n > 0 ? base.invlists->get_ids(l) : nullptr;
    for (size_t i = 0; i < n; ++i) {
      const int64_t row = ids[i];
      if (row >= 0 && row < static_cast<int64_t>(new_row_of_base.size()) &&
          new_row_of_base[row] >= 0) {
        ++sizes[l];
      }
    }
    sizes[l] += static_cast<int64_t>(added.invlists->list_size(l));
  }
  return sizes;
}

absl::Status FastScanUpdate::Write(absl::Span<const int64_t> new_row_of_base,
                                   const std::string& path) const {
  return WriteFastScanFileUpdate(base_->faiss_index(), new_row_of_base, *added_,
                                 path);
}

}  // namespace knnd
