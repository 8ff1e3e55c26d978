// The payloads of an index (INDEX + ".payloads", written by `knnctl build
// --payloads`): per vector row a JSON object (the text of a chunk, its
// source, its page ...) that knnd returns with the row's id when a request
// asks for it. Each row's fields are stored as separate records holding
// their value as compact JSON, so that the fields a request names are cut
// out and joined without parsing anything. knnd maps the file read-only:
// it lives in the shared, reclaimable page cache, never on the heap.
//
// Layout (little-endian); each section starts on a 64-byte boundary:
//   offset 0   char[8]  magic "KNNDPAY\0"
//          8   uint32   format version (1)
//         12   uint32   header bytes (64): where the records start
//         16   uint64   count (rows)
//         24   uint32   number of fields (names in the dictionary)
//         28   uint32   CRC-32 (zlib) of every byte after the header
//         32   uint64   records bytes
//         40   uint64   dictionary bytes
//         48   uint64   largest row's payload as a JSON object, in bytes
//         56   ...      zero up to 64
//   64                          records: per row, per field it has
//                               (input order), uint32 field number,
//                               uint32 value bytes, the value
//   64 + pad64(records)         uint64 offset[count + 1]: row r's records
//                               are [offset[r], offset[r + 1]) of them
//   ... + pad64(8 * (count+1))  dictionary: per field number, uint32 name
//                               bytes, the name (UTF-8)
// The file size must be exactly the end of the dictionary.
//
// Thread-safety: PayloadFileWriter is used by one thread. A PayloadFile is
// immutable once opened; its accessors are safe from any number of threads.
// Ownership: a PayloadFile owns its mapping.
#ifndef KNND_STORAGE_PAYLOAD_FILE_H_
#define KNND_STORAGE_PAYLOAD_FILE_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "knnd/faiss/mapped_file.h"

namespace knnd {

inline constexpr uint32_t kPayloadFormatVersion = 1;
inline constexpr int64_t kPayloadHeaderBytes = 64;
// The field a payload line given as a JSON string is stored under.
inline constexpr char kPayloadTextField[] = "text";
// Distinct field names one file may hold.
inline constexpr int kMaxPayloadFields = 4096;

// index_path + ".payloads".
std::string PayloadPath(const std::string& index_path);

// One (field name, value as compact JSON) of a row.
using PayloadField = std::pair<absl::string_view, absl::string_view>;

// Streams rows into `path`: first into a temporary file in the same
// directory, renamed over `path` by Finish() once every row is written, so
// a reader never sees half a file. Holds 8 bytes per row (the offsets)
// and the field names, never the records.
class PayloadFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<PayloadFileWriter>> Create(
      const std::string& path);
  ~PayloadFileWriter();  // removes the temporary file unless Finish() ran
  PayloadFileWriter(const PayloadFileWriter&) = delete;
  PayloadFileWriter& operator=(const PayloadFileWriter&) = delete;

  // Appends the next row: one payload line, a JSON object (its members are
  // the fields) or a JSON string (stored as the field "text").
  // INVALID_ARGUMENT saying what is wrong with the line (the caller names
  // the file and line).
  absl::Status AppendJsonLine(absl::string_view line);
  // Appends the next row with `fields` (distinct names; values valid
  // compact JSON).
  absl::Status AppendFields(absl::Span<const PayloadField> fields);
  // Writes the offsets, the dictionary and the header; syncs and renames
  // into place.
  absl::Status Finish();

  int64_t rows() const { return static_cast<int64_t>(offsets_.size()) - 1; }

 private:
  PayloadFileWriter(std::string path, std::string temp, FILE* file);
  absl::Status Write(const void* data, size_t bytes);
  absl::Status PadTo64(uint64_t written);

  const std::string path_;
  const std::string temp_;
  FILE* file_;
  std::vector<uint64_t> offsets_{0};
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, uint32_t> numbers_;
  std::vector<int64_t> quoted_name_bytes_;  // per field: "name": bytes
  uint64_t max_row_json_bytes_ = 0;
  unsigned long crc_ = 0;
  bool finished_ = false;
};

// One output of WritePayloadsFromJsonLines: the rows after the previous
// part's, up to `end_row` (exclusive), go to `path`.
struct PayloadPart {
  std::string path;
  int64_t end_row = 0;
};

