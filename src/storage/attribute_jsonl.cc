#include "knnd/storage/attribute_jsonl.h"

#include <algorithm>

#include <fstream>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
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

// A column while the file is read: the values of its rows so far, held
// compactly (a parsed JsonValue per value cost about 100 bytes, several
// times the column it becomes): numbers as 8 bytes each, strings
// dictionary-encoded as they come, in the order of first appearance.
struct Pending {
  std::string name;
  Kind kind = Kind::kNone;  // of the values seen (integer widens to float)
  int64_t first_line = 0;   // where that kind was first seen
  bool all_timestamps = true;
  std::vector<int64_t> rows;  // the rows holding a value, ascending
  // Numbers: per value its int64, or its double's bits where is_double.
  std::vector<int64_t> numbers;
  std::vector<bool> is_double;
  // Strings and string lists: per value the end of its codes.
  absl::flat_hash_map<std::string, uint32_t> code_of;
  std::vector<std::string> dictionary;
  std::vector<uint32_t> codes;
  std::vector<int64_t> code_ends;

  void AddKeyword(const std::string& keyword) {
    auto [it, inserted] =
        code_of.try_emplace(keyword, static_cast<uint32_t>(code_of.size()));
    if (inserted) dictionary.push_back(keyword);
    codes.push_back(it->second);
  }
  void Add(int64_t row, const JsonValue& value) {
    rows.push_back(row);
    switch (value.type()) {
      case JsonValue::Type::kInt:
        numbers.push_back(value.int_value());
        is_double.push_back(false);
        return;
      case JsonValue::Type::kDouble:
        numbers.push_back(absl::bit_cast<int64_t>(value.number_value()));
        is_double.push_back(true);
        return;
      case JsonValue::Type::kString:
        AddKeyword(value.string_value());
        break;
      default:  // an array of strings (KindOf checked)
        for (const JsonValue& item : value.items()) {
          AddKeyword(item.string_value());
        }
        break;
    }
    code_ends.push_back(static_cast<int64_t>(codes.size()));
  }
  double Number(size_t i) const {
    return is_double[i] ? absl::bit_cast<double>(numbers[i])
                        : static_cast<double>(numbers[i]);
  }
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
  for (int64_t row : pending.rows) column.present[row] = true;
  const size_t n = pending.rows.size();
  switch (pending.kind) {
    case Kind::kNone:
    case Kind::kInteger:
      column.type = AttributeType::kInteger;
      column.ints.assign(static_cast<size_t>(rows), 0);
      for (size_t i = 0; i < n; ++i) {
        column.ints[pending.rows[i]] = pending.numbers[i];
      }
      return column;
    case Kind::kFloat:
      column.type = AttributeType::kFloat;
      column.floats.assign(static_cast<size_t>(rows), 0);
      for (size_t i = 0; i < n; ++i) {
        column.floats[pending.rows[i]] = pending.Number(i);
      }
      return column;
    case Kind::kString:
      if (pending.all_timestamps && !keep_keywords) {
        column.type = AttributeType::kTimestamp;
        column.ints.assign(static_cast<size_t>(rows), 0);
        for (size_t i = 0; i < n; ++i) {
          column.ints[pending.rows[i]] =
              *ParseTimestampMicros(pending.dictionary[pending.codes[i]]);
        }
        return column;
      }
      column.type = AttributeType::kKeyword;
      break;
    case Kind::kStringList:
      column.type = AttributeType::kKeywordList;
      break;
  }
  column.offsets.assign(static_cast<size_t>(rows) + 1, 0);
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (next < n && pending.rows[next] == r) {
      column.offsets[r + 1] = pending.code_ends[next++];
    } else {
      column.offsets[r + 1] = column.offsets[r];
    }
  }
  column.codes = std::move(pending.codes);
  column.dictionary = std::move(pending.dictionary);
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
    const absl::flat_hash_set<std::string>& keyword_columns,
    const std::vector<std::string>* only_fields) {
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
    if (only_fields != nullptr && object->type() == JsonValue::Type::kString) {
      ++row;
      continue;
    }
    if (object->type() != JsonValue::Type::kObject) {
      return at(" is not a JSON object ({} for a row without attributes)");
    }
    for (const JsonValue::Member& member : object->members()) {
      const std::string& field = member.first;
      if (only_fields != nullptr &&
          std::find(only_fields->begin(), only_fields->end(), field) ==
              only_fields->end()) {
        continue;
      }
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
      column.Add(row, member.second);
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
    column = Pending();  // freed as soon as its column is built
  }
  return columns;
}

}  // namespace knnd
