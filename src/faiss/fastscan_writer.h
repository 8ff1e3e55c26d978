// Writing an IVF-PQ FastScan index in knnd's mappable layout
// (fastscan_format.h). Internal to src/faiss/: the builder writes its index
// with it, and faiss_builder.h's ConvertFaissFileToFastScan a file FAISS
// wrote.
//
// The file is written at the path given, as is: callers write to a
// temporary name and commit it with storage/atomic_file.h, the one atomic
// writer.
//
// Thread-safety: the functions only read the index they are given; one
// writer per path.
#ifndef KNND_FAISS_FASTSCAN_WRITER_H_
#define KNND_FAISS_FASTSCAN_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace faiss {
struct Index;
}  // namespace faiss

namespace knnd {

// Writes `index` (an IndexIVFPQFastScan, optionally under a pre-transform,
// with FAISS's BlockInvertedLists or knnd's mapped lists) to `path`, which
// is created or truncated. INVALID_ARGUMENT naming the reason for an index
// knnd cannot serve as FastScan; PERMISSION_DENIED "cannot write PATH: ..."
// when the file cannot be written.
absl::Status WriteFastScanFile(const faiss::Index& index,
                               const std::string& path);

// Ids first_id <= id < end_id: the part of an index one shard holds.
struct IdRange {
  int64_t first_id = 0;
  int64_t end_id = 0;
  bool Contains(int64_t id) const { return id >= first_id && id < end_id; }
};

// Writes the part of `index` whose ids lie in `range` (a shard): the same
// coarse quantizer, product quantizer and pre-transform, every inverted
// list keeping only the vectors of the range, in their order, their 4-bit
// codes repacked into fresh 32-vector blocks. The file's ntotal is the
// part's. Errors as WriteFastScanFile.
absl::Status WriteFastScanFilePart(const faiss::Index& index,
                                   const std::string& path, IdRange range);

// Writes a new version of `base` (a knnd FastScan index whose ids are
// rows, its lists mapped or on the heap): every list keeps the vectors
// whose id `i` has new_id_of[i] >= 0, relabelled to it, in their order
// (an id outside new_id_of is dropped), then holds the vectors of
// `appended` (EmptyFastScanCopy(base) with vectors added under their new
// ids) in theirs. No training and no re-encoding of kept vectors: the
// codes are moved. Errors as WriteFastScanFile; INVALID_ARGUMENT when
// `appended` has other lists or codes.
absl::Status WriteFastScanFileUpdate(const faiss::Index& base,
                                     absl::Span<const int64_t> new_id_of,
                                     const faiss::Index& appended,
                                     const std::string& path);

// A trained copy of `index` (an IndexIVFPQFastScan, optionally under a
// pre-transform) with empty FAISS BlockInvertedLists, ready to encode new
// vectors with the same quantizers; null when `index` is not one.
std::unique_ptr<faiss::Index> EmptyFastScanCopy(const faiss::Index& index);

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_WRITER_H_
