#include "knnd/storage/vectors_file.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>


#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

constexpr char kMagic[8] = {'K', 'N', 'N', 'D', 'V', 'E', 'C', '\0'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t dtype;
  uint32_t dim;
  uint32_t header_bytes;
  uint64_t count;
  uint32_t crc32;
  char reserved[28];
};
static_assert(sizeof(Header) == kVectorsHeaderBytes, "header is 64 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the vectors file is read in place as little-endian");

bool WriteAll(FILE* file, const void* data, size_t bytes) {
  return std::fwrite(data, 1, bytes, file) == bytes;
}

}  // namespace

const char* VectorsDtypeName(VectorsDtype dtype) {
  return dtype == VectorsDtype::kFloat16 ? "f16" : "f32";
}

absl::StatusOr<VectorsDtype> ParseVectorsDtype(absl::string_view name) {
  if (name == "f32" || name == "float32") return VectorsDtype::kFloat32;
  if (name == "f16" || name == "float16") return VectorsDtype::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      "vectors dtype '", name, "' is not one of f32 (float32), f16 (float16)"));
}

int VectorsDtypeBytes(VectorsDtype dtype) {
  return dtype == VectorsDtype::kFloat16 ? 2 : 4;
}

std::string VectorsPath(const std::string& index_path) {
  return index_path + ".vectors";
}

const float* VectorsFile::RowAsFloats(int64_t id, float* scratch) const {
  if (dtype_ == VectorsDtype::kFloat16) {
    HalvesToFloats(static_cast<const uint16_t*>(row(id)),
                   static_cast<size_t>(dim_), scratch);
    return scratch;
  }
  return static_cast<const float*>(row(id));
}

// ---- Writer ----

absl::StatusOr<std::unique_ptr<VectorsFileWriter>> VectorsFileWriter::Create(
    const std::string& path, int dim, VectorsDtype dtype) {
  if (dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vectors file ", path, ": dim=", dim, " must be > 0"));
  }
  const std::string temp = TempPathFor(path);
  FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create vectors file ", temp, ": ", strerror(errno)));
  }
  Header header{};  // completed by Finish()
  if (!WriteAll(file, &header, sizeof header)) {
    std::fclose(file);
    unlink(temp.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp, ": ", strerror(errno)));
  }
  std::unique_ptr<VectorsFileWriter> writer(
      new VectorsFileWriter(path, temp, file, dim, dtype));
  writer->crc_ = InitialCrc32();
  return writer;
}

VectorsFileWriter::~VectorsFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) unlink(temp_.c_str());
}

absl::Status VectorsFileWriter::Append(const float* vectors, int64_t rows) {
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError("vectors file already finished");
  }
  const size_t values = static_cast<size_t>(rows) * dim_;
  const void* data = vectors;
  size_t bytes = values * sizeof(float);
  std::vector<uint16_t> halves;
  if (dtype_ == VectorsDtype::kFloat16) {
    halves.resize(values);
    for (size_t i = 0; i < values; ++i) halves[i] = FloatToHalf(vectors[i]);
    data = halves.data();
    bytes = values * sizeof(uint16_t);
  }
  if (!WriteAll(file_, data, bytes)) {
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp_, ": ", strerror(errno)));
  }
  crc_ = *ExtendCrc32(crc_, data, bytes);
  rows_ += rows;
  return absl::OkStatus();
}

absl::Status VectorsFileWriter::Finish() {
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError("vectors file already finished");
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kVectorsFormatVersion;
  header.dtype = static_cast<uint32_t>(dtype_);
  header.dim = static_cast<uint32_t>(dim_);
  header.header_bytes = static_cast<uint32_t>(kVectorsHeaderBytes);
  header.count = static_cast<uint64_t>(rows_);
  header.crc32 = static_cast<uint32_t>(crc_);
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
                  WriteAll(file_, &header, sizeof header) &&
                  std::fflush(file_) == 0;
  const int error = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp_, ": ", strerror(error)));
  }
  // Synced, renamed and the directory synced, like every file knnd writes.
  if (absl::Status s = CommitTempFile(temp_, path_); !s.ok()) return s;
  finished_ = true;
  return absl::OkStatus();
}

// ---- Reader ----

