// Attribute filters compile to exactly the rows a brute-force evaluation of
// the seeded attributes admits, for every test and combination; every
// mistake is INVALID_ARGUMENT naming where it is, the field and the limit.
#include "knnd/index/attribute_filter.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::MakeAttributes;
using ::knnd::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kRows = 3000;

knnd::v1::Filter Parse(const std::string& text) {
  knnd::v1::Filter filter;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &filter))
      << text;
  return filter;
}

class AttributeFilterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    columns_ = MakeAttributes(kRows, 9);
    const std::string path = tmp_.path("x.attrs");
    ASSERT_TRUE(WriteAttributeStore(path, columns_).ok());
    absl::StatusOr<std::unique_ptr<AttributeStore>> store =
        AttributeStore::Open(path, kRows, true);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  const AttributeColumn& Column(const std::string& name) const {
    for (const AttributeColumn& c : columns_.columns) {
      if (c.name == name) return c;
    }
    ADD_FAILURE() << name;
    return columns_.columns[0];
  }
  bool HoldsKeyword(const std::string& name, int64_t r,
                    const std::string& keyword) const {
    const AttributeColumn& c = Column(name);
    for (int64_t i = c.offsets[r]; i < c.offsets[r + 1]; ++i) {
      if (c.dictionary[c.codes[i]] == keyword) return true;
    }
    return false;
  }

  // Compiles `text` and compares with `admits` row by row.
  void ExpectRows(const std::string& text,
                  const std::function<bool(int64_t)>& admits) const {
    SCOPED_TRACE(text);
    absl::StatusOr<RowBitmap> rows =
        CompileFilter(Parse(text), store_.get(), FilterLimits{});
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->size(), kRows);
    int64_t admitted = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_EQ(rows->Test(r), admits(r)) << "row " << r;
      admitted += admits(r);
    }
    EXPECT_EQ(rows->Count(), admitted);
  }

  absl::Status Error(const std::string& text,
                     const FilterLimits& limits = FilterLimits{}) const {
    return CompileFilter(Parse(text), store_.get(), limits).status();
  }

  TempDir tmp_;
  AttributeColumns columns_;
  std::unique_ptr<AttributeStore> store_;
};

TEST_F(AttributeFilterTest, EveryTestMatchesBruteForce) {
  const AttributeColumn& u = Column("u");
  const AttributeColumn& score = Column("score");
  const AttributeColumn& ts = Column("ts");
  ExpectRows("condition { field: 'genre' eq { keyword: 'news' } }",
             [&](int64_t r) { return HoldsKeyword("genre", r, "news"); });
  ExpectRows("condition { field: 'genre' eq { keyword: 'opera' } }",
             [](int64_t) { return false; });
  ExpectRows("condition { field: 'tags' eq { keyword: 't3' } }",
             [&](int64_t r) { return HoldsKeyword("tags", r, "t3"); });
  ExpectRows(
      "condition { field: 'tags' in { values { keyword: 't1' } values { "
      "keyword: 't8' } } }",
      [&](int64_t r) {
        return HoldsKeyword("tags", r, "t1") || HoldsKeyword("tags", r, "t8");
      });
  ExpectRows(
      "condition { field: 'u' range { gte { int_value: 1000 } lt { "
      "int_value: 50000 } } }",
      [&](int64_t r) { return u.ints[r] >= 1000 && u.ints[r] < 50000; });
  ExpectRows(
      "condition { field: 'u' range { gt { int_value: 1000 } lte { "
      "int_value: 50000 } } }",
      [&](int64_t r) { return u.ints[r] > 1000 && u.ints[r] <= 50000; });
  ExpectRows("condition { field: 'u' eq { int_value: " +
                 std::to_string(u.ints[17]) + " } }",
             [&](int64_t r) { return u.ints[r] == u.ints[17]; });
  ExpectRows("condition { field: 'score' range { lt { float_value: 0.25 } } }",
             [&](int64_t r) { return score.present[r] && score.floats[r] < 0.25; });
  ExpectRows("condition { field: 'score' range { gte { int_value: 0 } } }",
             [&](int64_t r) { return score.present[r]; });
  ExpectRows("condition { field: 'score' exists: false }",
             [&](int64_t r) { return !score.present[r]; });
  ExpectRows("condition { field: 'tags' exists: true }",
             [&](int64_t r) { return Column("tags").present[r]; });
  // 2020-01-01 + 100 days = 2020-04-10.
  ExpectRows(
      "condition { field: 'ts' range { gte { keyword: "
      "'2020-04-10T00:00:00Z' } } }",
      [&](int64_t r) { return r >= 100; });
  ExpectRows("condition { field: 'ts' eq { int_value: " +
                 std::to_string(ts.ints[5]) + " } }",
             [](int64_t r) { return r == 5; });
}

