#include "knnd/storage/attribute_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

constexpr char kMagic[8] = {'K', 'N', 'N', 'D', 'A', 'T', 'T', 'R'};
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kAlign = 64;
constexpr int kArrays = 4;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t rows;
  uint32_t columns;
  uint32_t crc32;
  char reserved[32];
};
static_assert(sizeof(Header) == kHeaderBytes, "header is 64 bytes");

struct Extent {
  uint64_t offset;
  uint64_t bytes;
};

struct DirectoryEntry {
  uint64_t name_offset;
  uint64_t name_bytes;
  uint32_t type;
  uint32_t zero;
  uint64_t count;
  Extent presence;
  Extent arrays[kArrays];
  char reserved[16];
};
static_assert(sizeof(DirectoryEntry) == 128, "directory entries are 128 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the attribute store is read in place as little-endian");

bool KnownType(uint32_t type) {
  return type >= static_cast<uint32_t>(AttributeType::kInteger) &&
         type <= static_cast<uint32_t>(AttributeType::kKeywordList);
}

// The file being written: arrays appended at 64-byte boundaries.
class Writer {
 public:
  explicit Writer(int64_t start) : contents_(static_cast<size_t>(start), '\0') {}

  Extent Append(const void* data, size_t bytes) {
    contents_.resize((contents_.size() + kAlign - 1) / kAlign * kAlign, '\0');
    const Extent extent{contents_.size(), bytes};
    contents_.append(static_cast<const char*>(data), bytes);
    return extent;
  }
  template <typename T>
  Extent Append(const std::vector<T>& values) {
    return Append(values.data(), values.size() * sizeof(T));
  }
  std::string& contents() { return contents_; }

 private:
  std::string contents_;
};

std::vector<uint64_t> PresenceWords(const std::vector<bool>& present) {
  std::vector<uint64_t> words((present.size() + 63) / 64, 0);
  for (size_t r = 0; r < present.size(); ++r) {
    if (present[r]) words[r / 64] |= uint64_t{1} << (r % 64);
  }
  return words;
}

template <typename T>
void AppendNumeric(const std::vector<T>& values,
                   const std::vector<bool>& present, Writer& out,
                   DirectoryEntry& entry) {
  std::vector<int64_t> rows;
  for (size_t r = 0; r < values.size(); ++r) {
    if (present[r]) rows.push_back(static_cast<int64_t>(r));
  }
  std::stable_sort(rows.begin(), rows.end(), [&values](int64_t a, int64_t b) {
    return values[a] < values[b];
  });
  std::vector<T> sorted(rows.size());
  std::vector<T> held(values.size(), T{});
  for (size_t i = 0; i < rows.size(); ++i) {
    sorted[i] = values[rows[i]];
    held[rows[i]] = values[rows[i]];
  }
  entry.count = rows.size();
  entry.arrays[0] = out.Append(held);
  entry.arrays[1] = out.Append(sorted);
  entry.arrays[2] = out.Append(rows);
}

