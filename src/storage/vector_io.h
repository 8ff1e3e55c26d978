// Reading vector files: .npy (float32, 2-D, C order), .fvecs, .bvecs and
// the IDX files of the MNIST family (optionally gzip-compressed, e.g.
// /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz).
// Every format error names the file and what is wrong with it.
//
// Thread-safety: pure functions.
#ifndef KNND_STORAGE_VECTOR_IO_H_
#define KNND_STORAGE_VECTOR_IO_H_

#include <cstdint>
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