// A range holding most of a column is set through its complement: the same
// rows, rows without a value left out, whatever the range's width around
// half the column; an in-list still sets the union of its values.
TEST_F(AttributeFilterTest, WideRangesMatchBruteForce) {
  const AttributeColumn& u = Column("u");
  const AttributeColumn& score = Column("score");
  std::vector<int64_t> sorted = u.ints;
  std::sort(sorted.begin(), sorted.end());
  for (double quantile : {0.01, 0.49, 0.5, 0.51, 0.99, 1.0}) {
    const int64_t bound = quantile < 1.0
                              ? sorted[static_cast<size_t>(quantile * kRows)]
                              : sorted.back() + 1;
    const std::string b = std::to_string(bound);
    ExpectRows("condition { field: 'u' range { lt { int_value: " + b + " } } }",
               [&](int64_t r) { return u.ints[r] < bound; });
    ExpectRows(
        "condition { field: 'u' range { gte { int_value: " + b + " } } }",
        [&](int64_t r) { return u.ints[r] >= bound; });
    const std::string f = std::to_string(quantile);
    const double value = std::stod(f);
    ExpectRows(
        "condition { field: 'score' range { lte { float_value: " + f + " } } }",
        [&](int64_t r) {
          return score.present[r] && score.floats[r] <= value;
        });
  }
  // Two equalities, each a narrow range, into one bitmap: their union.
  ExpectRows("condition { field: 'u' in { values { int_value: " +
                 std::to_string(u.ints[3]) + " } values { int_value: " +
                 std::to_string(u.ints[4]) + " } } }",
             [&](int64_t r) {
               return u.ints[r] == u.ints[3] || u.ints[r] == u.ints[4];
             });
}

TEST_F(AttributeFilterTest, AndOrNotCombineLikeBruteForce) {
  const AttributeColumn& u = Column("u");
  ExpectRows(
      "all_of { filters { condition { field: 'genre' eq { keyword: 'news' } "
      "} } filters { negate { condition { field: 'u' range { lt { "
      "int_value: 30000 } } } } } }",
      [&](int64_t r) {
        return HoldsKeyword("genre", r, "news") && u.ints[r] >= 30000;
      });
  ExpectRows(
      "any_of { filters { condition { field: 'genre' eq { keyword: 'arts' } "
      "} } filters { condition { field: 'tags' eq { keyword: 't0' } } } }",
      [&](int64_t r) {
        return HoldsKeyword("genre", r, "arts") || HoldsKeyword("tags", r, "t0");
      });
  // NOT admits rows without a value.
  ExpectRows("negate { condition { field: 'genre' eq { keyword: 'news' } } }",
             [&](int64_t r) { return !HoldsKeyword("genre", r, "news"); });
}

TEST_F(AttributeFilterTest, MistakesNameWhereAndWhat) {
  struct Case {
    const char* filter;
    std::vector<const char*> says;
  };
  const Case cases[] = {
      {"condition { field: 'year' exists: true }",
       {"filter.condition", "unknown attribute \"year\"", "u, genre"}},
      {"condition { field: 'u' eq { keyword: 'x' } }",
       {"\"u\"", "type integer", "int_value", "keyword \"x\""}},
      {"condition { field: 'u' eq { float_value: 2.5 } }",
       {"\"u\"", "float_value 2.5"}},
      {"condition { field: 'genre' eq { int_value: 3 } }",
       {"\"genre\"", "type keyword", "int_value 3"}},
      {"condition { field: 'ts' eq { keyword: 'yesterday' } }",
       {"\"ts\"", "RFC 3339"}},
      {"condition { field: 'genre' in { } }", {"\"genre\"", "in-list", "empty"}},
      {"condition { field: 'u' range { } }", {"\"u\"", "no bound"}},
      {"condition { field: 'genre' range { gt { keyword: 'a' } } }",
       {"\"genre\"", "ranges apply"}},
      {"condition { field: 'u' range { gt { int_value: 1 } gte { int_value: "
       "2 } } }",
       {"\"u\"", "gt and gte"}},
      {"condition { field: 'u' }", {"\"u\"", "no test"}},
      {"condition { eq { int_value: 1 } }", {"field is empty"}},
      {"all_of { }", {"filter.all_of", "no filter"}},
      {"any_of { filters { condition { field: 'u' exists: true } } filters { "
       "} }",
       {"filter.any_of[1]", "none of"}},
      {"all_of { filters { negate { condition { field: 'zz' exists: true } } "
       "} }",
       {"filter.all_of[0].negate.condition", "\"zz\""}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.filter);
    const absl::Status s = Error(c.filter);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    for (const char* part : c.says) EXPECT_THAT(s.message(), HasSubstr(part));
  }
}