// Dictionary sorted bytewise and each keyword's rows; `column` is checked.
absl::Status AppendKeywords(const AttributeColumn& column, int64_t rows,
                            Writer& out, DirectoryEntry& entry) {
  const size_t n = column.dictionary.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&column](uint32_t a, uint32_t b) {
    return column.dictionary[a] < column.dictionary[b];
  });
  std::vector<uint32_t> rank(n);
  std::vector<uint64_t> keyword_offsets(n + 1, 0);
  std::string bytes;
  for (size_t i = 0; i < n; ++i) {
    const std::string& keyword = column.dictionary[order[i]];
    if (i > 0 && keyword == column.dictionary[order[i - 1]]) {
      return absl::InvalidArgumentError(
          absl::StrCat("attribute \"", column.name, "\": keyword \"", keyword,
                       "\" is twice in its dictionary"));
    }
    rank[order[i]] = static_cast<uint32_t>(i);
    bytes += keyword;
    keyword_offsets[i + 1] = bytes.size();
  }
  std::vector<std::vector<int64_t>> rows_of(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = column.offsets[r]; i < column.offsets[r + 1]; ++i) {
      const uint32_t code = column.codes[i];
      if (code >= n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "attribute \"", column.name, "\": row ", r, " holds code ", code,
            " outside its dictionary of ", n));
      }
      std::vector<int64_t>& list = rows_of[rank[code]];
      if (list.empty() || list.back() != r) list.push_back(r);
    }
  }
  std::vector<uint64_t> posting_offsets(n + 1, 0);
  std::vector<int64_t> postings;
  for (size_t i = 0; i < n; ++i) {
    postings.insert(postings.end(), rows_of[i].begin(), rows_of[i].end());
    posting_offsets[i + 1] = postings.size();
  }
  entry.count = n;
  entry.arrays[0] = out.Append(keyword_offsets);
  entry.arrays[1] = out.Append(bytes.data(), bytes.size());
  entry.arrays[2] = out.Append(posting_offsets);
  entry.arrays[3] = out.Append(postings);
  return absl::OkStatus();
}

