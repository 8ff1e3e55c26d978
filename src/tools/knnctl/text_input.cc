#include "text_input.h"

#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "knnd/storage/atomic_file.h"
#include "knnd/storage/json_value.h"
#include "knnd/storage/payload_file.h"

namespace knnd::knnctl {
namespace {

// Line `line` (from 1) of `path` as a payload object with `field` set to
// `text`.
absl::StatusOr<JsonValue> WithText(const std::string& payload,
                                   const std::string& path, int64_t line,
                                   const std::string& field, std::string text) {
  std::vector<JsonValue::Member> members;
  if (!path.empty()) {
    absl::StatusOr<JsonValue> parsed = ParseJson(payload);
    if (!parsed.ok() || (parsed->type() != JsonValue::Type::kObject &&
                         parsed->type() != JsonValue::Type::kString)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--payloads ", path, " line ", line,
          ": expected a JSON object or string",
          parsed.ok() ? "" : absl::StrCat(": ", parsed.status().message())));
    }
    if (parsed->type() == JsonValue::Type::kString) {
      members.emplace_back(kPayloadTextField, *parsed);
    } else {
      members = parsed->members();
    }
    for (const JsonValue::Member& m : members) {
      if (m.first == field) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--payloads ", path, " line ", line, " already holds \"", field,
            "\", the field --text_file's lines become: give each row's text "
            "in one of them"));
      }
    }
  }
  members.emplace_back(field, JsonValue::String(std::move(text)));
  return JsonValue::Object(std::move(members));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextPayloads>> TextPayloads::Write(
    const std::string& payloads, const std::string& text_file,
    const std::string& field, int64_t rows, const std::string& output) {
  std::ifstream texts(text_file);
  if (!texts) {
    return absl::NotFoundError(
        absl::StrCat("cannot read --text_file ", text_file));
  }
  std::ifstream lines;
  if (!payloads.empty()) {
    lines.open(payloads);
    if (!lines) {
      return absl::NotFoundError(
          absl::StrCat("cannot read --payloads ", payloads));
    }
  }
  std::unique_ptr<TextPayloads> merged(
      new TextPayloads(TempPathFor(absl::StrCat(output, ".text-input"))));
  std::FILE* out = std::fopen(merged->path_.c_str(), "wb");
  if (out == nullptr) {
    return absl::InternalError(absl::StrCat("cannot write ", merged->path_));
  }
  std::string text, payload, json;
  int64_t row = 0;
  absl::Status status;
  for (; status.ok() && std::getline(texts, text); ++row) {
    if (row == rows) break;
    if (!payloads.empty() && !std::getline(lines, payload)) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "--payloads ", payloads, " has ", row, " lines for ", rows, " rows"));
      break;
    }
    absl::StatusOr<JsonValue> value =
        WithText(payload, payloads, row + 1, field, std::move(text));
    if (!value.ok()) {
      status = value.status();
      break;
    }
    json.clear();
    value->AppendTo(&json);
    json.push_back('\n');
    if (std::fwrite(json.data(), 1, json.size(), out) != json.size()) {
      status =
          absl::InternalError(absl::StrCat("cannot write ", merged->path_));
    }
  }
  if (status.ok() && row != rows) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--text_file ", text_file, " has ", row, " lines for ",
                     rows, " rows (one text a row)"));
  } else if (status.ok() && std::getline(texts, text)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--text_file ", text_file, " has more than ", rows,
                     " lines for ", rows, " rows (one text a row)"));
  } else if (status.ok() && !payloads.empty() && std::getline(lines, payload)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("--payloads ", payloads, " has more than ", rows,
                     " lines for ", rows, " rows"));
  }
  if (std::fclose(out) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat("cannot write ", merged->path_));
  }
  if (!status.ok()) return status;
  return merged;
}

TextPayloads::~TextPayloads() { std::remove(path_.c_str()); }

}  // namespace knnd::knnctl
