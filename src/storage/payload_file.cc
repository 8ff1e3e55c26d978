#include "knnd/storage/payload_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/json_value.h"
#include "knnd/storage/payload_crc32.h"

namespace knnd {
namespace {

constexpr char kMagic[8] = {'K', 'N', 'N', 'D', 'P', 'A', 'Y', '\0'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t count;
  uint32_t num_fields;
  uint32_t crc32;
  uint64_t records_bytes;
  uint64_t dictionary_bytes;
  uint64_t max_row_json_bytes;
  char reserved[8];
};
static_assert(sizeof(Header) == kPayloadHeaderBytes, "header is 64 bytes");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload file is read in place as little-endian");

constexpr uint64_t kRecordHeaderBytes = 2 * sizeof(uint32_t);

uint64_t Pad64(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

// `"name":` as JSON.
std::string QuotedName(absl::string_view name) {
  std::string quoted;
  AppendJsonString(name, &quoted);
  quoted.push_back(':');
  return quoted;
}

}  // namespace

std::string PayloadPath(const std::string& index_path) {
  return index_path + ".payloads";
}

// ---- Writer ----

PayloadFileWriter::PayloadFileWriter(std::string path, std::string temp,
                                     FILE* file)
    : path_(std::move(path)), temp_(std::move(temp)), file_(file) {}

absl::StatusOr<std::unique_ptr<PayloadFileWriter>> PayloadFileWriter::Create(
    const std::string& path) {
  const std::string temp = TempPathFor(path);
  FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create payload file ", temp, ": ", strerror(errno)));
  }
  std::unique_ptr<PayloadFileWriter> writer(
      new PayloadFileWriter(path, temp, file));
  const Header header{};  // completed by Finish()
  if (absl::Status s = writer->Write(&header, sizeof header); !s.ok()) {
    return s;
  }
  writer->crc_ = InitialCrc32();
  return writer;
}

PayloadFileWriter::~PayloadFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!finished_) unlink(temp_.c_str());
}

absl::Status PayloadFileWriter::Write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes) {
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp_, ": ", strerror(errno)));
  }
  crc_ = *ExtendCrc32(crc_, data, bytes);
  return absl::OkStatus();
}

absl::Status PayloadFileWriter::PadTo64(uint64_t written) {
  static constexpr char kZeros[64] = {};
  return Write(kZeros, Pad64(written) - written);
}

absl::Status PayloadFileWriter::AppendJsonLine(absl::string_view line) {
  absl::StatusOr<JsonValue> value = ParseJson(line);
  if (!value.ok()) return value.status();
  if (value->type() == JsonValue::Type::kString) {
    std::string json;
    value->AppendTo(&json);
    const PayloadField text{kPayloadTextField, json};
    return AppendFields({&text, 1});
  }
  if (value->type() != JsonValue::Type::kObject) {
    return absl::InvalidArgumentError(
        "a payload is a JSON object (its fields) or a JSON string (its "
        "text), not " + value->ToString().substr(0, 40));
  }
  std::vector<std::string> values(value->members().size());
  std::vector<PayloadField> fields(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const JsonValue::Member& member = value->members()[i];
    member.second.AppendTo(&values[i]);
    fields[i] = {member.first, values[i]};
  }
  return AppendFields(fields);
}

