// IndexFacts: what an index file itself says about the index it holds, for
// both kinds knnd serves (a FAISS IVF-PQ file with its lists mapped, and
// knnd's FastScan layout, fastscan_format.h). Filled by ServingIndex::Open().
#ifndef KNND_FAISS_INDEX_FACTS_H_
#define KNND_FAISS_INDEX_FACTS_H_

#include <cstdint>
#include <string>

#include "knnd/base/metric.h"

namespace knnd {

struct IndexFacts {
  std::string path;
  int64_t file_bytes = 0;
  // In factory terms, with any pre-transform first: "LT128_128,IVF1024,PQ32",
  // "IVF256,PQ98x4fs" ("x4fsr" when FastScan encodes residuals).
  std::string index_type;
  bool has_pretransform = false;  // OPQ, PCA ... applied to queries first
  // A knnd FastScan file (4-bit codes in 32-vector blocks, searched by
  // fastscan_search.h) rather than a FAISS IVF-PQ file.
  bool fastscan = false;
  int dim = 0;
  // The IVF index's dimension: dim after any pre-transform.
  int ivf_dim = 0;
  // kL2 or kInnerProduct (cosine is known only from the sidecar).
  Metric metric = Metric::kL2;
  int64_t ntotal = 0;
  int64_t nlist = 0;
  int pq_m = 0;
  int pq_nbits = 0;  // 8 (or as built) for IVF-PQ, 4 for FastScan
  // Bytes of one vector's code; for FastScan the bytes per vector inside a
  // 32-vector block, ceil(pq_m / 2).
  int64_t code_size_bytes = 0;
  bool by_residual = false;  // codes encode the residual to the centroid
  int stored_nprobe = 1;  // the nprobe saved in the file
  // Heap memory of the index: coarse centroids + PQ codebooks + pre-transform
  // matrices + precomputed table (reported separately as well).
  int64_t heap_bytes = 0;
  int64_t precomputed_table_bytes = 0;
  // Heap that reading the file held and freed again before Open() returned,
  // beyond heap_bytes without the table: FAISS 1.7.3's reader builds the
  // precomputed table of every FastScan index with an L2 quantizer, which
  // knnd then frees until BuildPrecomputedTable(). 0 for IVF-PQ files.
  int64_t read_peak_extra_bytes = 0;
  // Bytes of the file holding inverted lists, memory-mapped: codes + ids,
  // and for FastScan the padding of each list's last block and alignment.
  int64_t mapped_list_bytes = 0;
};

}  // namespace knnd

#endif  // KNND_FAISS_INDEX_FACTS_H_
