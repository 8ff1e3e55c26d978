// FastScanIndex: one IVF-PQ FastScan index loaded from knnd's mappable
// layout (fastscan_format.h), its inverted lists mapped read-only and
// everything else on the heap. The FastScan half of FaissIndex
// (faiss_index.h), which routes a file with the FastScan magic here.
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

namespace faiss {
struct Index;
struct IndexIVFPQFastScan;
}  // namespace faiss

namespace knnd {

class FastScanIndex {
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

  ~FastScanIndex();
  FastScanIndex(const FastScanIndex&) = delete;
  FastScanIndex& operator=(const FastScanIndex&) = delete;

  const IndexFacts& facts() const { return facts_; }

  // The bytes BuildPrecomputedTable() would allocate: nlist * M * 16 floats
  // when codes are residuals of an L2 index (the table replaces per-query
  // residual tables), else 0.
  int64_t PlannedTableBytes() const;
  absl::Status BuildPrecomputedTable();

  absl::Status Search(int64_t n, const float* x,
                      const FastScanSearchParams& params, float* distances,
                      int64_t* labels) const {
    return searcher_->Search(n, x, params, distances, labels);
  }

  // The FAISS index, for reference searches in tests (never mutate it: every
  // searching thread shares it).
  const faiss::Index& faiss_index() const { return *index_; }

 private:
  FastScanIndex() = default;

  std::shared_ptr<const MappedFile> file_;
  std::unique_ptr<faiss::Index> index_;
  faiss::IndexIVFPQFastScan* ivf_ = nullptr;  // owned by index_
  std::unique_ptr<FastScanSearcher> searcher_;
  IndexFacts facts_;
};

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_INDEX_H_
