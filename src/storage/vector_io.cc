#include "knnd/storage/vector_io.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knnd {
namespace {

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

absl::Status BadFormat(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// IDX: magic 0x0000 <type> <ndims>, then ndims big-endian uint32 sizes.
// Rows are the first dimension; the others are flattened.
absl::StatusOr<Matrix> ParseIdx(const std::string& path,
                                const std::string& bytes, int64_t max_rows) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4 || p[0] != 0 || p[1] != 0) {
    return BadFormat(path, "not an IDX file (bad magic)");
  }
  const int type = p[2];
  const int ndims = p[3];
  int elem = 0;
  switch (type) {
    case 0x08: case 0x09: elem = 1; break;  // unsigned / signed byte
    case 0x0D: elem = 4; break;             // float32
    default:
      return BadFormat(path, absl::StrCat("IDX element type 0x",
                                          absl::Hex(type),
                                          " is not ubyte, byte or float"));
  }
  if (ndims < 1 || bytes.size() < 4 + 4 * static_cast<size_t>(ndims)) {
    return BadFormat(path, "truncated IDX header");
  }
  int64_t rows = BigEndian32(p + 4);
  int64_t dim = 1;
  for (int i = 1; i < ndims; ++i) dim *= BigEndian32(p + 4 + 4 * i);
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (dim <= 0 || dim > (1 << 20) ||
      bytes.size() - header < static_cast<size_t>(rows * dim * elem)) {
    return BadFormat(path, absl::StrCat("IDX data is shorter than ", rows,
                                        " x ", dim, " elements"));
  }
  if (max_rows > 0) rows = std::min(rows, max_rows);
  Matrix m;
  m.rows = rows;
  m.dim = static_cast<int>(dim);
  m.values.resize(static_cast<size_t>(rows * dim));
  const unsigned char* data = p + header;
  for (int64_t i = 0; i < rows * dim; ++i) {
    if (type == 0x08) {
      m.values[i] = static_cast<float>(data[i]);
    } else if (type == 0x09) {
      m.values[i] = static_cast<float>(static_cast<int8_t>(data[i]));
    } else {
      uint32_t bits = BigEndian32(data + 4 * i);
      std::memcpy(&m.values[i], &bits, 4);
    }
  }
  return m;
}

// .fvecs / .bvecs / .ivecs: per row a little-endian int32 dim, then dim
// values of `elem` bytes. Checks every row's dim; the data starts at 4 bytes
// into each row of row_bytes.
struct VecsLayout {
  int64_t rows = 0;
  int dim = 0;
  size_t row_bytes = 0;
};

absl::StatusOr<VecsLayout> CheckVecs(const std::string& path,
                                     const std::string& bytes, int elem,
                                     int64_t max_rows) {
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
  if (max_rows > 0) layout.rows = std::min(layout.rows, max_rows);
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

absl::StatusOr<Matrix> ParseVecs(const std::string& path,
                                 const std::string& bytes, int elem,
                                 int64_t max_rows) {
  absl::StatusOr<VecsLayout> layout = CheckVecs(path, bytes, elem, max_rows);
  if (!layout.ok()) return layout.status();
  const int dim = layout->dim;
  Matrix m;
  m.rows = layout->rows;
  m.dim = dim;
  m.values.resize(static_cast<size_t>(m.rows) * dim);
  for (int64_t i = 0; i < m.rows; ++i) {
    const char* row = bytes.data() + i * layout->row_bytes + 4;
    float* out = m.values.data() + i * dim;
    if (elem == 4) {
      std::memcpy(out, row, static_cast<size_t>(dim) * 4);
    } else {
      for (int j = 0; j < dim; ++j) {
        out[j] = static_cast<float>(static_cast<uint8_t>(row[j]));
      }
    }
  }
  return m;
}

// The header of a .npy file (version 1, 2 or 3): magic, version, header
// length, then a Python dict literal.
struct NpyHeader {
  std::string descr;           // e.g. "'<f4'"
  std::vector<int64_t> shape;  // any rank
  size_t data_offset = 0;
};

absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& path,
                                         const std::string& bytes) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    return BadFormat(path, "not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len;
  size_t offset;
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (major == 1) {
    header_len = u[8] | (u[9] << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return BadFormat(path, "truncated .npy header");
    header_len = u[8] | (u[9] << 8) | (u[10] << 16) | (size_t{u[11]} << 24);
    offset = 12;
  } else {
    return BadFormat(path, absl::StrCat(".npy version ", major,
                                        " is not supported"));
  }
  if (bytes.size() < offset + header_len) {
    return BadFormat(path, "truncated .npy header");
  }
  const std::string header = bytes.substr(offset, header_len);
  auto field = [&](absl::string_view key) -> std::string {
    size_t pos = header.find(absl::StrCat("'", key, "'"));
    if (pos == std::string::npos) return "";
    pos = header.find(':', pos);
    size_t end = header.find_first_of(key == "shape" ? ")" : ",}", pos);
    return std::string(absl::StripAsciiWhitespace(
        header.substr(pos + 1, end - pos - (key == "shape" ? 0 : 1))));
  };
  NpyHeader parsed;
  parsed.descr = field("descr");
  if (field("fortran_order") != "False") {
    return BadFormat(path, "array is in Fortran order; save it in C order "
                           "(np.ascontiguousarray)");
  }
  const std::string shape_field = field("shape");
  absl::string_view shape = shape_field;
  absl::ConsumePrefix(&shape, "(");
  absl::ConsumeSuffix(&shape, ")");
  for (absl::string_view dim :
       absl::StrSplit(shape, ',', absl::SkipWhitespace())) {
    int64_t value;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &value) ||
        value < 0) {
      return BadFormat(path, absl::StrCat("shape (", shape, ") is not valid"));
    }
    parsed.shape.push_back(value);
  }
  parsed.data_offset = offset + header_len;
  return parsed;
}

