#include "knnd/faiss/ivfpq_checks.h"

#include <cstring>

#include <faiss/invlists/OnDiskInvertedLists.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "knnd/faiss/faiss_types.h"

namespace knnd {
namespace {

using idx_t = faiss::Index::idx_t;
using faiss_types::CorruptIndexFile;
using faiss_types::TypeOf;

// The byte FAISS's reader copied from the file into a bool field: a corrupt
// file can leave any value there, and reading it as a bool is undefined.
int FileBoolByte(const bool& field) {
  unsigned char byte;
  std::memcpy(&byte, &field, 1);
  return byte;
}

// The same for an enum field: FAISS's reader copies any 32-bit value from the
// file into a faiss::MetricType, and loading one outside the enum's range is
// undefined, so it is compared as an int before it is used as a metric.
int32_t FileEnumValue(const faiss::MetricType& field) {
  static_assert(sizeof(field) == sizeof(int32_t));
  int32_t value;
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

bool IsServedMetric(int32_t metric) {
  return metric == faiss::METRIC_L2 || metric == faiss::METRIC_INNER_PRODUCT;
}

}  // namespace

absl::Status CheckIvfPqStructure(const std::string& path, int64_t file_bytes,
                                 const faiss::IndexIVFPQ& ivf, int d_in) {
  const faiss::ProductQuantizer& pq = ivf.pq;
  const int trained = FileBoolByte(ivf.is_trained);
  const int by_residual = FileBoolByte(ivf.by_residual);
  if (trained > 1 || by_residual > 1) {
    return CorruptIndexFile(path, absl::StrFormat(
                             "its flags is_trained=%d, by_residual=%d are not "
                             "0 or 1",
                             trained, by_residual));
  }
  if (trained == 0) return CorruptIndexFile(path, "the index is not trained");
  if (ivf.d <= 0 || d_in <= 0) {
    return CorruptIndexFile(path, absl::StrCat("dimension ", ivf.d));
  }
  const int32_t metric = FileEnumValue(ivf.metric_type);
  if (!IsServedMetric(metric)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " uses FAISS metric ", metric,
        "; knnd serves L2 and inner-product indexes only"));
  }
  if (ivf.quantizer != nullptr) {
    const int32_t quantizer_metric = FileEnumValue(ivf.quantizer->metric_type);
    if (!IsServedMetric(quantizer_metric)) {
      return CorruptIndexFile(path, absl::StrCat("its coarse quantizer's metric is ",
                                        quantizer_metric,
                                        ", not L2 (1) or inner product (0)"));
    }
  }
  if (ivf.quantizer == nullptr || ivf.quantizer->d != ivf.d ||
      ivf.quantizer->ntotal != static_cast<idx_t>(ivf.nlist)) {
    return CorruptIndexFile(path, absl::StrFormat(
                             "the coarse quantizer (%s, d=%d, ntotal=%d) does "
                             "not match nlist=%d, d=%d",
                             TypeOf(ivf.quantizer),
                             ivf.quantizer ? ivf.quantizer->d : 0,
                             ivf.quantizer ? ivf.quantizer->ntotal : 0,
                             ivf.nlist, ivf.d));
  }
  if (pq.M == 0 || pq.d != static_cast<size_t>(ivf.d) || pq.d % pq.M != 0 ||
      pq.nbits == 0 || pq.nbits > 16 || pq.code_size != ivf.code_size ||
      pq.centroids.size() != pq.d * pq.ksub) {
    return CorruptIndexFile(path, absl::StrFormat(
                             "product quantizer d=%d M=%d nbits=%d "
                             "code_size=%d does not fit index d=%d code_size=%d",
                             pq.d, pq.M, pq.nbits, pq.code_size, ivf.d,
                             ivf.code_size));
  }
  const faiss::InvertedLists* lists = ivf.invlists;
  if (lists == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " has no inverted lists (saved without data)"));
  }
  auto* ondisk = dynamic_cast<const faiss::OnDiskInvertedLists*>(lists);
  if (ondisk == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index file ", path, " has inverted lists of type ", TypeOf(lists),
        ", which cannot be memory-mapped"));
  }
  if (lists->nlist != ivf.nlist || lists->code_size != ivf.code_size) {
    return CorruptIndexFile(path, absl::StrFormat(
                             "inverted lists nlist=%d code_size=%d differ from "
                             "the index's nlist=%d code_size=%d",
                             lists->nlist, lists->code_size, ivf.nlist,
                             ivf.code_size));
  }
  if (ondisk->ptr == nullptr ||
      ondisk->totsize != static_cast<size_t>(file_bytes)) {
    return CorruptIndexFile(path, "its inverted lists are not mapped from the file");
  }
  const size_t entry_bytes = sizeof(idx_t) + ivf.code_size;
  size_t total_entries = 0;
  for (size_t i = 0; i < ondisk->lists.size(); ++i) {
    const auto& list = ondisk->lists[i];
    const size_t size = list.size;
    if (list.offset > ondisk->totsize ||
        size > (ondisk->totsize - list.offset) / entry_bytes ||
        list.capacity < size) {
      return CorruptIndexFile(
          path, absl::StrFormat(
                    "inverted list %d (offset %d, %d entries of %d bytes) "
                    "ends past the end of the file (%d bytes); the file is "
                    "truncated or was overwritten",
                    i, list.offset, size, entry_bytes, ondisk->totsize));
    }
    total_entries += size;
  }
  if (total_entries != static_cast<size_t>(ivf.ntotal)) {
    return CorruptIndexFile(path, absl::StrFormat(
                             "inverted lists hold %d vectors but the header "
                             "says ntotal=%d",
                             total_entries, ivf.ntotal));
  }
  return absl::OkStatus();
}

}  // namespace knnd
