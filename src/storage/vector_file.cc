#include "knnd/storage/vector_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knnd {
namespace vector_file {

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

}  // namespace vector_file
}  // namespace knnd
