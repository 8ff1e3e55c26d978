#include "knnd/storage/vector_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "knnd/storage/vector_file.h"

namespace knnd {
namespace {

using vector_file::BadFormat;
using vector_file::NpyHeader;
using vector_file::ParseNpyHeader;

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The start of a vector file (decompressed) and its total size, which is
// all the layout needs.
struct FileHead {
  std::string prefix;  // the first kHeadBytes bytes, or all of a shorter file
  uint64_t total_bytes = 0;
  bool compressed = false;
};

constexpr size_t kHeadBytes = 1 << 20;

// Pages of a mapped .npy are handed back in windows of this many bytes
// aligned to it: a multiple of the kernel's fault-around (64 KiB) and of
// the page size.
constexpr uint64_t kDropWindowBytes = 1 << 20;

// Reads the head of `file` (opened by gzopen) and counts the rest: the
// size on disk for an uncompressed file, one decompression pass for a
// compressed one.
absl::StatusOr<FileHead> ReadHead(const std::string& path, gzFile file) {
  FileHead head;
  head.prefix.resize(kHeadBytes);
  const int n = gzread(file, head.prefix.data(), kHeadBytes);
  if (n < 0) {
    int err = 0;
    return absl::DataLossError(
        absl::StrCat("cannot read ", path, ": ", gzerror(file, &err)));
  }
  head.prefix.resize(static_cast<size_t>(n));
  head.compressed = gzdirect(file) == 0;
  if (!head.compressed) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
    }
    head.total_bytes = static_cast<uint64_t>(st.st_size);
    return head;
  }
  head.total_bytes = head.prefix.size();
  std::vector<char> buf(1 << 16);
  for (int got; (got = gzread(file, buf.data(), buf.size())) != 0;) {
    if (got < 0) {
      int err = 0;
      return absl::DataLossError(
          absl::StrCat("cannot read ", path, ": ", gzerror(file, &err)));
    }
    head.total_bytes += static_cast<uint64_t>(got);
  }
  return head;
}

using Layout = VectorReader::Layout;
using Element = VectorReader::Element;

// IDX: magic 0x0000 <type> <ndims>, then ndims big-endian uint32 sizes.
// Rows are the first dimension; the others are flattened.
absl::StatusOr<Layout> IdxLayout(const std::string& path,
                                 const FileHead& head) {
  const auto* p = reinterpret_cast<const unsigned char*>(head.prefix.data());
  if (head.prefix.size() < 4 || p[0] != 0 || p[1] != 0) {
    return BadFormat(path, "not an IDX file (bad magic)");
  }
  const int type = p[2];
  const int ndims = p[3];
  Layout layout;
  int elem = 0;
  switch (type) {
    case 0x08: layout.element = Element::kUint8; elem = 1; break;
    case 0x09: layout.element = Element::kInt8; elem = 1; break;
    case 0x0D: layout.element = Element::kFloat32BigEndian; elem = 4; break;
    default:
      return BadFormat(path, absl::StrCat("IDX element type 0x",
                                          absl::Hex(type),
                                          " is not ubyte, byte or float"));
  }
  if (ndims < 1 || head.prefix.size() < 4 + 4 * static_cast<size_t>(ndims)) {
    return BadFormat(path, "truncated IDX header");
  }
  const int64_t rows = BigEndian32(p + 4);
  int64_t dim = 1;
  for (int i = 1; i < ndims; ++i) dim *= BigEndian32(p + 4 + 4 * i);
  layout.data_offset = 4 + 4 * static_cast<uint64_t>(ndims);
  if (dim <= 0 || dim > (1 << 20) ||
      head.total_bytes - layout.data_offset <
          static_cast<uint64_t>(rows * dim * elem)) {
    return BadFormat(path, absl::StrCat("IDX data is shorter than ", rows,
                                        " x ", dim, " elements"));
  }
  layout.rows = rows;
  layout.dim = static_cast<int>(dim);
  return layout;
}

