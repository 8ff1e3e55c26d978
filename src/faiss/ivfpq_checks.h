// The structural checks FAISS 1.7.3's reader does not make on an IVF-PQ
// index read with its lists memory-mapped. Internal to src/faiss/.
#ifndef KNND_FAISS_IVFPQ_CHECKS_H_
#define KNND_FAISS_IVFPQ_CHECKS_H_

#include <cstdint>
#include <string>

#include <faiss/IndexIVFPQ.h>

#include "absl/status/status.h"

namespace knnd {

// Checks flags, metric, quantizer, product quantizer and, above all, that
// every memory-mapped inverted list lies inside the file: FAISS computes
// list offsets from sizes stored in the file, and a truncated or corrupt
// file would otherwise crash the first search that touches a list past its
// end. `d_in` is the dimension queries arrive with (before any transform).
absl::Status CheckIvfPqStructure(const std::string& path, int64_t file_bytes,
                                 const faiss::IndexIVFPQ& ivf, int d_in);

}  // namespace knnd

#endif  // KNND_FAISS_IVFPQ_CHECKS_H_