absl::StatusOr<std::unique_ptr<VectorsFile>> VectorsFile::Open(
    const std::string& path, int expect_dim, int64_t expect_count,
    bool verify_checksum) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("vectors file ", path, " does not exist"));
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot open vectors file ", path, ": ", strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("vectors file ", path, " is not a regular file"));
  }
  auto bad = [&path](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("vectors file ", path, " is corrupt: ", what));
  };
  const int64_t size = st.st_size;
  Header header{};
  if (size < kVectorsHeaderBytes ||
      pread(fd, &header, sizeof header, 0) !=
          static_cast<ssize_t>(sizeof header)) {
    close(fd);
    return bad(absl::StrCat("it has ", size, " bytes, less than the ",
                            kVectorsHeaderBytes, "-byte header"));
  }
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) {
    close(fd);
    return bad("bad magic (expected \"KNNDVEC\"); not a knnd vectors file");
  }
  if (header.version != kVectorsFormatVersion) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "vectors file ", path, ": format version ", header.version,
        " is not the version ", kVectorsFormatVersion,
        " this knnd understands"));
  }
  if (header.dtype != static_cast<uint32_t>(VectorsDtype::kFloat32) &&
      header.dtype != static_cast<uint32_t>(VectorsDtype::kFloat16)) {
    close(fd);
    return bad(absl::StrCat("dtype ", header.dtype,
                            " is neither 1 (f32) nor 2 (f16)"));
  }
  if (header.header_bytes != kVectorsHeaderBytes) {
    close(fd);
    return bad(absl::StrCat("header_bytes=", header.header_bytes,
                            ", expected ", kVectorsHeaderBytes));
  }
  if (header.dim != static_cast<uint32_t>(expect_dim)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "vectors file ", path, " has dim=", header.dim,
        " but the index has dim=", expect_dim));
  }
  if (header.count != static_cast<uint64_t>(expect_count)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "vectors file ", path, " has count=", header.count,
        " rows but the index has ntotal=", expect_count));
  }
  const auto dtype = static_cast<VectorsDtype>(header.dtype);
  const int64_t row_bytes =
      int64_t{header.dim} * VectorsDtypeBytes(dtype);
  const int64_t expect_size = kVectorsHeaderBytes + expect_count * row_bytes;
  if (size != expect_size) {
    close(fd);
    return bad(absl::StrFormat(
        "size %d bytes, expected header %d + count %d * dim %d * %d bytes "
        "(%s) = %d; the file is truncated or was overwritten",
        size, kVectorsHeaderBytes, expect_count, header.dim,
        VectorsDtypeBytes(dtype), VectorsDtypeName(dtype), expect_size));
  }
  void* map = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED,
                   fd, 0);
  const int map_error = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot memory-map vectors file ", path, ": ", strerror(map_error)));
  }
  // Re-ranking reads a few rows at random places: a fault on one must read
  // its pages, not the device's read-ahead around them (8 MiB on the
  // development VM's disk: a query under a memory limit read 241 MiB for
  // 320 KiB of rows, bench/RESULTS.md "Under a memory limit"). Advice only:
  // a refusal changes nothing else.
  madvise(map, static_cast<size_t>(size), MADV_RANDOM);
  std::unique_ptr<VectorsFile> file(new VectorsFile());
  file->path_ = path;
  file->dim_ = static_cast<int>(header.dim);
  file->count_ = expect_count;
  file->dtype_ = dtype;
  file->file_bytes_ = size;
  file->row_bytes_ = row_bytes;
  file->map_ = map;
  file->rows_ = static_cast<const char*>(map) + kVectorsHeaderBytes;
  file->header_crc32_ = header.crc32;
  if (verify_checksum) {
    if (absl::Status s = file->VerifyChecksum(); !s.ok()) return s;
  }
  return file;
}

absl::Status VectorsFile::VerifyChecksum(
    const std::atomic<bool>* cancel) const {
  // One sequential pass: read-ahead on for it, random access after.
  madvise(map_, static_cast<size_t>(file_bytes_), MADV_SEQUENTIAL);
  absl::Status status = VerifyPayloadCrc32(
      absl::StrCat("vectors file ", path_), rows_,
      static_cast<size_t>(count_ * row_bytes_), header_crc32_, cancel);
  madvise(map_, static_cast<size_t>(file_bytes_), MADV_RANDOM);
  return status;
}

VectorsFile::~VectorsFile() {
  if (map_ != nullptr) {
    munmap(map_, static_cast<size_t>(file_bytes_));
  }
}

}  // namespace knnd