absl::Status CheckColumn(const AttributeColumn& column, int64_t rows) {
  const size_t n = static_cast<size_t>(rows);
  auto wrong = [&column, rows](const char* array, size_t size) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute \"", column.name, "\": ", array, " holds ",
                     size, " entries for ", rows, " rows"));
  };
  if (column.present.size() != n) return wrong("present", column.present.size());
  switch (column.type) {
    case AttributeType::kInteger:
    case AttributeType::kTimestamp:
      if (column.ints.size() != n) return wrong("ints", column.ints.size());
      break;
    case AttributeType::kFloat:
      if (column.floats.size() != n) return wrong("floats", column.floats.size());
      // NaN has no place among the sorted values a filter searches (and a
      // filter never admits it): a row holds a number or nothing.
      for (size_t r = 0; r < n; ++r) {
        if (column.present[r] && std::isnan(column.floats[r])) {
          return absl::InvalidArgumentError(
              absl::StrCat("attribute \"", column.name, "\": row ", r,
                           " holds NaN; leave the value out instead"));
        }
      }
      break;
    case AttributeType::kKeyword:
    case AttributeType::kKeywordList:
      if (column.offsets.size() != n + 1) {
        return wrong("offsets", column.offsets.size());
      }
      if (column.offsets.back() != static_cast<int64_t>(column.codes.size())) {
        return wrong("codes", column.codes.size());
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace

const char* AttributeTypeName(AttributeType type) {
  switch (type) {
    case AttributeType::kInteger:
      return "integer";
    case AttributeType::kFloat:
      return "float";
    case AttributeType::kTimestamp:
      return "timestamp";
    case AttributeType::kKeyword:
      return "keyword";
    case AttributeType::kKeywordList:
      return "keyword_list";
  }
  return "unknown";
}

std::string AttributeStorePath(const std::string& index_path) {
  return index_path + ".attrs";
}

AttributeColumns SliceColumns(const AttributeColumns& columns, int64_t first,
                              int64_t end) {
  AttributeColumns out;
  out.rows = end - first;
  for (const AttributeColumn& from : columns.columns) {
    AttributeColumn& to = out.columns.emplace_back();
    to.name = from.name;
    to.type = from.type;
    to.present.assign(from.present.begin() + first, from.present.begin() + end);
    if (!from.ints.empty()) {
      to.ints.assign(from.ints.begin() + first, from.ints.begin() + end);
    }
    if (!from.floats.empty()) {
      to.floats.assign(from.floats.begin() + first, from.floats.begin() + end);
    }
    if (from.offsets.empty()) continue;
    to.dictionary = from.dictionary;
    to.codes.assign(from.codes.begin() + from.offsets[first],
                    from.codes.begin() + from.offsets[end]);
    to.offsets.reserve(static_cast<size_t>(out.rows) + 1);
    for (int64_t r = first; r <= end; ++r) {
      to.offsets.push_back(from.offsets[r] - from.offsets[first]);
    }
  }
  return out;
}

int64_t AttributeColumnsHeldBytes(const AttributeColumns& columns) {
  int64_t bytes = 0;
  for (const AttributeColumn& column : columns.columns) {
    bytes += static_cast<int64_t>(column.present.capacity() / 8 +
                                  column.ints.capacity() * sizeof(int64_t) +
                                  column.floats.capacity() * sizeof(double) +
                                  column.offsets.capacity() * sizeof(int64_t) +
                                  column.codes.capacity() * sizeof(uint32_t));
    for (const std::string& keyword : column.dictionary) {
      bytes += static_cast<int64_t>(sizeof(std::string) + keyword.capacity());
    }
  }
  return bytes;
}

absl::Status WriteAttributeStore(const std::string& path,
                                 const AttributeColumns& columns) {
  absl::flat_hash_set<std::string> names;
  for (const AttributeColumn& column : columns.columns) {
    if (!names.insert(column.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": two attribute columns are named \"", column.name, "\""));
    }
    if (absl::Status s = CheckColumn(column, columns.rows); !s.ok()) return s;
  }
  const size_t c = columns.columns.size();
  std::vector<DirectoryEntry> directory(c);
  Writer out(kHeaderBytes + static_cast<int64_t>(c * sizeof(DirectoryEntry)));
  for (size_t i = 0; i < c; ++i) {
    const AttributeColumn& column = columns.columns[i];
    DirectoryEntry& entry = directory[i];
    std::memset(&entry, 0, sizeof entry);
    entry.type = static_cast<uint32_t>(column.type);
    const Extent name = out.Append(column.name.data(), column.name.size());
    entry.name_offset = name.offset;
    entry.name_bytes = name.bytes;
    entry.presence = out.Append(PresenceWords(column.present));
    switch (column.type) {
      case AttributeType::kInteger:
      case AttributeType::kTimestamp:
        AppendNumeric(column.ints, column.present, out, entry);
        break;
      case AttributeType::kFloat:
        AppendNumeric(column.floats, column.present, out, entry);
        break;
      case AttributeType::kKeyword:
      case AttributeType::kKeywordList:
        if (absl::Status s = AppendKeywords(column, columns.rows, out, entry);
            !s.ok()) {
          return s;
        }
        break;
    }
  }
  std::string& contents = out.contents();
  std::memcpy(&contents[kHeaderBytes], directory.data(),
              c * sizeof(DirectoryEntry));
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kAttributeStoreFormatVersion;
  header.header_bytes = static_cast<uint32_t>(kHeaderBytes);
  header.rows = static_cast<uint64_t>(columns.rows);
  header.columns = static_cast<uint32_t>(c);
  header.crc32 = static_cast<uint32_t>(*ExtendCrc32(
      InitialCrc32(), contents.data() + kHeaderBytes,
      contents.size() - kHeaderBytes));
  std::memcpy(&contents[0], &header, sizeof header);
  return WriteFileAtomically(path, contents);
}

AttributeStore::AttributeStore(std::unique_ptr<MappedFile> file, int64_t rows,
                               uint32_t crc32, std::vector<Column> columns)
    : file_(std::move(file)),
      rows_(rows),
      header_crc32_(crc32),
      columns_(std::move(columns)) {}

absl::StatusOr<std::unique_ptr<AttributeStore>> AttributeStore::Open(
    const std::string& path, int64_t expect_rows, bool verify_checksum) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(
          absl::StrCat("attribute store ", path, " does not exist"));
    }
    return absl::Status(
        file.status().code(),
        absl::StrCat("attribute store: ", file.status().message()));
  }
  auto bad = [&path](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("attribute store ", path, " is corrupt: ", what));
  };
  const uint8_t* base = (*file)->data();
  const uint64_t size = (*file)->size();
  if (size < static_cast<uint64_t>(kHeaderBytes)) {
    return bad(absl::StrCat("it has ", size, " bytes, less than the ",
                            kHeaderBytes, "-byte header"));
  }
  Header header;
  std::memcpy(&header, base, sizeof header);
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) {
    return bad("bad magic (expected \"KNNDATTR\"); not a knnd attribute store");
  }
  if (header.version != kAttributeStoreFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attribute store ", path, ": format version ", header.version,
        " is not the version ", kAttributeStoreFormatVersion,
        " this knnd understands"));
  }
  if (header.header_bytes != kHeaderBytes) {
    return bad(absl::StrCat("header_bytes=", header.header_bytes,
                            ", expected ", kHeaderBytes));
  }
  if (header.rows != static_cast<uint64_t>(expect_rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute store ", path, " has rows=", header.rows,
                     " but the index has ntotal=", expect_rows));
  }
  const uint64_t directory_end =
      kHeaderBytes + uint64_t{header.columns} * sizeof(DirectoryEntry);
  if (directory_end > size) {
    return bad(absl::StrCat("its directory of ", header.columns,
                            " columns ends at byte ", directory_end,
                            ", past the file's ", size, " bytes"));
  }
  if (verify_checksum) {
    if (absl::Status s = VerifyPayloadCrc32(
            absl::StrCat("attribute store ", path), base + kHeaderBytes,
            size - kHeaderBytes, header.crc32, nullptr);
        !s.ok()) {
      return s;
    }
  }
  const uint64_t rows = header.rows;
  const uint64_t words = (rows + 63) / 64;
  std::vector<Column> columns(header.columns);
  absl::flat_hash_set<std::string> names;
  for (uint32_t i = 0; i < header.columns; ++i) {
    DirectoryEntry entry;
    std::memcpy(&entry, base + kHeaderBytes + i * sizeof entry, sizeof entry);
    // An extent inside the file after the directory, aligned for its type,
    // `expect` bytes long.
    auto extent_ok = [&](const Extent& e, uint64_t expect, uint64_t align) {
      return e.offset >= directory_end && e.offset <= size &&
             e.bytes <= size - e.offset && e.offset % align == 0 &&
             e.bytes == expect;
    };
    if (!extent_ok(Extent{entry.name_offset, entry.name_bytes},
                   entry.name_bytes, 1) ||
        !KnownType(entry.type)) {
      return bad(absl::StrCat("directory entry ", i, " has a bad name or "
                              "type ", entry.type));
    }
    Column& column = columns[i];
    column.name.assign(reinterpret_cast<const char*>(base + entry.name_offset),
                       entry.name_bytes);
    if (!names.insert(column.name).second) {
      return bad(absl::StrCat("column \"", column.name, "\" is listed twice"));
    }
    column.type = static_cast<AttributeType>(entry.type);
    column.rows = static_cast<int64_t>(rows);
    column.count = static_cast<int64_t>(entry.count);
    auto array_error = [&](int a) {
      return bad(absl::StrCat("column \"", column.name, "\" (",
                              AttributeTypeName(column.type), "): array ", a,
                              " lies outside the file or has the wrong size "
                              "for ", rows, " rows and count ", entry.count));
    };
    if (!extent_ok(entry.presence, words * 8, kAlign)) return array_error(-1);
    column.presence =
        reinterpret_cast<const uint64_t*>(base + entry.presence.offset);
    auto at = [&](int a) { return base + entry.arrays[a].offset; };
    if (IsNumeric(column.type)) {
      if (entry.count > rows || !extent_ok(entry.arrays[0], rows * 8, kAlign) ||
          !extent_ok(entry.arrays[1], entry.count * 8, kAlign) ||
          !extent_ok(entry.arrays[2], entry.count * 8, kAlign)) {
        return array_error(0);
      }
      if (column.type == AttributeType::kFloat) {
        column.floats = reinterpret_cast<const double*>(at(0));
        column.sorted_floats = reinterpret_cast<const double*>(at(1));
      } else {
        column.ints = reinterpret_cast<const int64_t*>(at(0));
        column.sorted_ints = reinterpret_cast<const int64_t*>(at(1));
      }
      column.sorted_rows = reinterpret_cast<const int64_t*>(at(2));
      continue;
    }
    const uint64_t offsets_bytes = (entry.count + 1) * 8;
    if (entry.count >= size || !extent_ok(entry.arrays[0], offsets_bytes, kAlign) ||
        !extent_ok(entry.arrays[2], offsets_bytes, kAlign)) {
      return array_error(0);
    }
    column.keyword_offsets = reinterpret_cast<const uint64_t*>(at(0));
    column.posting_offsets = reinterpret_cast<const uint64_t*>(at(2));
    // Offsets never decrease and end at their array's size, so that no
    // keyword or posting list reaches outside the file.
    for (uint64_t k = 0; k < entry.count; ++k) {
      if (column.keyword_offsets[k] > column.keyword_offsets[k + 1] ||
          column.posting_offsets[k] > column.posting_offsets[k + 1]) {
        return bad(absl::StrCat("column \"", column.name,
                                "\": offsets decrease at keyword ", k));
      }
    }
    if (column.keyword_offsets[0] != 0 || column.posting_offsets[0] != 0 ||
        !extent_ok(entry.arrays[1], column.keyword_offsets[entry.count], 1) ||
        !extent_ok(entry.arrays[3], column.posting_offsets[entry.count] * 8,
                   kAlign)) {
      return array_error(1);
    }
    column.keyword_bytes = reinterpret_cast<const char*>(at(1));
    column.postings = reinterpret_cast<const int64_t*>(at(3));
  }
  return std::unique_ptr<AttributeStore>(new AttributeStore(
      std::move(*file), static_cast<int64_t>(rows), header.crc32,
      std::move(columns)));
}

