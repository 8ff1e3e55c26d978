// Reads the rows of a raw-vectors file (vectors_file.h) with pread into a
// buffer of its own, never through the file's mapping: a pass over every
// row (knnctl update copying its base's kept rows, the exact scan of its
// recall estimate) then keeps only the buffer resident, so the process's
// peak RSS grows with the buffer, not with the corpus. Read through the
// mapping, each page read stays in the process's RSS until it unmaps: an
// update of 1% of a 1M x 128 base showed the base's whole 512 MB file
// (bench/RESULTS.md, "Update memory"). What pread reads stays in the page
// cache, which is reclaimable and not the process's.
//
// Thread-safety: one thread at a time (the buffer is the reader's state).
// Ownership: owns its file descriptor and buffer; independent of the
// VectorsFile it was opened from once Open() returns.
#ifndef KNND_STORAGE_VECTORS_FILE_READER_H_
#define KNND_STORAGE_VECTORS_FILE_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "knnd/storage/vectors_file.h"

namespace knnd {

class VectorsFileReader {
 public:
  // The buffer's default bound: 16,384 rows of 128 float32 values, large
  // enough that one pread per window costs nothing next to its copy.
  static constexpr int64_t kDefaultWindowBytes = int64_t{8} << 20;

  // Opens `file`'s path for reading. The window holds as many rows as fit
  // in `window_bytes` as floats (at least one). DATA_LOSS when the file at
  // the path is no longer the one `file` checked (another size).
  static absl::StatusOr<std::unique_ptr<VectorsFileReader>> Open(
      const VectorsFile& file, int64_t window_bytes = kDefaultWindowBytes);
  ~VectorsFileReader();
  VectorsFileReader(const VectorsFileReader&) = delete;
  VectorsFileReader& operator=(const VectorsFileReader&) = delete;

  int dim() const { return dim_; }
  int64_t count() const { return count_; }
  int64_t window_rows() const { return window_rows_; }

  // Rows [begin, begin + n) as n * dim() floats (float16 decoded), read
  // with one pread: 0 < n <= window_rows(), begin + n <= count(). Valid
  // until the next call. DATA_LOSS naming the file and the rows when the
  // read fails or comes back short.
  absl::StatusOr<const float*> ReadRows(int64_t begin, int64_t n);

  // Row `row` as dim() floats, valid until the next call: from the window
  // when it holds the row, else after reading the window that starts at
  // `row`. A pass in ascending row order reads each row once, a window at
  // a time, whichever rows it skips.
  absl::StatusOr<const float*> Row(int64_t row);

 private:
  VectorsFileReader() = default;

  std::string path_;
  int fd_ = -1;
  int dim_ = 0;
  int64_t count_ = 0;
  VectorsDtype dtype_ = VectorsDtype::kFloat32;
  int64_t row_bytes_ = 0;
  int64_t window_rows_ = 0;
  int64_t window_begin_ = 0;
  int64_t window_end_ = 0;  // rows [window_begin_, window_end_) are read
  std::vector<float> floats_;
  std::vector<uint16_t> halves_;  // float16 rows before decoding
};

}  // namespace knnd

#endif  // KNND_STORAGE_VECTORS_FILE_READER_H_
