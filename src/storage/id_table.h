// The id table of an index built with its user's own ids (INDEX + ".ids",
// written by `knnctl build --ids`): inside the index every vector has a
// dense row number, which the inverted lists, the raw-vectors file
// (vectors_file.h) and whatever else is stored per vector are addressed
// by; the table translates rows to the user's ids (answers) and ids to rows
// (allow-lists), so the ids need not be dense: any distinct int64 >= 0, in
// any order (database keys, 63-bit hashes). knnd maps it read-only, so it
// lives in the shared, reclaimable page cache, never on the heap.
//
// Layout (little-endian), the arrays start on a 64-byte boundary:
//   offset 0   char[8]  magic "KNNDIDS\0"
//          8   uint32   format version (1)
//         12   uint32   header bytes (64): where the arrays start
//         16   uint64   count (rows)
//         24   uint32   CRC-32 (zlib) of the three arrays: 24 * count bytes
//         28   ...      zero up to 64
//   64               int64 id[count]          row -> id
//   64 + 8 * count   int64 sorted_id[count]   the ids ascending
//   64 + 16 * count  int64 row_of[count]      row of sorted_id[i]
// The file size must be exactly 64 + 24 * count bytes.
//
// Thread-safety: an IdTable is immutable once opened; its accessors are
// safe from any number of threads. Ownership: it owns its mapping.
#ifndef KNND_STORAGE_ID_TABLE_H_
#define KNND_STORAGE_ID_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "knnd/faiss/mapped_file.h"

namespace knnd {

inline constexpr uint32_t kIdTableFormatVersion = 1;
inline constexpr int64_t kIdTableHeaderBytes = 64;

// index_path + ".ids".
std::string IdTablePath(const std::string& index_path);

// OK when every id of `ids` is >= 0, else INVALID_ARGUMENT naming
// `source` (the file the ids came from), the first negative id and its row
// (0-based): the one check of build's --ids and update's --ids and
// --delete.
absl::Status CheckIdsNonNegative(absl::Span<const int64_t> ids,
                                 absl::string_view source);

// (id, row) of every row of `ids` (row i holds ids[i]), sorted by id.
// INVALID_ARGUMENT naming `source` (the file the ids came from), the row
// and the id when an id is negative or held by two rows.
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SortedIdRows(
    absl::Span<const int64_t> ids, absl::string_view source);

// Writes the table of `ids` (row i holds ids[i]) to `path`: to a temporary
// file in the same directory, synced and renamed into place. The ids are
// checked as SortedIdRows() checks them (`source` names them in errors).
absl::Status WriteIdTable(const std::string& path,
                          absl::Span<const int64_t> ids,
                          absl::string_view source);

class IdTable {
 public:
  // Maps `path` read-only and checks its header against the file size and
  // against the index it belongs to (`expect_count` rows); with
  // `verify_checksum` also reads the arrays once to check their CRC-32.
  // NOT_FOUND (no file), DATA_LOSS (bad magic, size, checksum),
  // INVALID_ARGUMENT (count of another index, unknown version), each naming
  // the file, the field and both values.
  static absl::StatusOr<std::unique_ptr<IdTable>> Open(
      const std::string& path, int64_t expect_count, bool verify_checksum);

  const std::string& path() const { return file_->path(); }
  int64_t count() const { return count_; }
  int64_t file_bytes() const { return static_cast<int64_t>(file_->size()); }
  // The CRC-32 of the content its header records (what VerifyChecksum()
  // checks the bytes against; a version manifest binds it).
  uint32_t content_crc32() const { return header_crc32_; }

  // The id of `row` (0 <= row < count()).
  int64_t IdOf(int64_t row) const { return ids_[row]; }
  // The row holding `id`, or -1 when no row does. O(log count).
  int64_t RowOf(int64_t id) const;

  // Reads the arrays once and checks their CRC-32 against the header's:
  // what Open() does with verify_checksum. DATA_LOSS naming both values on
  // a mismatch; CANCELLED when `cancel` turned true during the read.
  absl::Status VerifyChecksum(const std::atomic<bool>* cancel = nullptr) const;

 private:
  IdTable(std::unique_ptr<MappedFile> file, int64_t count, uint32_t crc32);

  std::unique_ptr<MappedFile> file_;
  int64_t count_;
  uint32_t header_crc32_;
  const int64_t* ids_;     // row -> id
  const int64_t* sorted_;  // ids ascending
  const int64_t* row_of_;  // row of sorted_[i]
};

}  // namespace knnd

#endif  // KNND_STORAGE_ID_TABLE_H_