TEST_F(AttributeFilterTest, LimitsAreCheckedBeforeAnyRow) {
  FilterLimits limits;
  limits.max_conditions = 2;
  limits.max_depth = 2;
  absl::Status s = Error(
      "condition { field: 'genre' in { values { keyword: 'a' } values { "
      "keyword: 'b' } } }",
      limits);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("3 conditions"),
                                 HasSubstr("max_filter_conditions=2")));
  s = Error(
      "negate { negate { condition { field: 'u' exists: true } } }", limits);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("nested 3 deep"), HasSubstr("max_filter_depth=2")));
  EXPECT_TRUE(Error("negate { condition { field: 'u' exists: true } }",
                    limits)
                  .ok());
}

// One eq or range condition on a numeric column, kept as its bounds, admits
// row for row what its bitmap admits (rows without a value never), counts
// the same rows and lists them alike, through Test() and the FastScan
// kernel's TestWithoutBranches(); an out-of-range row never matches.
TEST_F(AttributeFilterTest, ColumnRangesAdmitWhatTheirBitmapsAdmit) {
  const AttributeColumn& u = Column("u");
  const AttributeColumn& score = Column("score");
  const AttributeColumn& ts = Column("ts");
  std::vector<int64_t> sorted_u = u.ints;
  std::sort(sorted_u.begin(), sorted_u.end());
  std::vector<std::string> filters;
  for (double quantile : {0.0, 0.001, 0.1, 0.5, 0.99, 0.999}) {
    const std::string b =
        std::to_string(sorted_u[static_cast<size_t>(quantile * kRows)]);
    const std::string f = std::to_string(quantile);
    for (const char* lo : {"gt", "gte"}) {
      filters.push_back(absl::StrCat("condition { field: 'u' range { ", lo,
                                     " { int_value: ", b, " } } }"));
      filters.push_back(absl::StrCat("condition { field: 'score' range { ", lo,
                                     " { float_value: ", f, " } } }"));
    }
    for (const char* hi : {"lt", "lte"}) {
      filters.push_back(absl::StrCat("condition { field: 'u' range { ", hi,
                                     " { int_value: ", b, " } } }"));
      filters.push_back(absl::StrCat("condition { field: 'score' range { ", hi,
                                     " { float_value: ", f, " } } }"));
      filters.push_back(absl::StrCat(
          "condition { field: 'score' range { gt { int_value: 0 } ", hi,
          " { float_value: ", f, " } } }"));
    }
    filters.push_back(
        absl::StrCat("condition { field: 'u' eq { int_value: ", b, " } }"));
  }
  filters.push_back(absl::StrCat(
      "condition { field: 'score' eq { float_value: ", score.floats[1],
      " } }"));
  // Rows without a score hold 0 in the file: eq 0 must not admit them.
  filters.push_back("condition { field: 'score' eq { int_value: 0 } }");
  filters.push_back(
      "condition { field: 'u' range { gte { int_value: 50000 } lt { "
      "int_value: 10 } } }");
  filters.push_back(
      "condition { field: 'u' range { gt { int_value: 9223372036854775807 } "
      "} }");
  filters.push_back(
      absl::StrCat("condition { field: 'ts' range { gte { keyword: "
                   "'2020-04-10T00:00:00Z' } lt { int_value: ",
                   ts.ints[2000], " } } }"));
  for (const std::string& text : filters) {
    SCOPED_TRACE(text);
    absl::StatusOr<RowBitmap> rows =
        CompileFilter(Parse(text), store_.get(), FilterLimits{});
    ASSERT_TRUE(rows.ok()) << rows.status();
    absl::StatusOr<std::optional<ColumnRange>> range =
        CompileColumnRange(Parse(text), store_.get(), FilterLimits{});
    ASSERT_TRUE(range.ok()) << range.status();
    ASSERT_TRUE(range->has_value());
    for (int64_t r = 0; r < kRows; ++r) {
      ASSERT_EQ((*range)->Test(r), rows->Test(r)) << "row " << r;
      // The kernel's form reads the same and answers the same.
      ASSERT_EQ((*range)->TestWithoutBranches(r), rows->Test(r)) << "row " << r;
    }
    for (int64_t outside : {int64_t{-1}, kRows, int64_t{-kRows}, kRows * 9}) {
      EXPECT_FALSE((*range)->Test(outside));
      EXPECT_FALSE((*range)->TestWithoutBranches(outside));
    }
    EXPECT_EQ((*range)->matched, rows->Count());
    EXPECT_EQ((*range)->Rows(), rows->Rows());
    EXPECT_EQ((*range)->Rows(1000), rows->Rows(1000));
  }
}

