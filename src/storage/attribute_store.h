// The attribute store of an index built with `knnctl build --attributes`
// (INDEX + ".attrs"): typed columns of per-row values, with the value ->
// rows indexes an attribute filter (index/attribute_filter.h) compiles
// from, so that no filter ever scans the rows. knnd maps it read-only: it
// lives in the shared, reclaimable page cache, never on the heap.
//
// Column types: integer (int64), float (double), timestamp (int64 epoch
// microseconds), keyword (a string, dictionary-encoded) and keyword list
// (a row holds any number of keywords: tags). Every row of every column
// either holds a value or none; a float value is never NaN (the writer
// refuses it).
//
// Layout (little-endian; every array starts on a 64-byte boundary):
//   offset 0   char[8]  magic "KNNDATTR"
//          8   uint32   format version (1)
//         12   uint32   header bytes (64)
//         16   uint64   rows
//         24   uint32   columns
//         28   uint32   CRC-32 (zlib) of every byte after the header
//         32   ...      zero up to 64
//   64         one 128-byte directory entry per column:
//                uint64 name offset, uint64 name bytes, uint32 type,
//                uint32 zero, uint64 count, then five (uint64 offset,
//                uint64 bytes) arrays: presence, then a[0..3]
//   then the names and the arrays.
// Presence: one bit per row (bit r % 64 of word r / 64), ceil(rows/64)
// words. Numeric columns (count = rows holding a value):
//   a[0] value[rows] (int64 or double; 0 without a value),
//   a[1] the values held, ascending, a[2] their rows (ties by row),
//   a[3] empty.
// Keyword and keyword-list columns (count = distinct keywords):
//   a[0] uint64 string offsets[count + 1] into a[1], the keywords' bytes,
//   sorted bytewise; a[2] uint64 posting offsets[count + 1] into a[3], the
//   rows (int64, ascending) holding each keyword.
//
// Thread-safety: an AttributeStore is immutable once opened; any number of
// threads may read it. Ownership: it owns its mapping; Column views borrow
// it.
#ifndef KNND_STORAGE_ATTRIBUTE_STORE_H_
#define KNND_STORAGE_ATTRIBUTE_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "knnd/faiss/mapped_file.h"

namespace knnd {

inline constexpr uint32_t kAttributeStoreFormatVersion = 1;

enum class AttributeType : uint32_t {
  kInteger = 1,
  kFloat = 2,
  kTimestamp = 3,
  kKeyword = 4,
  kKeywordList = 5,
};
// "integer", "float", "timestamp", "keyword", "keyword_list".
const char* AttributeTypeName(AttributeType type);
inline bool IsNumeric(AttributeType type) {
  return type == AttributeType::kInteger || type == AttributeType::kFloat ||
         type == AttributeType::kTimestamp;
}

// index_path + ".attrs".
std::string AttributeStorePath(const std::string& index_path);

// One column in memory: what `knnctl build` reads (attribute_jsonl.h) or
// slices from a store for a shard, and WriteAttributeStore() writes.
struct AttributeColumn {
  std::string name;
  AttributeType type = AttributeType::kInteger;
  std::vector<bool> present;  // per row
  // Integer and timestamp columns: per row (0 without a value).
  std::vector<int64_t> ints;
  // Float columns: per row (0 without a value).
  std::vector<double> floats;
  // Keyword and keyword-list columns: row r holds the keywords
  // dictionary[codes[i]] for i in [offsets[r], offsets[r + 1]).
  std::vector<std::string> dictionary;
  std::vector<int64_t> offsets;  // rows + 1
  std::vector<uint32_t> codes;
};

struct AttributeColumns {
  int64_t rows = 0;
  std::vector<AttributeColumn> columns;  // distinct names
};

// The heap bytes `columns` holds (its arrays' capacities and keyword
// strings), for the memory model of a build.
int64_t AttributeColumnsHeldBytes(const AttributeColumns& columns);

// Rows [first, end) of `columns`, for a shard's store.
AttributeColumns SliceColumns(const AttributeColumns& columns, int64_t first,
                              int64_t end);

// Writes `columns` to `path` (a temporary file, synced and renamed into
// place). INVALID_ARGUMENT when a column's arrays do not hold `rows` rows
// or two columns share a name.
absl::Status WriteAttributeStore(const std::string& path,
                                 const AttributeColumns& columns);

class AttributeStore {
 public:
  // A view of one mapped column; valid while its store lives.
  struct Column {
    std::string name;
    AttributeType type = AttributeType::kInteger;
    int64_t rows = 0;
    int64_t count = 0;  // numeric: rows holding a value; else keywords
    const uint64_t* presence = nullptr;
    // Numeric: values per row (read ints for integer and timestamp,
    // floats for float), and the values held ascending with their rows.
    const int64_t* ints = nullptr;
    const double* floats = nullptr;
    const int64_t* sorted_ints = nullptr;
    const double* sorted_floats = nullptr;
    const int64_t* sorted_rows = nullptr;
    // Keyword columns.
    const uint64_t* keyword_offsets = nullptr;
    const char* keyword_bytes = nullptr;
    const uint64_t* posting_offsets = nullptr;
    const int64_t* postings = nullptr;

