// FaissIndex: one index file opened for serving, with its inverted lists
// memory-mapped read-only: the lists stay in the shared, reclaimable page
// cache and only the coarse centroids, the PQ codebooks, any pre-transform
// and the optional precomputed table live on the heap. Two kinds of file,
// behind one interface:
//   - a FAISS IVF-PQ file, read with IO_FLAG_MMAP | IO_FLAG_READ_ONLY and
//     searched by FAISS with per-call SearchParametersIVF;
//   - a knnd FastScan file (4-bit IVF-PQ FastScan in knnd's layout,
//     fastscan_format.h), told by its magic, loaded by fastscan_index.h and
//     searched by fastscan_search.h.
//
// Open() checks what FAISS's reader does not (every mapped list inside the
// file, sizes that agree with each other, a metric knnd serves) so that a
// truncated or corrupt file is an error, not a crash in the first search.
// FAISS types and exceptions never leave src/faiss/.
//
// Ownership: owns the FAISS objects and, through them, the mapping.
// Thread-safety: after BuildPrecomputedTable() (if called) the object is
// immutable; Search() is const and safe from any number of threads, with
// every per-call parameter (nprobe, the id filter) in the call.
#ifndef KNND_FAISS_FAISS_INDEX_H_
#define KNND_FAISS_FAISS_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/base/metric.h"
#include "knnd/faiss/index_facts.h"

namespace knnd {

// One search call. Buffers are owned by the caller and hold num_queries * k
// entries; queries are num_queries * dim floats, row-major.
struct FaissSearchArgs {
  const float* queries = nullptr;
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 1;
  // Sorted ascending; empty means no filter.
  absl::Span<const int64_t> allowed_ids;
  float* distances = nullptr;
  int64_t* ids = nullptr;
};

// Heap bytes of an IVF-PQ precomputed table: nlist * M * 2^nbits floats.
int64_t PrecomputedTableBytes(int64_t nlist, int pq_m, int pq_nbits);

class FaissIndex {
 public:
  // Reads and checks `path` without building the precomputed table (so
  // that a caller can check the planned heap first). A missing, truncated,
  // corrupt or unsupported file is an error whose message names the file
  // and what is wrong: DATA_LOSS for damaged bytes, INVALID_ARGUMENT for an
  // index knnd does not serve (a FastScan file written by FAISS itself says
  // to convert it with `knnctl convert`).
  static absl::StatusOr<std::unique_ptr<FaissIndex>> Open(
      const std::string& path);

  ~FaissIndex();
  FaissIndex(const FaissIndex&) = delete;
  FaissIndex& operator=(const FaissIndex&) = delete;

  const IndexFacts& facts() const { return facts_; }

  // The heap bytes BuildPrecomputedTable() would allocate (0 when FAISS
  // would build none for this index, or a FastScan index would not use it).
  int64_t PlannedTableBytes() const;
  // Builds the precomputed table (nlist * M * 2^nbits floats), before the
  // index is shared between threads; updates facts().
  absl::Status BuildPrecomputedTable();

  // k-NN search on the raw index (no query normalisation). Results of each
  // query are closest first; missing neighbours are id -1 with distance
  // MissingDistance(metric): +inf (L2) or -inf (inner product). With
  // allowed_ids, the best k allowed ids of the probed lists. A FAISS error
  // is INTERNAL.
  absl::Status Search(const FaissSearchArgs& args) const;

  // Every id the index holds, ascending (ntotal int64s on the heap).
  std::vector<int64_t> SortedIds() const;

  // Writes the vectors whose ids lie in [first_id, end_id) as a knnd
  // FastScan file at `path` (created or truncated; the caller commits it):
  // one shard of this index, sharing its quantizers (fastscan_writer.h).
  // INVALID_ARGUMENT for a FAISS IVF-PQ file: only FastScan indexes split.
  absl::Status WritePart(const std::string& path, int64_t first_id,
                         int64_t end_id) const;

  struct Objects;  // the FAISS objects; defined in faiss_index.cc

 private:
  FaissIndex(std::unique_ptr<Objects> objects, IndexFacts facts);

  std::unique_ptr<Objects> objects_;
  IndexFacts facts_;
};

}  // namespace knnd

#endif  // KNND_FAISS_FAISS_INDEX_H_
