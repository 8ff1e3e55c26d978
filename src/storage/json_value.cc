#include "knnd/storage/json_value.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace knnd {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::Int(int64_t i) {
  JsonValue v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}

JsonValue JsonValue::Double(double d) {
  JsonValue v;
  v.type_ = Type::kDouble;
  v.double_ = d;
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue v;
  v.type_ = Type::kArray;
  v.items_ = std::move(items);
  return v;
}

JsonValue JsonValue::Object(std::vector<Member> members) {
  JsonValue v;
  v.type_ = Type::kObject;
  v.members_ = std::move(members);
  return v;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const Member& m : members_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

bool operator==(const JsonValue& a, const JsonValue& b) {
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case JsonValue::Type::kNull:
      return true;
    case JsonValue::Type::kBool:
      return a.bool_ == b.bool_;
    case JsonValue::Type::kInt:
      return a.int_ == b.int_;
    case JsonValue::Type::kDouble:
      return a.double_ == b.double_;
    case JsonValue::Type::kString:
      return a.string_ == b.string_;
    case JsonValue::Type::kArray:
      return a.items_ == b.items_;
    case JsonValue::Type::kObject:
      return a.members_ == b.members_;
  }
  return false;
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void JsonValue::AppendTo(std::string* out) const {
  switch (type_) {
    case Type::kNull:
      out->append("null");
      return;
    case Type::kBool:
      out->append(bool_ ? "true" : "false");
      return;
    case Type::kInt:
      absl::StrAppend(out, int_);
      return;
    case Type::kDouble: {
      if (!std::isfinite(double_)) {
        out->append("null");
        return;
      }
      // The shortest of %.15g .. %.17g that reads back exactly.
      char buf[32];
      for (int precision = 15; precision <= 17; ++precision) {
        std::snprintf(buf, sizeof(buf), "%.*g", precision, double_);
        double back = 0;
        if (absl::SimpleAtod(buf, &back) && back == double_) break;
      }
      absl::string_view text(buf);
      out->append(text.data(), text.size());
      // Keep it a double when read back: 2.0 prints as "2".
      if (text.find_first_of(".eEn") == absl::string_view::npos) {
        out->append(".0");
      }
      return;
    }
    case Type::kString:
      AppendJsonString(string_, out);
      return;
    case Type::kArray:
      out->push_back('[');
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out->push_back(',');
        items_[i].AppendTo(out);
      }
      out->push_back(']');
      return;
    case Type::kObject:
      out->push_back('{');
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendJsonString(members_[i].first, out);
        out->push_back(':');
        members_[i].second.AppendTo(out);
      }
      out->push_back('}');
      return;
  }
}

std::string JsonValue::ToString() const {
  std::string out;
  AppendTo(&out);
  return out;
}

namespace {

// A recursive-descent parser over one text; `pos_` is the next byte.
class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    absl::Status s = ParseValue(0, &value);
    if (!s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("at byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(int depth, JsonValue* out) {
    if (depth >= kMaxJsonDepth) {
      return Error(absl::StrCat("nesting deeper than ", kMaxJsonDepth));
    }
    SkipSpace();
    if (pos_ >= text_.size()) return Error("expected a value, found the end");
    const char c = text_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      std::string s;
      absl::Status status = ParseString(&s);
      if (!status.ok()) return status;
      *out = JsonValue::String(std::move(s));
      return absl::OkStatus();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true")) {
      *out = JsonValue::Bool(true);
      return absl::OkStatus();
    }
    if (Consume("false")) {
      *out = JsonValue::Bool(false);
      return absl::OkStatus();
    }
    if (Consume("null")) {
      *out = JsonValue();
      return absl::OkStatus();
    }
    return Error("expected a value (object, array, string, number, true, "
                 "false or null)");
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    ++pos_;  // '{'
    std::vector<JsonValue::Member> members;
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      *out = JsonValue::Object(std::move(members));
      return absl::OkStatus();
    }
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a string key in an object");
      }
      std::string key;
      absl::Status s = ParseString(&key);
      if (!s.ok()) return s;
      for (const JsonValue::Member& m : members) {
        if (m.first == key) {
          return Error(absl::StrCat("key \"", key, "\" given twice"));
        }
      }
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        return Error("expected ':' after an object key");
      }
      ++pos_;
      JsonValue value;
      s = ParseValue(depth + 1, &value);
      if (!s.ok()) return s;
      members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        *out = JsonValue::Object(std::move(members));
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    ++pos_;  // '['
    std::vector<JsonValue> items;
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      *out = JsonValue::Array(std::move(items));
      return absl::OkStatus();
    }
    while (true) {
      JsonValue value;
      absl::Status s = ParseValue(depth + 1, &value);
      if (!s.ok()) return s;
      items.push_back(std::move(value));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        *out = JsonValue::Array(std::move(items));
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  // Four hex digits at pos_, advanced past them.
  bool ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // The length of the valid UTF-8 sequence starting at pos_ (> 0x7F), or
  // 0 when it is not valid (overlong forms and surrogates refused).
  size_t Utf8Length() const {
    const auto byte = [&](size_t i) {
      return static_cast<unsigned char>(text_[pos_ + i]);
    };
    const unsigned char b0 = byte(0);
    size_t n = 0;
    uint32_t cp = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 2;
      cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 3;
      cp = b0 & 0x0F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 4;
      cp = b0 & 0x07;
    } else {
      return 0;
    }
    if (pos_ + n > text_.size()) return 0;
    for (size_t i = 1; i < n; ++i) {
      if ((byte(i) & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (byte(i) & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return 0;
    }
    return n;
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character inside a string");
      if (c >= 0x80) {
        const size_t n = Utf8Length();
        if (n == 0) return Error("invalid UTF-8 inside a string");
        out->append(text_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!ParseHex4(&cp)) return Error("expected 4 hex digits after \\u");
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("a low surrogate without a high one");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (!Consume("\\u") || !ParseHex4(&low) || low < 0xDC00 ||
                low > 0xDFFF) {
              return Error("a high surrogate without a low one");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error("unknown escape in a string");
      }
    }
  }

  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        ++pos_;
      }
      return pos_ - from;
    };
    const size_t first_digit = pos_;
    const size_t int_digits = digits();
    if (int_digits == 0) return Error("expected a digit");
    if (int_digits > 1 && text_[first_digit] == '0') {
      pos_ = first_digit;
      return Error("a number with a leading zero");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) return Error("expected a digit after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      if (digits() == 0) return Error("expected a digit in the exponent");
    }
    const absl::string_view literal = text_.substr(start, pos_ - start);
    int64_t i = 0;
    if (integral && absl::SimpleAtoi(literal, &i)) {
      *out = JsonValue::Int(i);
      return absl::OkStatus();
    }
    double d = 0;
    if (!absl::SimpleAtod(literal, &d) || !std::isfinite(d)) {
      pos_ = start;
      return Error(absl::StrCat("number ", literal, " is out of range"));
    }
    *out = JsonValue::Double(d);
    return absl::OkStatus();
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  return Parser(text).ParseDocument();
}

}  // namespace knnd
