// FaissBuilder: an empty FAISS index made from a factory string, trained,
// filled and written to a file. The FAISS half of index/index_builder.h,
// which adds the defaults, normalisation, checks and sidecar. IVF-PQ is
// written by FAISS's writer; IVF-PQ FastScan ("IVF256,PQ98x4fs", optionally
// behind a pre-transform) in knnd's mappable FastScan layout
// (fastscan_format.h).
//
// Thread-safety: used by one thread at a time (FAISS itself may use all
// cores inside Train and Add).
#ifndef KNND_FAISS_FAISS_BUILDER_H_
#define KNND_FAISS_FAISS_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/base/metric.h"
#include "knnd/faiss/quantization_error.h"

namespace knnd {

class FaissBuilder {
 public:
  // `metric` kL2 or kInnerProduct (cosine is inner product over vectors the
  // caller normalised). INVALID_ARGUMENT, saying why, for a factory string
  // FAISS cannot parse or whose index knnd cannot serve.
  static absl::StatusOr<std::unique_ptr<FaissBuilder>> Create(
      int dim, const std::string& factory, Metric metric, uint32_t seed);

  ~FaissBuilder();
  FaissBuilder(const FaissBuilder&) = delete;
  FaissBuilder& operator=(const FaissBuilder&) = delete;

  int64_t nlist() const;
  int pq_m() const;
  int pq_nbits() const;
  int64_t ntotal() const;
  // Bytes per vector in the inverted lists: its code and its 8-byte id.
  int64_t list_bytes_per_vector() const;
  // Heap bytes the inverted lists hold now: their capacity, which FAISS
  // grows ahead of their content.
  int64_t HeldListBytes() const;

  // The vectors in each list.
  std::vector<int64_t> ListSizes() const;

  absl::Status Train(const float* vectors, int64_t rows);
  // The quantization error of `rows` vectors under the trained quantizers
  // (quantization_error.h).
  absl::StatusOr<QuantizationError> MeasureError(const float* vectors,
                                                 int64_t rows) const;
  // `ids` (rows entries) or null for sequential ids from ntotal().
  absl::Status Add(const float* vectors, int64_t rows, const int64_t* ids);
  // Writes the index, with `nprobe` as its stored default, to `path` as
  // is (the caller writes to a temporary name and commits it with
  // storage/atomic_file.h). PERMISSION_DENIED "cannot write PATH: ..." when
  // the file cannot be written.
  absl::Status WriteTo(const std::string& path, int nprobe) const;
  // Writes only the vectors whose ids lie in [first_id, end_id): one shard
  // sharing this index's quantizers (fastscan_writer.h). INVALID_ARGUMENT
  // for an 8-bit IVF-PQ index: only FastScan indexes are split.
  absl::Status WritePartTo(const std::string& path, int nprobe,
                           int64_t first_id, int64_t end_id) const;

  struct Objects;  // defined in faiss_builder.cc

 private:
  explicit FaissBuilder(std::unique_ptr<Objects> objects);
  std::unique_ptr<Objects> objects_;
};

// Reads `faiss_path`, an IVF-PQ FastScan index written by FAISS
// (faiss.write_index: lists on the heap), and writes it to `out_path` as is
// in knnd's mappable FastScan layout (the caller commits it). NOT_FOUND or
// INVALID_ARGUMENT naming `faiss_path` when it cannot be read or is not a
// FastScan index knnd serves.
absl::Status ConvertFaissFileToFastScan(const std::string& faiss_path,
                                        const std::string& out_path);

}  // namespace knnd

#endif  // KNND_FAISS_FAISS_BUILDER_H_