// Reads `jsonl` (JSON Lines: line i is the payload of row i, as
// PayloadFileWriter::AppendJsonLine takes it) one line at a time and
// writes its rows into `parts` in turn; it must hold exactly
// parts.back().end_row lines. INVALID_ARGUMENT naming the file and line
// (a bad line, a blank one, too few or too many lines); NOT_FOUND when
// the file cannot be read.
absl::Status WritePayloadsFromJsonLines(const std::string& jsonl,
                                        absl::Span<const PayloadPart> parts);

class PayloadFile;

// Writes rows [first, end) of `from` to `path` (the payloads of a shard).
absl::Status WritePayloadRows(const PayloadFile& from, int64_t first,
                              int64_t end, const std::string& path);

// The fields a request asks for, resolved against one file's dictionary.
class PayloadSelection {
 public:
  bool all() const { return all_; }
  bool wants(uint32_t field) const {
    return all_ || (field < wanted_.size() && wanted_[field]);
  }

 private:
  friend class PayloadFile;
  bool all_ = false;
  std::vector<bool> wanted_;  // by field number
};

class PayloadFile {
 public:
  // Maps `path` read-only and checks its header and sections against the
  // file size and against the index it belongs to (`expect_count` rows);
  // with `verify_checksum` also reads the file once to check its CRC-32.
  // NOT_FOUND (no file), DATA_LOSS (bad magic, size, dictionary,
  // checksum), INVALID_ARGUMENT (count of another index, unknown version),
  // each naming the file and what is wrong.
  static absl::StatusOr<std::unique_ptr<PayloadFile>> Open(
      const std::string& path, int64_t expect_count, bool verify_checksum);

  const std::string& path() const { return file_->path(); }
  int64_t count() const { return count_; }
  int64_t file_bytes() const { return static_cast<int64_t>(file_->size()); }
  // The CRC-32 of the content its header records (what VerifyChecksum()
  // checks the bytes against; a version manifest binds it).
  uint32_t content_crc32() const { return header_crc32_; }
  // Field names, by field number (first appearance in the input).
  const std::vector<std::string>& field_names() const { return names_; }
  // The largest row's JSON object with every field, in bytes.
  int64_t max_row_json_bytes() const { return max_row_json_bytes_; }

  // Every field (`all`), else the fields `names`. INVALID_ARGUMENT naming
  // an unknown field and the fields this file has.
  absl::StatusOr<PayloadSelection> Select(
      bool all, absl::Span<const std::string> names) const;

  // The bytes AppendJson() appends for `row` (0 <= row < count()).
  int64_t JsonBytes(int64_t row, const PayloadSelection& selection) const;
  // Appends row `row`'s selected fields as one compact JSON object (a
  // field the row lacks is absent: "{}" when it has none of them).
  void AppendJson(int64_t row, const PayloadSelection& selection,
                  std::string* out) const;
  // Row `row`'s fields (views into the mapping), every one of them.
  std::vector<PayloadField> Fields(int64_t row) const;

  // Reads the file once and checks its CRC-32 against the header's: what
  // Open() does with verify_checksum. DATA_LOSS naming both values on a
  // mismatch; CANCELLED when `cancel` turned true during the read.
  absl::Status VerifyChecksum(const std::atomic<bool>* cancel = nullptr) const;

 private:
  PayloadFile(std::unique_ptr<MappedFile> file, int64_t count,
              uint32_t crc32, int64_t records_bytes, int64_t offsets_at,
              int64_t max_row_json_bytes, std::vector<std::string> names);
  // Calls fn(field number, value) for each record of `row`; stops at a
  // record that would leave the row (a file damaged after it was opened
  // never sends a read outside the mapping).
  template <typename Fn>
  void ForEachRecord(int64_t row, Fn fn) const;

  std::unique_ptr<MappedFile> file_;
  int64_t count_;
  uint32_t header_crc32_;
  int64_t records_bytes_;
  const uint8_t* records_;
  const uint64_t* offsets_;
  int64_t max_row_json_bytes_;
  std::vector<std::string> names_;
  std::vector<std::string> quoted_names_;  // "name": as JSON, per field
};

}  // namespace knnd

#endif  // KNND_STORAGE_PAYLOAD_FILE_H_
