// FastScanUpdate: the FAISS half of a new index version made from an old
// one without training (index/index_update.h, `knnctl update`): a knnd
// FastScan file opened with its lists mapped, new vectors encoded with its
// trained coarse quantizer and PQ, the quantization error of any vectors
// under those quantizers (how far new data has drifted from what they were
// trained on), and the new version's file written with the kept vectors'
// codes moved, not re-encoded (fastscan_writer.h).
//
// Ownership: owns the opened base (its mapping) and the index the new
// vectors are encoded into. Thread-safety: used by one thread at a time
// (FAISS may use all cores inside Add and MeasureError).
#ifndef KNND_FAISS_FASTSCAN_UPDATE_H_
#define KNND_FAISS_FASTSCAN_UPDATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "knnd/faiss/quantization_error.h"

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnd {

class FastScanIndex;

class FastScanUpdate {
 public:
  // Opens `base_path` as FastScanIndex::Open does (its errors);
  // INVALID_ARGUMENT naming the file for a FAISS IVF-PQ (8-bit) file: only
  // FastScan indexes are updated.
  static absl::StatusOr<std::unique_ptr<FastScanUpdate>> Open(
      const std::string& base_path);

  ~FastScanUpdate();
  FastScanUpdate(const FastScanUpdate&) = delete;
  FastScanUpdate& operator=(const FastScanUpdate&) = delete;

  // Encodes `n` vectors (dim floats each, already normalised for cosine)
  // under `ids`, their rows in the new version.
  absl::Status Add(const float* vectors, int64_t n, const int64_t* ids);

  // The quantization error of `n` vectors under the base's quantizers
  // (quantization_error.h).
  using QuantizationError = ::knnd::QuantizationError;
  absl::StatusOr<QuantizationError> MeasureError(const float* vectors,
                                                 int64_t n) const;

  // The vectors per list of the base, and of the version Write() writes.
  std::vector<int64_t> BaseListSizes() const;
  std::vector<int64_t> NewListSizes(
      absl::Span<const int64_t> new_row_of_base) const;

  // Writes the new version to `path` (the caller commits it): the base's
  // vectors whose row i has new_row_of_base[i] >= 0 under that row, then
  // those added.
  absl::Status Write(absl::Span<const int64_t> new_row_of_base,
                     const std::string& path) const;

 private:
  FastScanUpdate(std::unique_ptr<FastScanIndex> base,
                 std::unique_ptr<faiss::Index> added);

  std::unique_ptr<FastScanIndex> base_;
  std::unique_ptr<faiss::Index> added_;  // same quantizers, new vectors
};

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_UPDATE_H_
