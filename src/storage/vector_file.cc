#include "knnd/storage/vector_file.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace knnd {
namespace vector_file {

absl::Status BadFormat(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
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
