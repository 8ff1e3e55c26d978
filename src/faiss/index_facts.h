// IndexFacts: what an index file itself says about the index it holds.
// Filled by FaissIndex::Open().
#ifndef KNND_FAISS_INDEX_FACTS_H_
#define KNND_FAISS_INDEX_FACTS_H_

#include <cstdint>
#include <string>

#include "knnd/base/metric.h"

namespace knnd {

struct IndexFacts {
  std::string path;
  int64_t file_bytes = 0;
  std::string index_type;  // e.g. "LT128_128,IVF1024,PQ32" in factory terms
  bool has_pretransform = false;  // OPQ, PCA ... applied to queries first
  int dim = 0;
  // kL2 or kInnerProduct (cosine is known only from the sidecar).
  Metric metric = Metric::kL2;
  int64_t ntotal = 0;
  int64_t nlist = 0;
  int pq_m = 0;
  int pq_nbits = 0;
  int64_t code_size_bytes = 0;
  int stored_nprobe = 1;  // the nprobe saved in the file
  // Heap memory of the index: coarse centroids + PQ codebooks + pre-transform
  // matrices + precomputed table (reported separately as well).
  int64_t heap_bytes = 0;
  int64_t precomputed_table_bytes = 0;
  // Bytes of the file holding inverted lists (codes + ids), memory-mapped.
  int64_t mapped_list_bytes = 0;
};

}  // namespace knnd

#endif  // KNND_FAISS_INDEX_FACTS_H_
