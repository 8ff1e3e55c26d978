#include "knnd/storage/json_value.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;

JsonValue Parsed(const std::string& text) {
  absl::StatusOr<JsonValue> v = ParseJson(text);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.ok() ? *v : JsonValue();
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<JsonValue> v = ParseJson(text);
  EXPECT_FALSE(v.ok()) << text;
  EXPECT_TRUE(v.ok() || absl::IsInvalidArgument(v.status())) << v.status();
  return v.ok() ? "" : std::string(v.status().message());
}

TEST(JsonValue, ReadsEachKindOfValue) {
  const JsonValue v = Parsed(
      R"( {"year": 2023, "score": 0.5, "genre": "news", "tags": ["a", "b"],
           "draft": false, "note": null} )");
  ASSERT_EQ(v.type(), JsonValue::Type::kObject);
  ASSERT_EQ(v.members().size(), 6u);
  EXPECT_EQ(v.members()[0].first, "year");  // the input's order
  EXPECT_EQ(v.Find("year")->type(), JsonValue::Type::kInt);
  EXPECT_EQ(v.Find("year")->int_value(), 2023);
  EXPECT_EQ(v.Find("score")->type(), JsonValue::Type::kDouble);
  EXPECT_EQ(v.Find("score")->number_value(), 0.5);
  EXPECT_EQ(v.Find("genre")->string_value(), "news");
  ASSERT_EQ(v.Find("tags")->items().size(), 2u);
  EXPECT_EQ(v.Find("tags")->items()[1].string_value(), "b");
  EXPECT_EQ(v.Find("draft")->type(), JsonValue::Type::kBool);
  EXPECT_FALSE(v.Find("draft")->bool_value());
  EXPECT_TRUE(v.Find("note")->is_null());
  EXPECT_EQ(v.Find("missing"), nullptr);
}

TEST(JsonValue, KeepsIntegersAbove2To53Exact) {
  EXPECT_EQ(Parsed("9007199254740993").int_value(), 9007199254740993LL);
  EXPECT_EQ(Parsed("-9223372036854775808").int_value(),
            std::numeric_limits<int64_t>::min());
  // Beyond int64, or written with a fraction or exponent: a double.
  EXPECT_EQ(Parsed("9223372036854775808").type(), JsonValue::Type::kDouble);
  EXPECT_EQ(Parsed("1e3").type(), JsonValue::Type::kDouble);
  EXPECT_EQ(Parsed("1e3").number_value(), 1000.0);
  EXPECT_EQ(Parsed("2.0").type(), JsonValue::Type::kDouble);
}

TEST(JsonValue, DecodesEscapesAndUtf8) {
  EXPECT_EQ(Parsed(R"("a\"b\\c\/\n\t")").string_value(), "a\"b\\c/\n\t");
  EXPECT_EQ(Parsed(R"("\u00e9")").string_value(), "\xc3\xa9");
  // A surrogate pair: U+1F600.
  EXPECT_EQ(Parsed(R"("\ud83d\ude00")").string_value(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(Parsed("\"caf\xc3\xa9\"").string_value(), "caf\xc3\xa9");
}

TEST(JsonValue, WritesWhatItReadsBack) {
  for (const std::string text :
       {R"({"a":1,"b":[true,false,null],"c":"x\"y\n","d":0.1})",
        R"([-9223372036854775808,1.0000000000000002,1e+300,"\u0001"])",
        R"({})", R"([])", R"("")"}) {
    const JsonValue v = Parsed(text);
    const std::string written = v.ToString();
    EXPECT_EQ(Parsed(written), v) << text << " -> " << written;
  }
  EXPECT_EQ(Parsed("2.0").ToString(), "2.0");  // still a double
  EXPECT_EQ(Parsed(R"({"a": [1, 2]})").ToString(), R"({"a":[1,2]})");
  EXPECT_EQ(JsonValue::Double(std::numeric_limits<double>::infinity())
                .ToString(),
            "null");
}

TEST(JsonValue, RefusesMalformedTextSayingWhere) {
  EXPECT_THAT(ErrorOf(R"({"a" 1})"), HasSubstr("at byte 5: expected ':'"));
  EXPECT_THAT(ErrorOf(R"({"a": 1, "a": 2})"), HasSubstr("\"a\" given twice"));
  EXPECT_THAT(ErrorOf("[1, 2"), HasSubstr("expected ',' or ']'"));
  EXPECT_THAT(ErrorOf("01"), HasSubstr("leading zero"));
  EXPECT_THAT(ErrorOf("1."), HasSubstr("digit after '.'"));
  EXPECT_THAT(ErrorOf("1e999"), HasSubstr("out of range"));
  EXPECT_THAT(ErrorOf("\"abc"), HasSubstr("unterminated string"));
  EXPECT_THAT(ErrorOf("\"a\x01\""), HasSubstr("control character"));
  EXPECT_THAT(ErrorOf("\"\xff\""), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(ErrorOf("\"\xed\xa0\x80\""), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(ErrorOf(R"("\ud83d")"), HasSubstr("high surrogate"));
  EXPECT_THAT(ErrorOf(R"("\x")"), HasSubstr("unknown escape"));
  EXPECT_THAT(ErrorOf("tru"), HasSubstr("expected a value"));
  EXPECT_THAT(ErrorOf("{} {}"), HasSubstr("unexpected text after"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("found the end"));
}

TEST(JsonValue, BoundsNesting) {
  const std::string deep(kMaxJsonDepth + 1, '[');
  EXPECT_THAT(ErrorOf(deep), HasSubstr("nesting deeper than 64"));
  std::string ok(kMaxJsonDepth, '[');
  ok += std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(Parsed(ok).type(), JsonValue::Type::kArray);
}

}  // namespace
}  // namespace knnd
