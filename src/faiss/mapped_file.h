// MappedFile: a whole file mapped read-only (PROT_READ, MAP_SHARED), the
// memory behind a FastScan index's inverted lists (fastscan_index.h).
#ifndef KNND_FAISS_MAPPED_FILE_H_
#define KNND_FAISS_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace knnd {

// Owns one read-only shared mapping of a regular file; the mapping is removed
// (munmap) when the object is destroyed. The pages are the kernel's page cache:
// they count as file-backed memory (RssFile), never as anonymous memory.
//
// The file must not be rewritten in place while it is mapped (truncation makes
// a later access raise SIGBUS); knnd only ever replaces files by rename.
//
// Thread-safety: immutable after Open(); any number of threads may read the
// bytes concurrently.
class MappedFile {
 public:
  // Maps `path`. Fails (naming the path) if it cannot be opened, is not a
  // regular file, is empty or cannot be mapped.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  const std::string path_;
  const uint8_t* const data_;
  const size_t size_;
};

}  // namespace knnd

#endif  // KNND_FAISS_MAPPED_FILE_H_
