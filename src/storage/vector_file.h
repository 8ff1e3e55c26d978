// What the readers of vector and id files share (vector_io.cc streams
// vectors, id_reader.cc reads ids whole): the error naming a file and a
// .npy header parsed. Internal to src/storage/.
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

// INVALID_ARGUMENT "`path`: `what`".
absl::Status BadFormat(const std::string& path, const std::string& what);

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
