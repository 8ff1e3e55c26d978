// What the readers of vector and id files share (vector_io.cc streams
// vectors, id_reader.cc reads ids whole): a file read into memory, gzip
// decompressed, the error naming a file, .ivecs rows checked, and a .npy
// header parsed. Internal to src/storage/.
//
// Thread-safety: pure functions.
#ifndef KNND_STORAGE_VECTOR_FILE_H_
#define KNND_STORAGE_VECTOR_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace knnd {
namespace vector_file {

// Reads the file, decompressing gzip when the name ends in .gz.
absl::StatusOr<std::string> ReadBytes(const std::string& path);

// INVALID_ARGUMENT "`path`: `what`".
absl::Status BadFormat(const std::string& path, const std::string& what);

// .ivecs (read whole, for ids): per row a little-endian int32 dim, then
// dim values of `elem` bytes. Checks every row's dim; the data starts at 4
// bytes into each row of row_bytes. (.fvecs/.bvecs are streamed:
// vector_io.cc's VecsFileLayout.)
struct VecsLayout {
  int64_t rows = 0;
  int dim = 0;
  size_t row_bytes = 0;
};
absl::StatusOr<VecsLayout> CheckVecs(const std::string& path,
                                     const std::string& bytes, int elem);

// The header of a .npy file (version 1, 2 or 3): magic, version, header
// length, then a Python dict literal.
struct NpyHeader {
  std::string descr;           // e.g. "'<f4'"
  std::vector<int64_t> shape;  // any rank
  size_t data_offset = 0;
};
absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& path,
                                         const std::string& bytes);

}  // namespace vector_file
}  // namespace knnd

#endif  // KNND_STORAGE_VECTOR_FILE_H_
