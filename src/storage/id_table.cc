#include "knnd/storage/id_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

constexpr char kMagic[8] = {'K', 'N', 'N', 'D', 'I', 'D', 'S', '\0'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t count;
  uint32_t crc32;
  char reserved[36];
};
static_assert(sizeof(Header) == kIdTableHeaderBytes, "header is 64 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the id table is read in place as little-endian");

constexpr int64_t kBytesPerRow = 3 * sizeof(int64_t);

}  // namespace

std::string IdTablePath(const std::string& index_path) {
  return index_path + ".ids";
}

absl::Status CheckIdsNonNegative(absl::Span<const int64_t> ids,
                                 absl::string_view source) {
  for (size_t row = 0; row < ids.size(); ++row) {
    if (ids[row] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": row ", row, " holds id ", ids[row],
          ", which is negative; ids must be >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> SortedIdRows(
    absl::Span<const int64_t> ids, absl::string_view source) {
  if (absl::Status s = CheckIdsNonNegative(ids, source); !s.ok()) return s;
  std::vector<std::pair<int64_t, int64_t>> pairs(ids.size());
  for (size_t row = 0; row < ids.size(); ++row) {
    pairs[row] = {ids[row], static_cast<int64_t>(row)};
  }
  std::sort(pairs.begin(), pairs.end());
  const auto dup = std::adjacent_find(
      pairs.begin(), pairs.end(),
      [](const auto& a, const auto& b) { return a.first == b.first; });
  if (dup != pairs.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": row ", (dup + 1)->second, " holds id ", dup->first,
        ", which row ", dup->second, " holds too; ids must be distinct"));
  }
  return pairs;
}

absl::Status WriteIdTable(const std::string& path,
                          absl::Span<const int64_t> ids,
                          absl::string_view source) {
  absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> pairs =
      SortedIdRows(ids, source);
  if (!pairs.ok()) return pairs.status();
  const size_t n = ids.size();
  std::string contents(kIdTableHeaderBytes + kBytesPerRow * n, '\0');
  auto* arrays = reinterpret_cast<int64_t*>(&contents[kIdTableHeaderBytes]);
  std::copy(ids.begin(), ids.end(), arrays);
  for (size_t i = 0; i < n; ++i) {
    arrays[n + i] = (*pairs)[i].first;
    arrays[2 * n + i] = (*pairs)[i].second;
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kIdTableFormatVersion;
  header.header_bytes = static_cast<uint32_t>(kIdTableHeaderBytes);
  header.count = n;
  header.crc32 = static_cast<uint32_t>(
      *ExtendCrc32(InitialCrc32(), arrays, kBytesPerRow * n));
  std::memcpy(&contents[0], &header, sizeof header);
  return WriteFileAtomically(path, contents);
}

IdTable::IdTable(std::unique_ptr<MappedFile> file, int64_t count,
                 uint32_t crc32)
    : file_(std::move(file)), count_(count), header_crc32_(crc32) {
  ids_ = reinterpret_cast<const int64_t*>(file_->data() + kIdTableHeaderBytes);
  sorted_ = ids_ + count_;
  row_of_ = sorted_ + count_;
}

absl::StatusOr<std::unique_ptr<IdTable>> IdTable::Open(
    const std::string& path, int64_t expect_count, bool verify_checksum) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(
          absl::StrCat("id table ", path, " does not exist"));
    }
    return absl::Status(file.status().code(),
                        absl::StrCat("id table: ", file.status().message()));
  }
  auto bad = [&path](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("id table ", path, " is corrupt: ", what));
  };
  const int64_t size = static_cast<int64_t>((*file)->size());
  if (size < kIdTableHeaderBytes) {
    return bad(absl::StrCat("it has ", size, " bytes, less than the ",
                            kIdTableHeaderBytes, "-byte header"));
  }
  Header header;
  std::memcpy(&header, (*file)->data(), sizeof header);
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) {
    return bad("bad magic (expected \"KNNDIDS\"); not a knnd id table");
  }
  if (header.version != kIdTableFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id table ", path, ": format version ", header.version,
        " is not the version ", kIdTableFormatVersion,
        " this knnd understands"));
  }
  if (header.header_bytes != kIdTableHeaderBytes) {
    return bad(absl::StrCat("header_bytes=", header.header_bytes,
                            ", expected ", kIdTableHeaderBytes));
  }
  if (header.count != static_cast<uint64_t>(expect_count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "id table ", path, " has count=", header.count,
        " rows but the index has ntotal=", expect_count));
  }
  const int64_t expect_size =
      kIdTableHeaderBytes + kBytesPerRow * expect_count;
  if (size != expect_size) {
    return bad(absl::StrFormat(
        "size %d bytes, expected header %d + count %d * %d bytes = %d; the "
        "file is truncated or was overwritten",
        size, kIdTableHeaderBytes, expect_count, kBytesPerRow, expect_size));
  }
  std::unique_ptr<IdTable> table(
      new IdTable(std::move(*file), expect_count, header.crc32));
  if (verify_checksum) {
    if (absl::Status s = table->VerifyChecksum(); !s.ok()) return s;
  }
  return table;
}

int64_t IdTable::RowOf(int64_t id) const {
  const int64_t* end = sorted_ + count_;
  const int64_t* it = std::lower_bound(sorted_, end, id);
  if (it == end || *it != id) return -1;
  const int64_t row = row_of_[it - sorted_];
  // A table changed after its checksum was verified must not send a read
  // outside the rows.
  return row >= 0 && row < count_ ? row : -1;
}

absl::Status IdTable::VerifyChecksum(const std::atomic<bool>* cancel) const {
  return VerifyPayloadCrc32(absl::StrCat("id table ", path()), ids_,
                            static_cast<size_t>(kBytesPerRow * count_),
                            header_crc32_, cancel);
}

}  // namespace knnd