// .fvecs (elem 4) / .bvecs (elem 1): rows from the size; every row's own
// dim is checked as it is read.
absl::StatusOr<Layout> VecsFileLayout(const std::string& path,
                                      const FileHead& head, int elem) {
  if (head.prefix.size() < 4) return BadFormat(path, "empty vecs file");
  int32_t dim;
  std::memcpy(&dim, head.prefix.data(), 4);
  if (dim <= 0 || dim > (1 << 20)) {
    return BadFormat(path, absl::StrCat("first row has dim=", dim));
  }
  const uint64_t row_bytes = 4 + static_cast<uint64_t>(dim) * elem;
  if (head.total_bytes % row_bytes != 0) {
    return BadFormat(path, absl::StrCat("size ", head.total_bytes,
                                        " is not a multiple of the row size ",
                                        row_bytes, " (dim=", dim, ")"));
  }
  Layout layout;
  layout.rows = static_cast<int64_t>(head.total_bytes / row_bytes);
  layout.dim = dim;
  layout.element = elem == 4 ? Element::kFloat32 : Element::kUint8;
  layout.data_offset = 4;
  layout.row_prefix = 4;
  return layout;
}

absl::StatusOr<Layout> NpyLayout(const std::string& path,
                                 const FileHead& head) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(path, head.prefix);
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
  const int64_t rows = header->shape[0];
  const int64_t dim = header->shape[1];
  if (head.total_bytes - header->data_offset <
      static_cast<uint64_t>(rows * dim * 4)) {
    return BadFormat(path, absl::StrCat("data is shorter than ", rows, " x ",
                                        dim, " float32"));
  }
  Layout layout;
  layout.rows = rows;
  layout.dim = static_cast<int>(dim);
  layout.element = Element::kFloat32;
  layout.data_offset = header->data_offset;
  return layout;
}

int ElementBytes(Element element) {
  return element == Element::kUint8 || element == Element::kInt8 ? 1 : 4;
}

// `count` values of `element` at `in` as floats at `out`.
void ConvertElements(const unsigned char* in, Element element, size_t count,
                     float* out) {
  switch (element) {
    case Element::kFloat32:
      std::memcpy(out, in, count * sizeof(float));
      return;
    case Element::kFloat32BigEndian:
      for (size_t i = 0; i < count; ++i) {
        const uint32_t bits = BigEndian32(in + 4 * i);
        std::memcpy(&out[i], &bits, 4);
      }
      return;
    case Element::kUint8:
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(in[i]);
      return;
    case Element::kInt8:
      for (size_t i = 0; i < count; ++i) {
        out[i] = static_cast<float>(static_cast<int8_t>(in[i]));
      }
      return;
  }
}

}  // namespace

VectorReader::VectorReader(std::string path, const Layout& layout)
    : path_(std::move(path)),
      rows_(layout.rows),
      dim_(layout.dim),
      layout_(layout) {}

VectorReader::~VectorReader() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  if (gz_ != nullptr) gzclose(static_cast<gzFile>(gz_));
}

uint64_t VectorReader::RowBytes() const {
  return layout_.row_prefix +
         static_cast<uint64_t>(dim_) * ElementBytes(layout_.element);
}