absl::StatusOr<Matrix> ParseNpy(const std::string& path,
                                const std::string& bytes, int64_t max_rows) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(path, bytes);
  if (!header.ok()) return header.status();
  const std::string& descr = header->descr;
  if (descr != "'<f4'" && descr != "'=f4'" && descr != "'f4'") {
    return BadFormat(path, absl::StrCat("dtype ", descr,
                                        " is not little-endian float32 "
                                        "(convert with .astype('<f4'))"));
  }
  if (header->shape.size() != 2 || header->shape[1] <= 0) {
    return BadFormat(path, absl::StrCat("shape (",
                                        absl::StrJoin(header->shape, ", "),
                                        ") is not 2-D (rows, dim)"));
  }
  int64_t rows = header->shape[0];
  const int64_t dim = header->shape[1];
  if (bytes.size() - header->data_offset <
      static_cast<size_t>(rows * dim * 4)) {
    return BadFormat(path, absl::StrCat("data is shorter than ", rows, " x ",
                                        dim, " float32"));
  }
  if (max_rows > 0) rows = std::min(rows, max_rows);
  Matrix m;
  m.rows = rows;
  m.dim = static_cast<int>(dim);
  m.values.resize(static_cast<size_t>(rows * dim));
  std::memcpy(m.values.data(), bytes.data() + header->data_offset,
              m.values.size() * sizeof(float));
  return m;
}

// Integer .npy: int32 or int64 (little-endian), 1-D (one column) or 2-D.
absl::StatusOr<IdMatrix> ParseNpyIds(const std::string& path,
                                     const std::string& bytes) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(path, bytes);
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
  absl::StatusOr<VecsLayout> layout = CheckVecs(path, bytes, 4, 0);
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

absl::StatusOr<Matrix> ReadVectors(const std::string& path, int64_t max_rows) {
  const std::string lower = absl::AsciiStrToLower(path);
  absl::string_view name = lower;
  absl::ConsumeSuffix(&name, ".gz");
  absl::StatusOr<std::string> bytes = ReadBytes(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<Matrix> m;
  if (absl::EndsWith(name, ".npy")) {
    m = ParseNpy(path, *bytes, max_rows);
  } else if (absl::EndsWith(name, ".fvecs")) {
    m = ParseVecs(path, *bytes, 4, max_rows);
  } else if (absl::EndsWith(name, ".bvecs")) {
    m = ParseVecs(path, *bytes, 1, max_rows);
  } else if (absl::StrContains(name, "idx")) {
    m = ParseIdx(path, *bytes, max_rows);
  } else {
    return BadFormat(path, "unknown format; use .npy, .fvecs, .bvecs or an "
                           "IDX file (optionally .gz)");
  }
  if (m.ok() && m->rows == 0) return BadFormat(path, "holds no vectors");
  return m;
}

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

absl::Status WriteVectors(const std::string& path, const Matrix& m) {
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  }
  if (absl::EndsWith(path, ".npy")) {
    std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                      m.rows, ", ", m.dim, "), }");
    // Pad so that magic(6)+version(2)+len(2)+header+'\n' is a multiple of 64.
    const size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header.push_back('\n');
    const uint16_t len = static_cast<uint16_t>(header.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(len & 0xff));
    out.put(static_cast<char>(len >> 8));
    out << header;
    out.write(reinterpret_cast<const char*>(m.values.data()),
              static_cast<std::streamsize>(m.values.size() * sizeof(float)));
  } else if (absl::EndsWith(path, ".fvecs")) {
    for (int64_t i = 0; i < m.rows; ++i) {
      const int32_t d = m.dim;
      out.write(reinterpret_cast<const char*>(&d), 4);
      out.write(reinterpret_cast<const char*>(m.row(i)),
                static_cast<std::streamsize>(m.dim * sizeof(float)));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": can only write .npy or .fvecs"));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace knnd