int64_t AttributeStore::Column::FindKeyword(absl::string_view keyword) const {
  int64_t lo = 0;
  int64_t hi = count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (Keyword(mid) < keyword) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < count && Keyword(lo) == keyword ? lo : -1;
}

const AttributeStore::Column* AttributeStore::Find(
    absl::string_view name) const {
  for (const Column& column : columns_) {
    if (column.name == name) return &column;
  }
  return nullptr;
}

AttributeColumns AttributeStore::Slice(int64_t first, int64_t end) const {
  AttributeColumns out;
  out.rows = end - first;
  const size_t n = static_cast<size_t>(out.rows);
  for (const Column& from : columns_) {
    AttributeColumn& to = out.columns.emplace_back();
    to.name = from.name;
    to.type = from.type;
    to.present.resize(n);
    for (int64_t r = first; r < end; ++r) to.present[r - first] = from.Has(r);
    if (from.type == AttributeType::kFloat) {
      to.floats.assign(from.floats + first, from.floats + end);
      continue;
    }
    if (IsNumeric(from.type)) {
      to.ints.assign(from.ints + first, from.ints + end);
      continue;
    }
    // Each row's keywords from the postings: count, then place.
    std::vector<std::pair<int64_t, uint32_t>> held;  // (row - first, code)
    for (int64_t k = 0; k < from.count; ++k) {
      to.dictionary.emplace_back(from.Keyword(k));
      const absl::Span<const int64_t> rows = from.Postings(k);
      for (auto it = std::lower_bound(rows.begin(), rows.end(), first);
           it != rows.end() && *it < end; ++it) {
        held.emplace_back(*it - first, static_cast<uint32_t>(k));
      }
    }
    std::sort(held.begin(), held.end());
    to.offsets.assign(n + 1, 0);
    for (const auto& [row, code] : held) {
      ++to.offsets[row + 1];
      to.codes.push_back(code);
    }
    for (size_t r = 0; r < n; ++r) to.offsets[r + 1] += to.offsets[r];
  }
  return out;
}

absl::Status AttributeStore::VerifyChecksum(
    const std::atomic<bool>* cancel) const {
  return VerifyPayloadCrc32(absl::StrCat("attribute store ", path()),
                            file_->data() + kHeaderBytes,
                            file_->size() - kHeaderBytes, header_crc32_,
                            cancel);
}

}  // namespace knnd