    bool Has(int64_t row) const {
      return (presence[row >> 6] >> (row & 63)) & 1;
    }
    absl::string_view Keyword(int64_t i) const {
      return absl::string_view(keyword_bytes + keyword_offsets[i],
                               keyword_offsets[i + 1] - keyword_offsets[i]);
    }
    // The index of `keyword` in the dictionary, or -1. O(log count).
    int64_t FindKeyword(absl::string_view keyword) const;
    // The rows holding keyword i, ascending.
    absl::Span<const int64_t> Postings(int64_t i) const {
      return absl::Span<const int64_t>(
          postings + posting_offsets[i],
          posting_offsets[i + 1] - posting_offsets[i]);
    }
  };

  // Maps `path` read-only and checks its header and directory against the
  // file size and against the index it belongs to (`expect_rows` rows);
  // with `verify_checksum` also reads it once to check its CRC-32.
  // NOT_FOUND (no file), DATA_LOSS (bad magic, size, array bounds,
  // checksum), INVALID_ARGUMENT (rows of another index, unknown version),
  // each naming the file and what is wrong.
  static absl::StatusOr<std::unique_ptr<AttributeStore>> Open(
      const std::string& path, int64_t expect_rows, bool verify_checksum);

  const std::string& path() const { return file_->path(); }
  int64_t rows() const { return rows_; }
  int64_t file_bytes() const { return static_cast<int64_t>(file_->size()); }
  // The CRC-32 of the content its header records (what VerifyChecksum()
  // checks the bytes against; a version manifest binds it).
  uint32_t content_crc32() const { return header_crc32_; }
  const std::vector<Column>& columns() const { return columns_; }
  // The column named `name`, or nullptr.
  const Column* Find(absl::string_view name) const;

  // Rows [first, end) of every column, in memory, for a shard's store.
  AttributeColumns Slice(int64_t first, int64_t end) const;

  // Reads the file once and checks its CRC-32 against the header's:
  // DATA_LOSS naming both values on a mismatch; CANCELLED when `cancel`
  // turned true during the read.
  absl::Status VerifyChecksum(const std::atomic<bool>* cancel = nullptr) const;

 private:
  AttributeStore(std::unique_ptr<MappedFile> file, int64_t rows,
                 uint32_t crc32, std::vector<Column> columns);

  std::unique_ptr<MappedFile> file_;
  int64_t rows_;
  uint32_t header_crc32_;
  std::vector<Column> columns_;  // in the file's order
};

}  // namespace knnd

#endif  // KNND_STORAGE_ATTRIBUTE_STORE_H_
