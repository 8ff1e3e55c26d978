// FastScanIndex: one IVF-PQ FastScan index loaded from knnd's mappable
// layout (fastscan_format.h), its inverted lists mapped read-only and
// everything else on the heap: the FastScan half of ServingIndex
// (serving_index.h), which opens a file with the FastScan magic here, and
// the index of `knnctl build`'s default recipe. Searched by knnd's own
// FastScanSearcher (fastscan_search.h), with nprobe and the id filter per
// call.
//
// Ownership: owns the mapping of the file and the faiss::Index read from its
// blob, whose inverted lists are a MappedBlockLists over the mapping (no
// heap copy of codes or ids: they stay file-backed page cache, paged in as
// searched). The mapping goes when the object is destroyed.
//
// Thread-safety: after BuildPrecomputedTable() (if called) the object is
// immutable; Search() is const and safe from any number of threads.
#ifndef KNND_FAISS_FASTSCAN_INDEX_H_
#define KNND_FAISS_FASTSCAN_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/faiss/fastscan_search.h"
#include "knnd/faiss/index_facts.h"
#include "knnd/faiss/mapped_file.h"
#include "knnd/faiss/serving_index.h"

namespace faiss {
struct Index;
struct IndexIVFPQFastScan;
}  // namespace faiss

namespace knnd {

class FastScanIndex final : public ServingIndex {
 public:
  // Maps `path` and validates it completely before anything is used: the
  // layout (ParseFastScanLayout), then the FAISS blob (an
  // IndexIVFPQFastScan, alone or under an IndexPreTransform, with empty
  // lists, whose nlist, code_size, ntotal, metric and dimension match the
  // header). DATA_LOSS "index file PATH is corrupt: ..." naming the field;
  // no exception escapes. The precomputed table FAISS's reader builds is
  // freed again (facts().read_peak_extra_bytes) until
  // BuildPrecomputedTable().
  static absl::StatusOr<std::unique_ptr<FastScanIndex>> Open(
      const std::string& path);

  ~FastScanIndex() override;

  // The bytes BuildPrecomputedTable() would allocate: nlist * M * 16 floats
  // when codes are residuals of an L2 index (the table replaces per-query
  // residual tables), else 0.
  int64_t PlannedTableBytes() const override;
  absl::Status BuildPrecomputedTable() override;
  absl::Status WritePart(const std::string& path, int64_t first_id,
                         int64_t end_id) const override;
  std::unique_ptr<const FilteredLists> FilterLists(
      const RowBitmap& rows, int64_t first) const override;

  // The searcher, for its own tests (empty filters, unpadded results).
  const FastScanSearcher& searcher() const { return *searcher_; }
  // The FAISS index, for reference searches in tests (never mutate it: every
  // searching thread shares it).
  const faiss::Index& faiss_index() const { return *index_; }

 private:
  FastScanIndex() = default;
  absl::Status SearchUnpadded(const SearchArgs& args) const override;
  const faiss::Index& root() const override { return *index_; }

  std::shared_ptr<const MappedFile> file_;
  std::unique_ptr<faiss::Index> index_;
  faiss::IndexIVFPQFastScan* ivf_ = nullptr;  // owned by index_
  std::unique_ptr<FastScanSearcher> searcher_;
};

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_INDEX_H_
