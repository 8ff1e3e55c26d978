// The raw-vectors file of an index (INDEX + ".vectors"): the exact vectors,
// row i holding the index's i-th vector (whose id is i, or with an id table
// the table's id of row i: id_table.h), used to re-rank IVF-PQ candidates
// by their exact distance. Written by
// `knnctl build --keep_vectors`, memory-mapped read-only by knnd, so the
// vectors live in the shared, reclaimable page cache and never on the heap.
// The mapping is advised MADV_RANDOM: a row read from disk (the file
// larger than the memory left for it) reads its own pages, not the
// device's read-ahead around them; VerifyChecksum()'s one pass reads
// ahead.
//
// Layout (little-endian), rows start on a 64-byte boundary:
//   offset 0   char[8]  magic "KNNDVEC\0"
//          8   uint32   format version (1)
//         12   uint32   dtype: 1 = float32, 2 = float16 (IEEE half)
//         16   uint32   dim
//         20   uint32   header bytes (64): where row 0 starts
//         24   uint64   count (rows)
//         32   uint32   CRC-32 (zlib) of the payload: count * dim * bytes
//         36   ...      zero up to 64
//   64         count * dim values, row-major
// The file size must be exactly header + count * dim * bytes(dtype).
//
// Thread-safety: VectorsFileWriter is used by one thread. A VectorsFile is
// immutable once opened; its accessors are safe from any number of threads.
// Ownership: a VectorsFile owns its mapping and unmaps it when destroyed.
#ifndef KNND_STORAGE_VECTORS_FILE_H_
#define KNND_STORAGE_VECTORS_FILE_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "knnd/faiss/vector_math.h"

namespace knnd {

enum class VectorsDtype : uint32_t { kFloat32 = 1, kFloat16 = 2 };

const char* VectorsDtypeName(VectorsDtype dtype);  // "f32" or "f16"
// Accepts "f32", "float32", "f16", "float16"; else INVALID_ARGUMENT.
absl::StatusOr<VectorsDtype> ParseVectorsDtype(absl::string_view name);
int VectorsDtypeBytes(VectorsDtype dtype);  // 4 or 2

inline constexpr uint32_t kVectorsFormatVersion = 1;
inline constexpr int64_t kVectorsHeaderBytes = 64;

// index_path + ".vectors".
std::string VectorsPath(const std::string& index_path);

// IEEE 754 half <-> float: FloatToHalf / HalfToFloat (faiss/vector_math.h).

// Streams rows into `path`: first into a temporary file in the same
// directory, renamed over `path` by Finish() once every row is written and
// the header completed, so a reader never sees half a file.
class VectorsFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<VectorsFileWriter>> Create(
      const std::string& path, int dim, VectorsDtype dtype);
  ~VectorsFileWriter();  // removes the temporary file unless Finish() ran
  VectorsFileWriter(const VectorsFileWriter&) = delete;
  VectorsFileWriter& operator=(const VectorsFileWriter&) = delete;

  // Appends `rows` rows of dim floats (converted to the dtype).
  absl::Status Append(const float* vectors, int64_t rows);
  // Writes the header (count, CRC-32), syncs and renames into place.
  absl::Status Finish();

  int64_t rows() const { return rows_; }

 private:
  VectorsFileWriter(std::string path, std::string temp, FILE* file, int dim,
                    VectorsDtype dtype)
      : path_(std::move(path)), temp_(std::move(temp)), file_(file),
        dim_(dim), dtype_(dtype) {}

  const std::string path_;
  const std::string temp_;
  FILE* file_;
  const int dim_;
  const VectorsDtype dtype_;
  int64_t rows_ = 0;
  unsigned long crc_ = 0;
  bool finished_ = false;
};

class VectorsFile {
 public:
  // Maps `path` read-only and checks the header against the file size and
  // against the index it belongs to (`expect_dim`, `expect_count`); with
  // `verify_checksum` also reads the payload once to check its CRC-32.
  // Errors name the file, the field, the expected and the actual value:
  // NOT_FOUND (no file), DATA_LOSS (bad magic, size, checksum),
  // INVALID_ARGUMENT (dim/count of another index, unknown version/dtype).
  static absl::StatusOr<std::unique_ptr<VectorsFile>> Open(
      const std::string& path, int expect_dim, int64_t expect_count,
      bool verify_checksum);

  ~VectorsFile();
  VectorsFile(const VectorsFile&) = delete;
  VectorsFile& operator=(const VectorsFile&) = delete;

  const std::string& path() const { return path_; }
  int dim() const { return dim_; }
  int64_t count() const { return count_; }
  VectorsDtype dtype() const { return dtype_; }
  int64_t file_bytes() const { return file_bytes_; }
  // The CRC-32 of the content its header records (what VerifyChecksum()
  // checks the bytes against; a version manifest binds it).
  uint32_t content_crc32() const { return header_crc32_; }
  // Row `id` (0 <= id < count): dim values of dtype().
  const void* row(int64_t id) const {
    return rows_ + id * row_bytes_;
  }
  // Starts loading row `id`'s first two cache lines, and with them its
  // page's address translation, without waiting: a caller about to read
  // many scattered rows asks for all of them first, so that their misses
  // overlap instead of each row's read starting with one (re-ranking 48
  // Fashion-MNIST rows: 36 -> 21 us, bench/RESULTS.md "Peers"). Never
  // faults, whatever the row.
  void PrefetchRow(int64_t id) const {
    const char* p = rows_ + id * row_bytes_;
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
  }
  // Row `id` as dim floats: the mapped row itself for float32, else
  // `scratch` (dim floats) holding it decoded from float16.
  const float* RowAsFloats(int64_t id, float* scratch) const;
  // Reads the payload once and checks its CRC-32 against the header's:
  // what Open() does with verify_checksum. DATA_LOSS naming both values on
  // a mismatch; CANCELLED when `cancel` turned true during the read.
  absl::Status VerifyChecksum(const std::atomic<bool>* cancel = nullptr) const;

 private:
  VectorsFile() = default;

  std::string path_;
  int dim_ = 0;
  int64_t count_ = 0;
  VectorsDtype dtype_ = VectorsDtype::kFloat32;
  int64_t file_bytes_ = 0;
  int64_t row_bytes_ = 0;
  void* map_ = nullptr;
  const char* rows_ = nullptr;
  uint32_t header_crc32_ = 0;
};

}  // namespace knnd

#endif  // KNND_STORAGE_VECTORS_FILE_H_
