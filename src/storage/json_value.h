// JsonValue: one parsed JSON value (RFC 8259), for the line-per-row inputs
// of `knnctl build` (attributes and payloads as JSON Lines, one object per
// vector row) and for the payload fields knnd returns.
//
// Integers are kept exact: a number written without fraction or exponent
// that fits int64 is kInt (database keys and epoch timestamps above 2^53
// survive), any other number is kDouble. Object members keep their order
// (the input's); a key given twice is an error, so no value is silently
// dropped. Strings must be valid UTF-8 (\u escapes, surrogate pairs
// included, are decoded to UTF-8). Nesting is bounded (kMaxJsonDepth), so
// a hostile line cannot exhaust the stack.
//
// Thread-safety: a plain value; distinct values may be used from distinct
// threads. Ownership: a value owns its children.
#ifndef KNND_STORAGE_JSON_VALUE_H_
#define KNND_STORAGE_JSON_VALUE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knnd {

inline constexpr int kMaxJsonDepth = 64;

class JsonValue {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;  // null
  static JsonValue Bool(bool b);
  static JsonValue Int(int64_t i);
  static JsonValue Double(double d);
  static JsonValue String(std::string s);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<Member> members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const {
    return type_ == Type::kInt || type_ == Type::kDouble;
  }

  // Each accessor requires the matching type().
  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  // kInt or kDouble, as a double.
  double number_value() const {
    return type_ == Type::kInt ? static_cast<double>(int_) : double_;
  }
  const std::string& string_value() const { return string_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<Member>& members() const { return members_; }

  // An object's member named `key`, or nullptr (also for a non-object).
  const JsonValue* Find(absl::string_view key) const;

  // Appends the value as compact JSON (no spaces): strings escaped,
  // doubles in the shortest form that reads back to the same double,
  // non-finite doubles as null (JSON has no NaN).
  void AppendTo(std::string* out) const;
  std::string ToString() const;

  friend bool operator==(const JsonValue& a, const JsonValue& b);
  friend bool operator!=(const JsonValue& a, const JsonValue& b) {
    return !(a == b);
  }

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<JsonValue> items_;
  std::vector<Member> members_;
};

// Parses `text`, which must hold exactly one JSON value (whitespace around
// it allowed). INVALID_ARGUMENT saying what was expected and at which
// byte offset ("at byte 17: expected ':' after an object key").
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// Appends `s` as a JSON string literal (quotes included) to `out`.
void AppendJsonString(absl::string_view s, std::string* out);

}  // namespace knnd

#endif  // KNND_STORAGE_JSON_VALUE_H_
