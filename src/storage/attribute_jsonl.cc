#include "knnd/storage/attribute_jsonl.h"

#include <fstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "knnd/storage/json_value.h"

namespace knnd {
namespace {

// What one JSON value is as an attribute; kNone for null and [].
enum class Kind { kNone, kInteger, kFloat, kString, kStringList };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "null";
    case Kind::kInteger:
      return "an integer";
    case Kind::kFloat:
      return "a non-integer number";
    case Kind::kString:
      return "a string";
    case Kind::kStringList:
      return "an array of strings";
  }
  return "unknown";
}

// A column while the file is read: the values of its rows so far.
struct Pending {
  std::string name;
  Kind kind = Kind::kNone;  // of the values seen (integer widens to float)
  int64_t first_line = 0;   // where that kind was first seen
  bool all_timestamps = true;
  std::vector<std::pair<int64_t, JsonValue>> values;  // (row, value)
};

absl::StatusOr<Kind> KindOf(const JsonValue& value) {
  switch (value.type()) {
    case JsonValue::Type::kNull:
      return Kind::kNone;
    case JsonValue::Type::kInt:
      return Kind::kInteger;
    case JsonValue::Type::kDouble:
      return Kind::kFloat;
    case JsonValue::Type::kString:
      return Kind::kString;
    case JsonValue::Type::kArray:
      for (const JsonValue& item : value.items()) {
        if (item.type() != JsonValue::Type::kString) {
          return absl::InvalidArgumentError(
              "is an array holding a non-string; keyword lists hold strings");
        }
      }
      return value.items().empty() ? Kind::kNone : Kind::kStringList;
    case JsonValue::Type::kBool:
      return absl::InvalidArgumentError(
          "is a boolean; use 0/1 (integer) or a keyword");
    case JsonValue::Type::kObject:
      return absl::InvalidArgumentError(
          "is an object; attributes are numbers, strings or arrays of "
          "strings");
  }
  return Kind::kNone;
}

AttributeColumn Finish(Pending& pending, int64_t rows, bool keep_keywords) {
  AttributeColumn column;
  column.name = pending.name;
  column.present.assign(static_cast<size_t>(rows), false);
  for (const auto& [row, value] : pending.values) column.present[row] = true;
  switch (pending.kind) {
    case Kind::kNone:
    case Kind::kInteger:
      column.type = AttributeType::kInteger;
      column.ints.assign(static_cast<size_t>(rows), 0);
      for (const auto& [row, value] : pending.values) {
        column.ints[row] = value.int_value();
      }
      return column;
    case Kind::kFloat:
      column.type = AttributeType::kFloat;
      column.floats.assign(static_cast<size_t>(rows), 0);
      for (const auto& [row, value] : pending.values) {
        column.floats[row] = value.number_value();
      }
      return column;
    case Kind::kString:
      if (pending.all_timestamps && !keep_keywords) {
        column.type = AttributeType::kTimestamp;
        column.ints.assign(static_cast<size_t>(rows), 0);
        for (const auto& [row, value] : pending.values) {
          column.ints[row] = *ParseTimestampMicros(value.string_value());
        }
        return column;
      }
      column.type = AttributeType::kKeyword;
      break;
    case Kind::kStringList:
      column.type = AttributeType::kKeywordList;
      break;
  }
  absl::flat_hash_map<std::string, uint32_t> codes;
  column.offsets.assign(static_cast<size_t>(rows) + 1, 0);
  auto add = [&](const std::string& keyword) {
    auto [it, inserted] =
        codes.try_emplace(keyword, static_cast<uint32_t>(codes.size()));
    if (inserted) column.dictionary.push_back(keyword);
    column.codes.push_back(it->second);
  };
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (next < pending.values.size() && pending.values[next].first == r) {
      const JsonValue& value = pending.values[next++].second;
      if (value.type() == JsonValue::Type::kString) {
        add(value.string_value());
      } else {
        for (const JsonValue& item : value.items()) add(item.string_value());
      }
    }
    column.offsets[r + 1] = static_cast<int64_t>(column.codes.size());
  }
  return column;
}

}  // namespace

std::optional<int64_t> ParseTimestampMicros(absl::string_view text) {
  absl::Time time;
  std::string error;
  if (text.size() < 20 || text[10] != 'T' ||
      !absl::ParseTime(absl::RFC3339_full, text, &time, &error)) {
    return std::nullopt;
  }
  return absl::ToUnixMicros(time);
}

absl::StatusOr<AttributeColumns> ReadAttributesJsonl(
    const std::string& path, int64_t expect_rows,
    const absl::flat_hash_set<std::string>& keyword_columns) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("attributes file ", path, " cannot be opened"));
  }
  std::vector<Pending> pending;
  absl::flat_hash_map<std::string, size_t> column_of;
  std::string line;
  int64_t row = 0;
  while (std::getline(in, line)) {
    const int64_t line_number = row + 1;
    auto at = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", line_number, what));
    };
    if (row >= expect_rows) {
      return at(absl::StrCat(" is past the ", expect_rows,
                             " vectors of the input; give one line per "
                             "vector row"));
    }
    absl::StatusOr<JsonValue> object = ParseJson(line);
    if (!object.ok()) return at(absl::StrCat(": ", object.status().message()));
    if (object->type() != JsonValue::Type::kObject) {
      return at(" is not a JSON object ({} for a row without attributes)");
    }
    for (const JsonValue::Member& member : object->members()) {
      const std::string& field = member.first;
      absl::StatusOr<Kind> kind = KindOf(member.second);
      if (!kind.ok()) {
        return at(absl::StrCat(": field \"", field, "\" ",
                               kind.status().message()));
      }
      if (*kind == Kind::kNone) continue;
      auto [it, inserted] = column_of.try_emplace(field, pending.size());
      if (inserted) pending.emplace_back().name = field;
      Pending& column = pending[it->second];
      if (column.kind == Kind::kNone ||
          (column.kind == Kind::kInteger && *kind == Kind::kFloat)) {
        column.kind = *kind;
        if (column.first_line == 0) column.first_line = line_number;
      } else if (column.kind != *kind &&
                 !(column.kind == Kind::kFloat && *kind == Kind::kInteger)) {
        return at(absl::StrCat(": field \"", field, "\" is ", KindName(*kind),
                               " but was ", KindName(column.kind),
                               " from line ", column.first_line,
                               "; a column holds one type"));
      }
      if (*kind == Kind::kString && column.all_timestamps &&
          !ParseTimestampMicros(member.second.string_value())) {
        column.all_timestamps = false;
      }
      column.values.emplace_back(row, member.second);
    }
    ++row;
  }
  if (row != expect_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has ", row, " lines but the input has ", expect_rows,
        " vectors; give one line per vector row ({} for a row without "
        "attributes)"));
  }
  AttributeColumns columns;
  columns.rows = expect_rows;
  for (Pending& column : pending) {
    columns.columns.push_back(
        Finish(column, expect_rows, keyword_columns.contains(column.name)));
  }
  return columns;
}

}  // namespace knnd
