#include "knnd/storage/vectors_file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "knnd/faiss/vector_math.h"

namespace knnd {

absl::StatusOr<std::unique_ptr<VectorsFileReader>> VectorsFileReader::Open(
    const VectorsFile& file, int64_t window_bytes) {
  const int fd = open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot open vectors file ", file.path(), ": ", std::strerror(errno)));
  }
  std::unique_ptr<VectorsFileReader> reader(new VectorsFileReader());
  reader->fd_ = fd;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size != file.file_bytes()) {
    return absl::DataLossError(absl::StrCat(
        "vectors file ", file.path(), " changed since it was opened: ",
        st.st_size, " bytes, it had ", file.file_bytes()));
  }
  reader->path_ = file.path();
  reader->dim_ = file.dim();
  reader->count_ = file.count();
  reader->dtype_ = file.dtype();
  reader->row_bytes_ = int64_t{file.dim()} * VectorsDtypeBytes(file.dtype());
  const int64_t float_row_bytes = int64_t{file.dim()} * sizeof(float);
  reader->window_rows_ = std::max<int64_t>(1, window_bytes / float_row_bytes);
  // Most readers make one pass in row order: the kernel may read ahead.
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return reader;
}

VectorsFileReader::~VectorsFileReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<const float*> VectorsFileReader::ReadRows(int64_t begin,
                                                         int64_t n) {
  if (n <= 0 || n > window_rows_ || begin < 0 || begin + n > count_) {
    return absl::OutOfRangeError(
        absl::StrCat("vectors file ", path_, ": rows [", begin, ", ", begin + n,
                     ") are not a window of at most ", window_rows_, " of its ",
                     count_, " rows"));
  }
  const size_t values = static_cast<size_t>(n) * dim_;
  floats_.resize(std::max(floats_.size(), values));
  const bool halves = dtype_ == VectorsDtype::kFloat16;
  if (halves) halves_.resize(std::max(halves_.size(), values));
  char* into = halves ? reinterpret_cast<char*>(halves_.data())
                      : reinterpret_cast<char*>(floats_.data());
  const int64_t bytes = n * row_bytes_;
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got =
        pread(fd_, into + done, static_cast<size_t>(bytes - done),
              kVectorsHeaderBytes + begin * row_bytes_ + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      window_end_ = window_begin_;  // the buffer is no window now
      return absl::DataLossError(absl::StrCat(
          "vectors file ", path_, ": reading rows [", begin, ", ", begin + n,
          ") returned ", done, " of ", bytes, " bytes",
          got < 0 ? absl::StrCat(": ", std::strerror(errno)) : ""));
    }
    done += got;
  }
  if (halves) HalvesToFloats(halves_.data(), values, floats_.data());
  window_begin_ = begin;
  window_end_ = begin + n;
  return floats_.data();
}

absl::StatusOr<const float*> VectorsFileReader::Row(int64_t row) {
  if (row < window_begin_ || row >= window_end_) {
    absl::StatusOr<const float*> read =
        ReadRows(row, std::min(window_rows_, count_ - row));
    if (!read.ok()) return read.status();
  }
  return floats_.data() + (row - window_begin_) * dim_;
}

}  // namespace knnd
