// ReadIds (vector_io.h): ids to build with and ground-truth neighbours,
// from .npy (int64 or int32) or .ivecs, read whole.
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "knnd/storage/vector_file.h"
#include "knnd/storage/vector_io.h"

namespace knnd {
namespace {

using vector_file::BadFormat;

// Reads the file, decompressing gzip when the name ends in .gz.
absl::StatusOr<std::string> ReadBytes(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  gzbuffer(file, 1 << 20);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(file, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string message = gzerror(file, &err);
      gzclose(file);
      return absl::DataLossError(
          absl::StrCat("cannot read ", path, ": ", message));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  gzclose(file);
  return out;
}

// .ivecs: per row a little-endian int32 dim, then dim values of `elem`
// bytes. Checks every row's dim; the data starts at 4 bytes into each row
// of row_bytes. (.fvecs/.bvecs are streamed: vector_io.cc's
// VecsFileLayout.)
struct VecsLayout {
  int64_t rows = 0;
  int dim = 0;
  size_t row_bytes = 0;
};

absl::StatusOr<VecsLayout> CheckVecs(const std::string& path,
                                     const std::string& bytes, int elem) {
  if (bytes.size() < 4) return BadFormat(path, "empty vecs file");
  int32_t dim;
  std::memcpy(&dim, bytes.data(), 4);
  if (dim <= 0 || dim > (1 << 20)) {
    return BadFormat(path, absl::StrCat("first row has dim=", dim));
  }
  VecsLayout layout;
  layout.dim = dim;
  layout.row_bytes = 4 + static_cast<size_t>(dim) * elem;
  if (bytes.size() % layout.row_bytes != 0) {
    return BadFormat(path, absl::StrCat("size ", bytes.size(),
                                        " is not a multiple of the row size ",
                                        layout.row_bytes, " (dim=", dim, ")"));
  }
  layout.rows = static_cast<int64_t>(bytes.size() / layout.row_bytes);
  for (int64_t i = 0; i < layout.rows; ++i) {
    int32_t d;
    std::memcpy(&d, bytes.data() + i * layout.row_bytes, 4);
    if (d != dim) {
      return BadFormat(path, absl::StrCat("row ", i, " has dim=", d,
                                          ", expected ", dim));
    }
  }
  return layout;
}

// Integer .npy: int32 or int64 (little-endian), 1-D (one column) or 2-D.
absl::StatusOr<IdMatrix> ParseNpyIds(const std::string& path,
                                     const std::string& bytes) {
  absl::StatusOr<vector_file::NpyHeader> header =
      vector_file::ParseNpyHeader(path, bytes);
  if (!header.ok()) return header.status();
  int elem = 0;
  if (header->descr == "'<i8'" || header->descr == "'=i8'") elem = 8;
  if (header->descr == "'<i4'" || header->descr == "'=i4'") elem = 4;
  if (elem == 0) {
    return BadFormat(path, absl::StrCat("dtype ", header->descr,
                                        " is not little-endian int64 or "
                                        "int32 (convert with .astype('<i8'))"));
  }
  const std::vector<int64_t>& shape = header->shape;
  if (shape.empty() || shape.size() > 2 ||
      (shape.size() == 2 && shape[1] <= 0)) {
    return BadFormat(path, absl::StrCat("shape (", absl::StrJoin(shape, ", "),
                                        ") is not 1-D or 2-D"));
  }
  IdMatrix m;
  m.rows = shape[0];
  m.cols = shape.size() == 2 ? static_cast<int>(shape[1]) : 1;
  const size_t count = static_cast<size_t>(m.rows) * m.cols;
  if (bytes.size() - header->data_offset < count * elem) {
    return BadFormat(path, absl::StrCat("data is shorter than ", m.rows, " x ",
                                        m.cols, " int", elem * 8));
  }
  m.values.resize(count);
  const char* data = bytes.data() + header->data_offset;
  for (size_t i = 0; i < count; ++i) {
    if (elem == 8) {
      std::memcpy(&m.values[i], data + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      m.values[i] = v;
    }
  }
  return m;
}

absl::StatusOr<IdMatrix> ParseIvecs(const std::string& path,
                                    const std::string& bytes) {
  absl::StatusOr<VecsLayout> layout = CheckVecs(path, bytes, 4);
  if (!layout.ok()) return layout.status();
  IdMatrix m;
  m.rows = layout->rows;
  m.cols = layout->dim;
  m.values.resize(static_cast<size_t>(m.rows) * m.cols);
  for (int64_t i = 0; i < m.rows; ++i) {
    const char* row = bytes.data() + i * layout->row_bytes + 4;
    for (int j = 0; j < m.cols; ++j) {
      int32_t v;
      std::memcpy(&v, row + 4 * j, 4);
      m.values[i * m.cols + j] = v;
    }
  }
  return m;
}

}  // namespace

absl::StatusOr<IdMatrix> ReadIds(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  absl::string_view name = lower;
  absl::ConsumeSuffix(&name, ".gz");
  if (!absl::EndsWith(name, ".npy") && !absl::EndsWith(name, ".ivecs")) {
    return BadFormat(path, "unknown format for ids; use .npy (int64 or "
                           "int32) or .ivecs (optionally .gz)");
  }
  absl::StatusOr<std::string> bytes = ReadBytes(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<IdMatrix> m = absl::EndsWith(name, ".npy")
                                   ? ParseNpyIds(path, *bytes)
                                   : ParseIvecs(path, *bytes);
  if (m.ok() && m->rows == 0) return BadFormat(path, "holds no rows");
  return m;
}

}  // namespace knnd
