// The JSON Lines of `knnctl build --attributes`: column types inferred
// over the whole file, missing and null fields as no value, and every
// mistake refused naming the file, the line and the field.
#include "knnd/storage/attribute_jsonl.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<AttributeColumns> Read(const TempDir& tmp,
                                      const std::string& text, int64_t rows) {
  WriteFile(tmp.path("a.jsonl"), text);
  return ReadAttributesJsonl(tmp.path("a.jsonl"), rows);
}

const AttributeColumn* Named(const AttributeColumns& c, const std::string& n) {
  for (const AttributeColumn& column : c.columns) {
    if (column.name == n) return &column;
  }
  return nullptr;
}

TEST(AttributeJsonl, InfersEveryTypeOverTheWholeFile) {
  TempDir tmp;
  absl::StatusOr<AttributeColumns> c = Read(
      tmp,
      "{\"year\": 2021, \"genre\": \"news\", \"tags\": [\"a\", \"b\"], "
      "\"price\": 3, \"at\": \"2023-05-01T12:00:00Z\"}\n"
      "{}\n"
      "{\"year\": null, \"genre\": \"arts\", \"tags\": [], \"price\": 2.5, "
      "\"at\": \"2023-05-01T14:00:00+02:00\"}\n",
      3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rows, 3);
  const AttributeColumn* year = Named(*c, "year");
  ASSERT_NE(year, nullptr);
  EXPECT_EQ(year->type, AttributeType::kInteger);
  EXPECT_THAT(year->present, ElementsAre(true, false, false));
  EXPECT_EQ(year->ints[0], 2021);
  const AttributeColumn* price = Named(*c, "price");
  EXPECT_EQ(price->type, AttributeType::kFloat);
  EXPECT_EQ(price->floats[0], 3.0);
  EXPECT_EQ(price->floats[2], 2.5);
  EXPECT_EQ(Named(*c, "genre")->type, AttributeType::kKeyword);
  const AttributeColumn* tags = Named(*c, "tags");
  EXPECT_EQ(tags->type, AttributeType::kKeywordList);
  EXPECT_THAT(tags->present, ElementsAre(true, false, false));
  const AttributeColumn* at = Named(*c, "at");
  EXPECT_EQ(at->type, AttributeType::kTimestamp);
  EXPECT_EQ(at->ints[0], int64_t{1682942400} * 1000000);
  EXPECT_EQ(at->ints[2], at->ints[0]);  // the same instant, at +02:00
}

TEST(AttributeJsonl, DatesThatAreNotAllTimestampsStayKeywords) {
  TempDir tmp;
  absl::StatusOr<AttributeColumns> c =
      Read(tmp, "{\"d\": \"2023-05-01T00:00:00Z\"}\n{\"d\": \"2023-05-02\"}\n",
           2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->columns[0].type, AttributeType::kKeyword);
}

// An update's delta whose base holds "d" as keywords: date-times stay the
// strings they are; a column not named is still inferred.
TEST(AttributeJsonl, ColumnsNamedKeywordsStayKeywordsEvenWhenAllDates) {
  TempDir tmp;
  WriteFile(tmp.path("a.jsonl"),
            "{\"d\": \"2023-05-01T00:00:00Z\", \"t\": \"2023-05-01T00:00:00Z\"}"
            "\n");
  absl::StatusOr<AttributeColumns> c =
      ReadAttributesJsonl(tmp.path("a.jsonl"), 1, {"d"});
  ASSERT_TRUE(c.ok()) << c.status();
  const AttributeColumn* d = Named(*c, "d");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->type, AttributeType::kKeyword);
  EXPECT_THAT(d->dictionary, ElementsAre("2023-05-01T00:00:00Z"));
  EXPECT_EQ(Named(*c, "t")->type, AttributeType::kTimestamp);
}

TEST(AttributeJsonl, MistakesNameTheLineAndTheField) {
  TempDir tmp;
  absl::StatusOr<AttributeColumns> c =
      Read(tmp, "{\"year\": 2021}\n{\"year\": \"2022\"}\n", 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("a.jsonl"), HasSubstr("line 2"),
                    HasSubstr("\"year\""), HasSubstr("line 1")));
  c = Read(tmp, "{\"ok\": true}\n", 1);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("line 1"), HasSubstr("\"ok\""),
                    HasSubstr("boolean")));
  c = Read(tmp, "{\"t\": [1, 2]}\n", 1);
  EXPECT_THAT(c.status().message(), HasSubstr("non-string"));
  c = Read(tmp, "{}\n[1]\n", 2);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("line 2"), HasSubstr("not a JSON object")));
  c = Read(tmp, "{}\n{\"a\": \n", 2);
  EXPECT_THAT(c.status().message(), HasSubstr("line 2"));
  c = Read(tmp, "{}\n", 2);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("1 lines"), HasSubstr("2 vectors")));
  c = Read(tmp, "{}\n{}\n{}\n", 2);
  EXPECT_THAT(c.status().message(), HasSubstr("line 3"));
  EXPECT_EQ(ReadAttributesJsonl(tmp.path("none.jsonl"), 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AttributeJsonl, ParsesRfc3339Only) {
  EXPECT_EQ(ParseTimestampMicros("1970-01-01T00:00:01.5Z"), 1500000);
  EXPECT_FALSE(ParseTimestampMicros("2023-05-01").has_value());
  EXPECT_FALSE(ParseTimestampMicros("yesterday").has_value());
}

}  // namespace
}  // namespace knnd