absl::Status PayloadFileWriter::AppendFields(
    absl::Span<const PayloadField> fields) {
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError("payload file already finished");
  }
  uint64_t row_bytes = 0;
  uint64_t json_bytes = 2 + (fields.empty() ? 0 : fields.size() - 1);
  for (const auto& [name, value] : fields) {
    auto [it, added] = numbers_.try_emplace(name, names_.size());
    if (added) {
      if (names_.size() == kMaxPayloadFields) {
        numbers_.erase(it);
        return absl::InvalidArgumentError(absl::StrCat(
            "field \"", name, "\" would be the ", kMaxPayloadFields + 1,
            "th distinct field name; at most ", kMaxPayloadFields,
            " are allowed"));
      }
      names_.emplace_back(name);
      quoted_name_bytes_.push_back(
          static_cast<int64_t>(QuotedName(name).size()));
    }
    if (value.size() > UINT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field \"", name, "\" holds ", value.size(),
          " bytes; at most 4 GiB per value"));
    }
    const uint32_t record[2] = {it->second,
                                static_cast<uint32_t>(value.size())};
    if (absl::Status s = Write(record, sizeof record); !s.ok()) return s;
    if (absl::Status s = Write(value.data(), value.size()); !s.ok()) return s;
    row_bytes += kRecordHeaderBytes + value.size();
    json_bytes += quoted_name_bytes_[it->second] + value.size();
  }
  offsets_.push_back(offsets_.back() + row_bytes);
  max_row_json_bytes_ = std::max(max_row_json_bytes_, json_bytes);
  return absl::OkStatus();
}

absl::Status PayloadFileWriter::Finish() {
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError("payload file already finished");
  }
  const uint64_t records_bytes = offsets_.back();
  if (absl::Status s = PadTo64(records_bytes); !s.ok()) return s;
  const uint64_t offsets_bytes = offsets_.size() * sizeof(uint64_t);
  if (absl::Status s = Write(offsets_.data(), offsets_bytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = PadTo64(offsets_bytes); !s.ok()) return s;
  uint64_t dictionary_bytes = 0;
  for (const std::string& name : names_) {
    const uint32_t size = static_cast<uint32_t>(name.size());
    if (absl::Status s = Write(&size, sizeof size); !s.ok()) return s;
    if (absl::Status s = Write(name.data(), name.size()); !s.ok()) return s;
    dictionary_bytes += sizeof size + name.size();
  }
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kPayloadFormatVersion;
  header.header_bytes = static_cast<uint32_t>(kPayloadHeaderBytes);
  header.count = static_cast<uint64_t>(rows());
  header.num_fields = static_cast<uint32_t>(names_.size());
  header.crc32 = static_cast<uint32_t>(crc_);
  header.records_bytes = records_bytes;
  header.dictionary_bytes = dictionary_bytes;
  header.max_row_json_bytes = max_row_json_bytes_;
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
                  std::fwrite(&header, 1, sizeof header, file_) ==
                      sizeof header &&
                  std::fflush(file_) == 0;
  const int error = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    return absl::DataLossError(
        absl::StrCat("cannot write ", temp_, ": ", strerror(error)));
  }
  if (absl::Status s = CommitTempFile(temp_, path_); !s.ok()) return s;
  finished_ = true;
  return absl::OkStatus();
}

