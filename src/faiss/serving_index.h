// ServingIndex: one index file opened for serving, with its inverted lists
// memory-mapped read-only: the lists stay in the shared, reclaimable page
// cache and only the coarse centroids, the PQ codebooks, any pre-transform
// and the optional precomputed table live on the heap. Two kinds, one
// implementation each, chosen by Open() from the file's first bytes:
//   - FastScanIndex (fastscan_index.h): knnd's mappable 4-bit FastScan
//     layout (fastscan_format.h), `knnctl build`'s default recipe, searched
//     by knnd's own FastScanSearcher (fastscan_search.h) over FAISS's
//     kernels, with nprobe and the id filter per call;
//   - IvfPqIndex (ivfpq_index.h): a FAISS IVF-PQ file (8-bit or other
//     codes), read with IO_FLAG_MMAP | IO_FLAG_READ_ONLY and searched by
//     FAISS with a per-call SearchParametersIVF.
//
// Open() checks what FAISS's reader does not (every mapped list inside the
// file, sizes that agree with each other, a metric knnd serves) so that a
// truncated or corrupt file is an error, not a crash in the first search.
// FAISS types and exceptions never leave src/faiss/.
//
// Ownership: an implementation owns its FAISS objects and, through them,
// the mapping.
// Thread-safety: after BuildPrecomputedTable() (if called) the object is
// immutable; Search() is const and safe from any number of threads, with
// every per-call parameter (nprobe, the id filter) in the call.
#ifndef KNND_FAISS_SERVING_INDEX_H_
#define KNND_FAISS_SERVING_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/base/metric.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/filtered_lists.h"
#include "knnd/faiss/index_facts.h"
#include "knnd/faiss/search_args.h"

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnd {

// Heap bytes of an IVF-PQ precomputed table: nlist * M * 2^nbits floats.
int64_t PrecomputedTableBytes(int64_t nlist, int pq_m, int pq_nbits);

class ServingIndex {
 public:
  // Reads and checks `path` without building the precomputed table (so
  // that a caller can check the planned heap first). A missing, truncated,
  // corrupt or unsupported file is an error whose message names the file
  // and what is wrong: DATA_LOSS for damaged bytes, INVALID_ARGUMENT for an
  // index knnd does not serve (a FastScan file written by FAISS itself says
  // to convert it with `knnctl convert`).
  static absl::StatusOr<std::unique_ptr<ServingIndex>> Open(
      const std::string& path);

  virtual ~ServingIndex() = default;
  ServingIndex(const ServingIndex&) = delete;
  ServingIndex& operator=(const ServingIndex&) = delete;

  const IndexFacts& facts() const { return facts_; }

  // The heap bytes BuildPrecomputedTable() would allocate (0 when this
  // index would build none or not use it).
  virtual int64_t PlannedTableBytes() const = 0;
  // Builds the precomputed table, before the index is shared between
  // threads; updates facts().
  virtual absl::Status BuildPrecomputedTable() = 0;

  // k-NN search on the raw index (no query normalisation), reading the
  // queries, num_queries, k, nprobe, allowed_ids, distances and ids of
  // `args` (the re-ranking fields are IndexSnapshot's). Results of each
  // query are closest first; missing neighbours are id -1 with distance
  // MissingDistance(metric): +inf (L2) or -inf (inner product). With
  // allowed_ids, the best k allowed ids of the probed lists. A FAISS error
  // is INTERNAL.
  absl::Status Search(const SearchArgs& args) const;

  // This index's lists cut down to the list ids l with rows.Test(l -
  // first) (filtered_lists.h), for SearchArgs::allowed_lists; null where
  // the index's scan cannot use them (a FAISS IVF-PQ file).
  virtual std::unique_ptr<const FilteredLists> FilterLists(
      const RowBitmap& rows, int64_t first) const {
    return nullptr;
  }

  // Every id the index holds, ascending (ntotal int64s on the heap).
  std::vector<int64_t> SortedIds() const;

  // Writes the vectors whose ids lie in [first_id, end_id) as a knnd
  // FastScan file at `path` (created or truncated; the caller commits it):
  // one shard of this index, sharing its quantizers (fastscan_writer.h).
  // INVALID_ARGUMENT for a FAISS IVF-PQ file: only FastScan indexes split.
  virtual absl::Status WritePart(const std::string& path, int64_t first_id,
                                 int64_t end_id) const = 0;

 protected:
  ServingIndex() = default;

  // Search() before missing neighbours' distances are set.
  virtual absl::Status SearchUnpadded(const SearchArgs& args) const = 0;
  // The whole FAISS index (any pre-transform on top of the IVF index).
  virtual const faiss::Index& root() const = 0;

  IndexFacts facts_;
};

}  // namespace knnd

#endif  // KNND_FAISS_SERVING_INDEX_H_
