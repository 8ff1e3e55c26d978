// How well an IVF-PQ index's trained quantizers fit some vectors: the mean
// squared distance to the nearest coarse centroid and the mean squared
// error of the PQ reconstruction. knnctl build records it for the corpus
// it trained on, knnctl update measures it for its base and its delta
// (index/update_drift.h): new data unlike the old lands far from the
// centroids and is encoded worse. Internal to src/faiss/ and its callers
// through FaissBuilder and FastScanUpdate.
//
// Thread-safety: pure function over an index nobody modifies meanwhile.
#ifndef KNND_FAISS_QUANTIZATION_ERROR_H_
#define KNND_FAISS_QUANTIZATION_ERROR_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnd {

struct QuantizationError {
  double coarse = 0;
  double pq = 0;
};

// Means over `n` vectors (dim floats each, normalised for cosine) of the
// squared distance to the nearest coarse centroid and of the squared error
// of the PQ reconstruction of what the index encodes (the residual, or the
// vector itself), after the pre-transform if any. `root`: an IVF-PQ or
// IVF-PQ FastScan index, trained, under at most one IndexPreTransform.
// Zeros for n <= 0; INVALID_ARGUMENT for another index; INTERNAL on a
// FAISS error.
absl::StatusOr<QuantizationError> MeasureQuantizationError(
    const faiss::Index& root, const float* vectors, int64_t n);

}  // namespace knnd

#endif  // KNND_FAISS_QUANTIZATION_ERROR_H_