absl::Status WritePayloadsFromJsonLines(const std::string& jsonl,
                                        absl::Span<const PayloadPart> parts) {
  std::ifstream in(jsonl, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read payloads ", jsonl,
                                            ": ", strerror(errno)));
  }
  const int64_t rows = parts.empty() ? 0 : parts.back().end_row;
  std::string line;
  int64_t row = 0;
  // Every part is finished only once the whole input proved good: a bad
  // line anywhere leaves no file (the writers remove their temporaries).
  std::vector<std::unique_ptr<PayloadFileWriter>> writers;
  for (const PayloadPart& part : parts) {
    absl::StatusOr<std::unique_ptr<PayloadFileWriter>> writer =
        PayloadFileWriter::Create(part.path);
    if (!writer.ok()) return writer.status();
    writers.push_back(std::move(*writer));
    for (; row < part.end_row; ++row) {
      if (!std::getline(in, line)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "payloads ", jsonl, " has ", row, " lines, but there are ", rows,
            " vectors: one payload line per vector row is needed"));
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "payloads ", jsonl, ":", row + 1,
            ": the line is blank; every vector row needs its payload line "
            "(\"{}\" for none)"));
      }
      if (absl::Status s = writers.back()->AppendJsonLine(line); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "payloads ", jsonl, ":", row + 1, ": ", s.message()));
      }
    }
  }
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "payloads ", jsonl, " has more lines than the ", rows,
        " vectors: line ", rows + 1, " has no vector row"));
  }
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("cannot read payloads ", jsonl, ": ", strerror(errno)));
  }
  for (const auto& writer : writers) {
    if (absl::Status s = writer->Finish(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WritePayloadRows(const PayloadFile& from, int64_t first,
                              int64_t end, const std::string& path) {
  absl::StatusOr<std::unique_ptr<PayloadFileWriter>> writer =
      PayloadFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  for (int64_t row = first; row < end; ++row) {
    if (absl::Status s = (*writer)->AppendFields(from.Fields(row)); !s.ok()) {
      return s;
    }
  }
  return (*writer)->Finish();
}

// ---- Reader ----

PayloadFile::PayloadFile(std::unique_ptr<MappedFile> file, int64_t count,
                         uint32_t crc32, int64_t records_bytes,
                         int64_t offsets_at, int64_t max_row_json_bytes,
                         std::vector<std::string> names)
    : file_(std::move(file)),
      count_(count),
      header_crc32_(crc32),
      records_bytes_(records_bytes),
      records_(file_->data() + kPayloadHeaderBytes),
      offsets_(reinterpret_cast<const uint64_t*>(file_->data() + offsets_at)),
      max_row_json_bytes_(max_row_json_bytes),
      names_(std::move(names)) {
  quoted_names_.reserve(names_.size());
  for (const std::string& name : names_) {
    quoted_names_.push_back(QuotedName(name));
  }
}

absl::StatusOr<std::unique_ptr<PayloadFile>> PayloadFile::Open(
    const std::string& path, int64_t expect_count, bool verify_checksum) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(
          absl::StrCat("payload file ", path, " does not exist"));
    }
    return absl::Status(
        file.status().code(),
        absl::StrCat("payload file: ", file.status().message()));
  }
  auto bad = [&path](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("payload file ", path, " is corrupt: ", what));
  };
  const uint64_t size = (*file)->size();
  if (size < kPayloadHeaderBytes) {
    return bad(absl::StrCat("it has ", size, " bytes, less than the ",
                            kPayloadHeaderBytes, "-byte header"));
  }
  Header header;
  std::memcpy(&header, (*file)->data(), sizeof header);
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) {
    return bad("bad magic (expected \"KNNDPAY\"); not a knnd payload file");
  }
  if (header.version != kPayloadFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload file ", path, ": format version ", header.version,
        " is not the version ", kPayloadFormatVersion,
        " this knnd understands"));
  }
  if (header.header_bytes != kPayloadHeaderBytes) {
    return bad(absl::StrCat("header_bytes=", header.header_bytes,
                            ", expected ", kPayloadHeaderBytes));
  }
  if (header.count != static_cast<uint64_t>(expect_count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload file ", path, " has count=", header.count,
        " rows but the index has ntotal=", expect_count));
  }
  // Each section within the file, computed so that nothing overflows.
  const uint64_t room = size - kPayloadHeaderBytes;
  if (header.records_bytes > room ||
      header.dictionary_bytes > room ||
      header.count > room / sizeof(uint64_t)) {
    return bad(absl::StrCat("records_bytes=", header.records_bytes,
                            " dictionary_bytes=", header.dictionary_bytes,
                            " count=", header.count, " exceed the file's ",
                            size, " bytes; the file is truncated or was "
                            "overwritten"));
  }
  const uint64_t offsets_at = kPayloadHeaderBytes + Pad64(header.records_bytes);
  const uint64_t dictionary_at =
      offsets_at + Pad64((header.count + 1) * sizeof(uint64_t));
  const uint64_t expect_size = dictionary_at + header.dictionary_bytes;
  if (size != expect_size) {
    return bad(absl::StrFormat(
        "size %d bytes, expected %d (records %d, %d offsets, dictionary %d "
        "bytes); the file is truncated or was overwritten",
        size, expect_size, header.records_bytes, header.count + 1,
        header.dictionary_bytes));
  }
  const uint8_t* data = (*file)->data();
  std::vector<std::string> names;
  uint64_t at = dictionary_at;
  for (uint32_t i = 0; i < header.num_fields; ++i) {
    uint32_t bytes = 0;
    if (size - at < sizeof bytes) {
      return bad(absl::StrCat("the dictionary ends within field ", i, " of ",
                              header.num_fields));
    }
    std::memcpy(&bytes, data + at, sizeof bytes);
    at += sizeof bytes;
    if (size - at < bytes) {
      return bad(absl::StrCat("the dictionary ends within field ", i, " of ",
                              header.num_fields));
    }
    names.emplace_back(reinterpret_cast<const char*>(data + at), bytes);
    at += bytes;
  }
  if (at != size) {
    return bad(absl::StrCat("the dictionary's ", header.num_fields,
                            " names end at byte ", at, " of ", size));
  }
  std::unique_ptr<PayloadFile> payloads(new PayloadFile(
      std::move(*file), expect_count, header.crc32,
      static_cast<int64_t>(header.records_bytes),
      static_cast<int64_t>(offsets_at),
      static_cast<int64_t>(header.max_row_json_bytes), std::move(names)));
  if (verify_checksum) {
    if (absl::Status s = payloads->VerifyChecksum(); !s.ok()) return s;
  }
  return payloads;
}