absl::StatusOr<std::unique_ptr<VectorReader>> VectorReader::Open(
    const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  absl::string_view name = lower;
  absl::ConsumeSuffix(&name, ".gz");
  const bool npy = absl::EndsWith(name, ".npy");
  const bool fvecs = absl::EndsWith(name, ".fvecs");
  const bool bvecs = absl::EndsWith(name, ".bvecs");
  if (!npy && !fvecs && !bvecs && !absl::StrContains(name, "idx")) {
    return BadFormat(path, "unknown format; use .npy, .fvecs, .bvecs or an "
                           "IDX file (optionally .gz)");
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  gzbuffer(file, 1 << 20);
  absl::StatusOr<FileHead> head = ReadHead(path, file);
  if (!head.ok()) {
    gzclose(file);
    return head.status();
  }
  absl::StatusOr<Layout> layout = npy     ? NpyLayout(path, *head)
                                  : fvecs ? VecsFileLayout(path, *head, 4)
                                  : bvecs ? VecsFileLayout(path, *head, 1)
                                          : IdxLayout(path, *head);
  if (layout.ok() && layout->rows == 0) {
    layout = BadFormat(path, "holds no vectors");
  }
  if (!layout.ok()) {
    gzclose(file);
    return layout.status();
  }
  std::unique_ptr<VectorReader> reader(new VectorReader(path, *layout));
  if (!npy || head->compressed) {
    gzrewind(file);
    reader->gz_ = file;
    return reader;
  }
  gzclose(file);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  void* map = mmap(nullptr, head->total_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", path, ": ", std::strerror(map_errno)));
  }
  madvise(map, head->total_bytes, MADV_SEQUENTIAL);
  reader->map_ = map;
  reader->map_bytes_ = head->total_bytes;
  return reader;
}

absl::Status VectorReader::Read(int64_t first, int64_t n, float* out) {
  if (first < 0 || n < 0 || first + n > rows_) {
    return absl::OutOfRangeError(absl::StrCat(
        "rows [", first, ", ", first + n, ") of ", path_, ", which has ",
        rows_, " rows"));
  }
  if (n == 0) return absl::OkStatus();
  return map_ != nullptr ? ReadMapped(first, n, out)
                         : ReadStream(first, n, out);
}

absl::Status VectorReader::ReadMapped(int64_t first, int64_t n, float* out) {
  const uint64_t begin = layout_.data_offset + first * RowBytes();
  const uint64_t end = begin + n * RowBytes();
  // Copied a window at a time, each window's pages handed back to the
  // kernel once copied (the page cache keeps them): the process never holds
  // more of the file than one window, whatever the range. The whole aligned
  // window goes, not just the rows: the kernel maps cached pages around
  // each faulting one too (fault-around, 64 KiB).
  char* out_bytes = reinterpret_cast<char*>(out);
  for (uint64_t at = begin; at < end;) {
    const uint64_t window = at / kDropWindowBytes * kDropWindowBytes;
    const uint64_t next = std::min(end, window + kDropWindowBytes);
    std::memcpy(out_bytes + (at - begin), static_cast<const char*>(map_) + at,
                next - at);
    madvise(static_cast<char*>(map_) + window,
            std::min(map_bytes_, window + kDropWindowBytes) - window,
            MADV_DONTNEED);
    at = next;
  }
  return absl::OkStatus();
}

absl::Status VectorReader::ReadStream(int64_t first, int64_t n, float* out) {
  gzFile file = static_cast<gzFile>(gz_);
  const uint64_t row_bytes = RowBytes();
  const z_off_t offset =
      static_cast<z_off_t>(layout_.data_offset - layout_.row_prefix +
                           first * row_bytes);
  if (gzseek(file, offset, SEEK_SET) != offset) {
    int err = 0;
    return absl::DataLossError(absl::StrCat("cannot seek to row ", first,
                                            " of ", path_, ": ",
                                            gzerror(file, &err)));
  }
  const int64_t chunk_rows =
      std::max<int64_t>(1, static_cast<int64_t>(kHeadBytes / row_bytes));
  for (int64_t done = 0; done < n;) {
    const int64_t take = std::min(chunk_rows, n - done);
    const size_t bytes = static_cast<size_t>(take * row_bytes);
    buffer_.resize(bytes);
    if (gzread(file, buffer_.data(), static_cast<unsigned>(bytes)) !=
        static_cast<int>(bytes)) {
      return absl::DataLossError(absl::StrCat(
          path_, " ends before row ", first + done + take, " of ", rows_));
    }
    for (int64_t i = 0; i < take; ++i) {
      const unsigned char* row = buffer_.data() + i * row_bytes;
      if (layout_.row_prefix > 0) {
        int32_t d;
        std::memcpy(&d, row, 4);
        if (d != dim_) {
          return absl::DataLossError(
              absl::StrCat(path_, ": row ", first + done + i, " has dim=", d,
                           ", expected ", dim_));
        }
      }
      ConvertElements(row + layout_.row_prefix, layout_.element,
                      static_cast<size_t>(dim_),
                      out + (done + i) * static_cast<int64_t>(dim_));
    }
    done += take;
  }
  return absl::OkStatus();
}

absl::StatusOr<Matrix> ReadVectors(const std::string& path, int64_t max_rows) {
  absl::StatusOr<std::unique_ptr<VectorReader>> reader =
      VectorReader::Open(path);
  if (!reader.ok()) return reader.status();
  Matrix m;
  m.rows = max_rows > 0 ? std::min(max_rows, (*reader)->rows())
                        : (*reader)->rows();
  m.dim = (*reader)->dim();
  m.values.resize(static_cast<size_t>(m.rows) * m.dim);
  if (absl::Status s = (*reader)->Read(0, m.rows, m.values.data()); !s.ok()) {
    return s;
  }
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
