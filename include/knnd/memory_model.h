// The anonymous-memory cost model of a search request (shared/DESIGN.md,
// "Memory model"). The AdmissionGate charges each request this estimate, so
// that the bytes admitted at once stay within max_inflight_bytes.
//
// Thread-safety: pure functions.
#ifndef KNND_MEMORY_MODEL_H_
#define KNND_MEMORY_MODEL_H_

#include <cstdint>

#include "knnd/index_snapshot.h"

namespace knnd {

struct SearchShape {
  int64_t num_queries = 0;
  int k = 0;
  int nprobe = 0;
  int64_t filter_ids = 0;
  int refine_factor = 0;
};

// Upper estimate, in bytes, of the heap a request holds while admitted:
//   request vectors            nq * d * 4 (plus a transformed copy with OPQ)
//   response ids + distances   nq * k * (8 + 4), in the message
//   FAISS result heap          nq * k * 12 while a unit runs
//   coarse assignment          nq * nprobe * (8 + 4)
//   per-thread PQ tables       2 * M * 2^nbits * 4 + 2 * d * 4
//   allow-list                 filter_ids * 8 * 2 (message + sorted copy)
//   re-ranking candidates      nq * refine_factor * k * (8 + 4)
int64_t EstimateSearchBytes(const IndexInfo& index, const SearchShape& shape);

}  // namespace knnd

#endif  // KNND_MEMORY_MODEL_H_