// Every other shape is the bitmap's; mistakes are the bitmap's mistakes.
TEST_F(AttributeFilterTest, OtherFiltersAreNoColumnRange) {
  for (const char* text :
       {"condition { field: 'genre' eq { keyword: 'news' } }",
        "condition { field: 'u' in { values { int_value: 3 } } }",
        "condition { field: 'u' exists: true }",
        "negate { condition { field: 'u' eq { int_value: 3 } } }",
        "all_of { filters { condition { field: 'u' eq { int_value: 3 } } } }",
        "condition { field: 'year' eq { int_value: 3 } }"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::optional<ColumnRange>> range =
        CompileColumnRange(Parse(text), store_.get(), FilterLimits{});
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_FALSE(range->has_value());
  }
  for (const char* text :
       {"condition { field: 'u' eq { keyword: 'x' } }",
        "condition { field: 'u' range { } }",
        "condition { field: 'score' range { lt { float_value: nan } } }",
        "condition { field: 'u' range { gt { int_value: 1 } gte { int_value: "
        "2 } } }",
        "condition { field: 'ts' eq { keyword: 'yesterday' } }"}) {
    SCOPED_TRACE(text);
    const absl::Status s =
        CompileColumnRange(Parse(text), store_.get(), FilterLimits{}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s, Error(text));
  }
  FilterLimits limits;
  limits.max_conditions = 0;
  EXPECT_EQ(CompileColumnRange(Parse("condition { field: 'u' eq { int_value: "
                                     "3 } }"),
                               store_.get(), limits)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A float column holds a number or nothing: the writer refuses NaN (the
// sorted values a bitmap is compiled from have no place for it), and a
// range tested against a mapped NaN, were one there, admits nothing.
TEST(ColumnRange, NaNNeverMatchesAndIsNeverWritten) {
  TempDir tmp;
  AttributeColumns columns;
  columns.rows = 3;
  AttributeColumn& c = columns.columns.emplace_back();
  c.name = "price";
  c.type = AttributeType::kFloat;
  c.present = {true, false, true};
  c.floats = {1.0, std::nan(""), std::nan("")};
  const absl::Status s = WriteAttributeStore(tmp.path("a.attrs"), columns);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"price\""), HasSubstr("row 2"),
                                 HasSubstr("NaN")));
  c.floats[2] = 2.0;  // NaN where a row holds no value is never read
  ASSERT_TRUE(WriteAttributeStore(tmp.path("a.attrs"), columns).ok());

  const uint64_t presence = 0b101;
  const double values[] = {1.0, std::nan(""), std::nan("")};
  ColumnRange range;
  range.rows = 3;
  range.presence = &presence;
  range.floats = values;
  EXPECT_TRUE(range.Test(0));  // unbounded: every row holding a number
  EXPECT_FALSE(range.Test(1));
  EXPECT_FALSE(range.Test(2));
  EXPECT_TRUE(range.TestWithoutBranches(0));
  EXPECT_FALSE(range.TestWithoutBranches(1));
  EXPECT_FALSE(range.TestWithoutBranches(2));
  range.lo_inclusive = false;
  range.hi_float = 5;
  EXPECT_TRUE(range.Test(0));
  EXPECT_FALSE(range.Test(2));
  EXPECT_TRUE(range.TestWithoutBranches(0));
  EXPECT_FALSE(range.TestWithoutBranches(2));
}

TEST(AttributeFilter, IndexWithoutAttributesNamesTheField) {
  const absl::Status s =
      CompileFilter(Parse("condition { field: 'genre' exists: true }"),
                    nullptr, FilterLimits{})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"genre\""),
                                 HasSubstr("no attributes")));
}

}  // namespace
}  // namespace knnd
