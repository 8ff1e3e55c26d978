// Reading vector files: .npy (float32, 2-D, C order), .fvecs, .bvecs and
// the IDX files of the MNIST family (optionally gzip-compressed, e.g.
// /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz), whole
// (ReadVectors) or a range of rows at a time (VectorReader, what knnctl
// build streams its input with). Every format error names the file and
// what is wrong with it.
//
// Thread-safety: the functions are pure; a VectorReader is used by one
// thread at a time.
#ifndef KNND_STORAGE_VECTOR_IO_H_
#define KNND_STORAGE_VECTOR_IO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace knnd {

// A dense row-major float32 matrix.
struct Matrix {
  int64_t rows = 0;
  int dim = 0;
  std::vector<float> values;  // rows * dim
  const float* row(int64_t i) const { return values.data() + i * dim; }
};

// Reads a vector file a range of rows at a time, so that memory follows
// the rows asked for, not the file. An uncompressed .npy is memory-mapped
// and the pages of every range read are handed back to the kernel at once
// (they stay in the page cache, but not in this process's resident set);
// the other formats, and .gz, are read through zlib (transparent for
// uncompressed files), seeking to the first row asked for: forward is a
// skip, backward a rewind that decompresses from the start again, so ranges
// are cheapest in ascending order. Opening checks the header and, where the
// row count comes from the size (.fvecs, .bvecs), the size; a compressed
// one is decompressed once to count it.
// Ownership: owns its mapping or zlib stream.
class VectorReader {
 public:
  // By extension, as ReadVectors. NOT_FOUND when the file cannot be opened,
  // INVALID_ARGUMENT naming the file for a format error or no rows.
  static absl::StatusOr<std::unique_ptr<VectorReader>> Open(
      const std::string& path);

  ~VectorReader();
  VectorReader(const VectorReader&) = delete;
  VectorReader& operator=(const VectorReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t rows() const { return rows_; }
  int dim() const { return dim_; }

  // Rows [first, first + n) as n * dim() floats into `out`. OUT_OF_RANGE
  // past rows(); DATA_LOSS naming the file when it ends early or a
  // .fvecs/.bvecs row has another dim.
  absl::Status Read(int64_t first, int64_t n, float* out);

  enum class Element { kFloat32, kFloat32BigEndian, kUint8, kInt8 };
  struct Layout {
    int64_t rows = 0;
    int dim = 0;
    Element element = Element::kFloat32;
    uint64_t data_offset = 0;  // where row 0 starts
    uint64_t row_prefix = 0;   // 4 for .fvecs/.bvecs: each row's own dim
  };

 private:
  VectorReader(std::string path, const Layout& layout);
  uint64_t RowBytes() const;
  absl::Status ReadMapped(int64_t first, int64_t n, float* out);
  absl::Status ReadStream(int64_t first, int64_t n, float* out);

  const std::string path_;
  const int64_t rows_;
  const int dim_;
  const Layout layout_;
  // An uncompressed .npy: its mapping; else a zlib stream.
  void* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  void* gz_ = nullptr;  // gzFile
  std::vector<unsigned char> buffer_;
};

// Reads a whole file by its extension (.npy, .fvecs, .bvecs, anything with
// "idx" in its name for IDX; a trailing .gz is decompressed). At most
// `max_rows` rows are read when it is > 0.
absl::StatusOr<Matrix> ReadVectors(const std::string& path,
                                   int64_t max_rows = 0);

// A dense row-major int64 matrix: ids to add with, or ground-truth
// neighbour ids (one row per query).
struct IdMatrix {
  int64_t rows = 0;
  int cols = 0;
  std::vector<int64_t> values;  // rows * cols
};

// Reads .npy (little-endian int64 or int32; 1-D means one column, or 2-D,
// C order) or .ivecs (the TEXMEX / ann-benchmarks ground-truth format);
// a trailing .gz is decompressed.
absl::StatusOr<IdMatrix> ReadIds(const std::string& path);

// Writes .npy (float32, C order) or .fvecs, by extension; used by tests and
// tools to hand data to other programs.
absl::Status WriteVectors(const std::string& path, const Matrix& matrix);

}  // namespace knnd

#endif  // KNND_STORAGE_VECTOR_IO_H_