absl::StatusOr<PayloadSelection> PayloadFile::Select(
    bool all, absl::Span<const std::string> names) const {
  PayloadSelection selection;
  selection.all_ = all;
  if (all) return selection;
  selection.wanted_.assign(names_.size(), false);
  for (const std::string& name : names) {
    const auto it = std::find(names_.begin(), names_.end(), name);
    if (it == names_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload field \"", name, "\" is not a field of ", path(),
          "; its fields: ", absl::StrJoin(names_, ", ")));
    }
    selection.wanted_[it - names_.begin()] = true;
  }
  return selection;
}

template <typename Fn>
void PayloadFile::ForEachRecord(int64_t row, Fn fn) const {
  const uint64_t end = std::min<uint64_t>(offsets_[row + 1], records_bytes_);
  uint64_t at = offsets_[row];
  while (at < end && end - at >= kRecordHeaderBytes) {
    uint32_t record[2];
    std::memcpy(record, records_ + at, sizeof record);
    at += kRecordHeaderBytes;
    if (record[0] >= names_.size() || end - at < record[1]) return;
    fn(record[0], absl::string_view(
                      reinterpret_cast<const char*>(records_ + at), record[1]));
    at += record[1];
  }
}

int64_t PayloadFile::JsonBytes(int64_t row,
                               const PayloadSelection& selection) const {
  int64_t bytes = 2;
  int fields = 0;
  ForEachRecord(row, [&](uint32_t field, absl::string_view value) {
    if (!selection.wants(field)) return;
    bytes += static_cast<int64_t>(quoted_names_[field].size() + value.size());
    ++fields;
  });
  return bytes + std::max(fields - 1, 0);
}

void PayloadFile::AppendJson(int64_t row, const PayloadSelection& selection,
                             std::string* out) const {
  out->push_back('{');
  bool first = true;
  ForEachRecord(row, [&](uint32_t field, absl::string_view value) {
    if (!selection.wants(field)) return;
    if (!first) out->push_back(',');
    first = false;
    out->append(quoted_names_[field]);
    out->append(value.data(), value.size());
  });
  out->push_back('}');
}

std::vector<PayloadField> PayloadFile::Fields(int64_t row) const {
  std::vector<PayloadField> fields;
  ForEachRecord(row, [&](uint32_t field, absl::string_view value) {
    fields.emplace_back(names_[field], value);
  });
  return fields;
}

absl::Status PayloadFile::VerifyChecksum(
    const std::atomic<bool>* cancel) const {
  return VerifyPayloadCrc32(
      absl::StrCat("payload file ", path()), records_,
      file_->size() - static_cast<size_t>(kPayloadHeaderBytes), header_crc32_,
      cancel);
}

}  // namespace knnd
