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
#include <string>

#include "absl/status/status.h"

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

}  // namespace knnd

#endif  // KNND_FAISS_FASTSCAN_WRITER_H_
