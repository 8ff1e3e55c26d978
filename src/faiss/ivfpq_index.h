// IvfPqIndex: a FAISS IVF-PQ file (any code size; optionally behind a
// pre-transform such as OPQ) opened for serving: read with IO_FLAG_MMAP |
// IO_FLAG_READ_ONLY, so its lists are an OnDiskInvertedLists over a mapping
// of the file (prefetch threads off), checked list by list against the
// file's size, and searched by FAISS with a per-call SearchParametersIVF.
// The FAISS half of ServingIndex (serving_index.h), which opens every file
// without knnd's FastScan magic here.
//
// Ownership: owns the faiss::Index read from the file and, through it, the
// mapping.
// Thread-safety: as ServingIndex.
#ifndef KNND_FAISS_IVFPQ_INDEX_H_
#define KNND_FAISS_IVFPQ_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "knnd/faiss/serving_index.h"

namespace faiss {
struct IndexIVFPQ;
struct IndexPreTransform;
struct SearchParametersIVF;
}  // namespace faiss

namespace knnd {

class IvfPqIndex final : public ServingIndex {
 public:
  // Reads and checks `path` (`file_bytes` long) without the precomputed
  // table. A FastScan index written by FAISS itself is INVALID_ARGUMENT
  // saying to convert it with `knnctl convert`.
  static absl::StatusOr<std::unique_ptr<IvfPqIndex>> Open(
      const std::string& path, int64_t file_bytes);
  ~IvfPqIndex() override;

  // FAISS 1.7.3's IndexIVFPQ::precompute_table(): a table only for residual
  // encoding with an L2 coarse quantizer, of nlist * M * ksub floats,
  // skipped above faiss::precomputed_table_max_bytes (and smaller for a
  // multi-index quantizer, counted here as the plain size).
  int64_t PlannedTableBytes() const override;
  absl::Status BuildPrecomputedTable() override;
  // INVALID_ARGUMENT: only FastScan indexes are split into shards.
  absl::Status WritePart(const std::string& path, int64_t first_id,
                         int64_t end_id) const override;

 private:
  IvfPqIndex();
  absl::Status SearchUnpadded(const SearchArgs& args) const override;
  // The search of `x` (args.queries after any pre-transform) with
  // `params` from its coarse assignment: for args.skip_probes and
  // args.probe_reference. Throws FAISS's errors.
  void SearchPreassigned(const SearchArgs& args, const float* x,
                         const faiss::SearchParametersIVF& params) const;
  const faiss::Index& root() const override { return *root_; }

  std::unique_ptr<faiss::Index> root_;
  const faiss::IndexPreTransform* pre_ = nullptr;  // null without transform
  faiss::IndexIVFPQ* ivfpq_ = nullptr;             // owned by root_
};

}  // namespace knnd

#endif  // KNND_FAISS_IVFPQ_INDEX_H_
