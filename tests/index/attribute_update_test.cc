// Attributes through `knnctl update`: the new version's columns follow
// UpdatePlan's rows (kept rows keep their values, upserts and additions
// take the delta's), column types hold, keyword dictionaries gain the new
// keywords and lose the gone ones; and after a whole update, every filter
// answers exactly the ids a model of the rows' attributes says, through
// the snapshot's compiled filter and its filtered search.
#include "knnd/index/attribute_update.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "knnd/index/index_snapshot.h"
#include "knnd/index/index_update.h"
#include "knnd/storage/attribute_jsonl.h"
#include "knnd/storage/index_metadata.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::LoadSnapshot;
using ::knnd::testing::MakeData;
using ::knnd::testing::SearchSnapshot;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---- UpdatedAttributes on a five-row store ----

class AttributeUpdateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Row 2 alone holds "gone"; row 1 alone "b".
    WriteFile(tmp_.path("base.jsonl"),
              "{\"g\": \"a\", \"n\": 1, \"tags\": [\"x\", \"y\"]}\n"
              "{\"g\": \"b\", \"n\": 2, \"f\": 0.5}\n"
              "{\"g\": \"gone\", \"n\": 3, \"tags\": [\"z\"]}\n"
              "{}\n"
              "{\"g\": \"a\", \"tags\": [\"y\"], \"f\": 1.5}\n");
    absl::StatusOr<AttributeColumns> base =
        ReadAttributesJsonl(tmp_.path("base.jsonl"), 5);
    ASSERT_TRUE(base.ok()) << base.status();
    ASSERT_TRUE(WriteAttributeStore(tmp_.path("base.attrs"), *base).ok());
    absl::StatusOr<std::unique_ptr<AttributeStore>> store =
        AttributeStore::Open(tmp_.path("base.attrs"), 5, true);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  absl::StatusOr<AttributeDelta> Delta(const std::string& lines, int64_t rows) {
    WriteFile(tmp_.path("delta.jsonl"), lines);
    return ReadAttributeDelta(tmp_.path("delta.jsonl"), rows, *store_);
  }

  TempDir tmp_;
  std::unique_ptr<AttributeStore> store_;
};

const AttributeColumn& Named(const AttributeColumns& columns,
                             const std::string& name) {
  for (const AttributeColumn& column : columns.columns) {
    if (column.name == name) return column;
  }
  ADD_FAILURE() << "no column " << name;
  return columns.columns.front();
}

// Row r's keywords, in the column's order, joined by commas.
std::string Keywords(const AttributeColumn& column, int64_t r) {
  std::vector<std::string> out;
  for (int64_t i = column.offsets[r]; i < column.offsets[r + 1]; ++i) {
    out.push_back(column.dictionary[column.codes[i]]);
  }
  return absl::StrJoin(out, ",");
}

TEST_F(AttributeUpdateTest, RowsFollowThePlanAndKeywordsTheirRows) {
  // Delete id 2, upsert id 1, add id 5: new rows base 0, input 0, base 3,
  // base 4, input 1.
  absl::StatusOr<UpdatePlan> plan =
      PlanUpdate({0, 1, 2, 3, 4}, {1, 5}, {2}, "delta", "delete");
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<AttributeDelta> delta = Delta(
      "{\"g\": \"new\", \"n\": 7, \"f\": 2, \"tags\": [\"y\", \"w\"]}\n"
      "{\"g\": \"a\", \"color\": \"red\"}\n",
      2);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_THAT(delta->added_columns, ElementsAre("color"));
  absl::StatusOr<AttributeColumns> out =
      UpdatedAttributes(*plan, *store_, *delta);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->rows, 5);
  std::vector<std::string> names;
  for (const AttributeColumn& column : out->columns) {
    names.push_back(column.name);
  }
  EXPECT_THAT(names, ElementsAre("g", "n", "tags", "f", "color"));

  const AttributeColumn& g = Named(*out, "g");
  EXPECT_EQ(g.type, AttributeType::kKeyword);
  EXPECT_THAT(g.present, ElementsAre(true, true, false, true, true));
  EXPECT_EQ(Keywords(g, 0), "a");
  EXPECT_EQ(Keywords(g, 1), "new");
  EXPECT_EQ(Keywords(g, 2), "");
  EXPECT_EQ(Keywords(g, 3), "a");
  EXPECT_EQ(Keywords(g, 4), "a");
  // "b" and "gone" were held only by the upserted and the deleted row.
  EXPECT_THAT(std::set<std::string>(g.dictionary.begin(), g.dictionary.end()),
              ElementsAre("a", "new"));

  const AttributeColumn& n = Named(*out, "n");
  EXPECT_EQ(n.type, AttributeType::kInteger);
  EXPECT_THAT(n.present, ElementsAre(true, true, false, false, false));
  EXPECT_EQ(n.ints[0], 1);
  EXPECT_EQ(n.ints[1], 7);

  const AttributeColumn& tags = Named(*out, "tags");
  EXPECT_EQ(tags.type, AttributeType::kKeywordList);
  EXPECT_THAT(tags.present, ElementsAre(true, true, false, true, false));
  EXPECT_EQ(Keywords(tags, 0), "x,y");
  EXPECT_EQ(Keywords(tags, 1), "y,w");
  EXPECT_EQ(Keywords(tags, 3), "y");
  EXPECT_THAT(tags.offsets, ElementsAre(0, 2, 4, 4, 5, 5));

  // The delta's integer 2 joins the base's float column as 2.0.
  const AttributeColumn& f = Named(*out, "f");
  EXPECT_EQ(f.type, AttributeType::kFloat);
  EXPECT_THAT(f.present, ElementsAre(false, true, false, true, false));
  EXPECT_EQ(f.floats[1], 2.0);
  EXPECT_EQ(f.floats[3], 1.5);

  const AttributeColumn& color = Named(*out, "color");
  EXPECT_EQ(color.type, AttributeType::kKeyword);
  EXPECT_THAT(color.present, ElementsAre(false, false, false, false, true));
  EXPECT_EQ(Keywords(color, 4), "red");

  // What the store makes of it: postings by new row.
  ASSERT_TRUE(WriteAttributeStore(tmp_.path("new.attrs"), *out).ok());
  absl::StatusOr<std::unique_ptr<AttributeStore>> written =
      AttributeStore::Open(tmp_.path("new.attrs"), 5, true);
  ASSERT_TRUE(written.ok()) << written.status();
  const AttributeStore::Column* y = (*written)->Find("tags");
  ASSERT_NE(y, nullptr);
  EXPECT_THAT(y->Postings(y->FindKeyword("y")), ElementsAre(0, 1, 3));
  EXPECT_EQ((*written)->Find("g")->count, 2);
}

TEST_F(AttributeUpdateTest, DeletionsAloneCarryTheKeptRows) {
  absl::StatusOr<UpdatePlan> plan =
      PlanUpdate({0, 1, 2, 3, 4}, {}, {0, 2}, "gone", "delete");
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<AttributeColumns> out =
      UpdatedAttributes(*plan, *store_, AttributeDelta());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->rows, 3);
  const AttributeColumn& g = Named(*out, "g");
  EXPECT_EQ(Keywords(g, 0), "b");
  EXPECT_EQ(Keywords(g, 1), "");
  EXPECT_EQ(Keywords(g, 2), "a");
  EXPECT_THAT(Named(*out, "n").present, ElementsAre(true, false, false));
  EXPECT_EQ(Named(*out, "n").ints[0], 2);
  EXPECT_EQ(Keywords(Named(*out, "tags"), 2), "y");
  EXPECT_THAT(Named(*out, "tags").dictionary, ElementsAre("y"));
}

TEST_F(AttributeUpdateTest, AColumnKeepsItsType) {
  const std::pair<const char*, const char*> mismatches[] = {
      {"{\"n\": \"seven\"}\n", "\"n\" reads as keyword but is integer"},
      {"{\"n\": 7.5}\n", "\"n\" reads as float but is integer"},
      {"{\"g\": [\"a\"]}\n", "\"g\" reads as keyword_list but is keyword"},
      {"{\"tags\": \"x\"}\n", "\"tags\" reads as keyword but is keyword_list"},
  };
  for (const auto& [line, message] : mismatches) {
    absl::StatusOr<AttributeDelta> delta = Delta(line, 1);
    EXPECT_TRUE(absl::IsInvalidArgument(delta.status())) << line;
    EXPECT_THAT(delta.status().message(), HasSubstr(message));
    EXPECT_THAT(delta.status().message(), HasSubstr("--attributes"));
    EXPECT_THAT(delta.status().message(), HasSubstr(store_->path()));
  }
  // Date-times in a keyword column stay keywords.
  absl::StatusOr<AttributeDelta> dates =
      Delta("{\"g\": \"2024-01-01T00:00:00Z\"}\n", 1);
  ASSERT_TRUE(dates.ok()) << dates.status();
  EXPECT_EQ(Named(dates->columns, "g").type, AttributeType::kKeyword);
  EXPECT_THAT(dates->added_columns, IsEmpty());
  // One line per input row, named by the flag.
  absl::StatusOr<AttributeDelta> short_file = Delta("{}\n", 2);
  EXPECT_TRUE(absl::IsInvalidArgument(short_file.status()));
  EXPECT_THAT(short_file.status().message(), HasSubstr("--attributes: "));
  EXPECT_THAT(short_file.status().message(), HasSubstr("has 1 lines"));
}

// ---- a whole update, checked through filters ----

constexpr int kDim = 32;
constexpr int64_t kRows = 3000;
constexpr int kNlist = 16;

// One row's attributes: what its JSON line says, and what filters see.
struct Attrs {
  std::string genre;  // keyword; "" none
  int64_t year = -1;  // integer; -1 none
  double score = -1;  // float; < 0 none
  std::vector<std::string> tags;
  std::string when;   // keyword (date-times in the delta)
  std::string color;  // the delta's new column

  std::string Json() const {
    std::vector<std::string> members;
    if (!genre.empty()) {
      members.push_back(absl::StrCat("\"genre\":\"", genre, "\""));
    }
    if (year >= 0) members.push_back(absl::StrCat("\"year\":", year));
    if (score >= 0) members.push_back(absl::StrCat("\"score\":", score));
    if (!tags.empty()) {
      members.push_back(
          absl::StrCat("\"tags\":[\"", absl::StrJoin(tags, "\",\""), "\"]"));
    }
    if (!when.empty()) {
      members.push_back(absl::StrCat("\"when\":\"", when, "\""));
    }
    if (!color.empty()) {
      members.push_back(absl::StrCat("\"color\":\"", color, "\""));
    }
    return absl::StrCat("{", absl::StrJoin(members, ","), "}");
  }
  bool HasTag(const std::string& tag) const {
    return std::find(tags.begin(), tags.end(), tag) != tags.end();
  }
};

// Base row r's attributes; row 8 alone holds genre "rare".
Attrs BaseAttrs(int64_t r) {
  static const char* const kGenres[] = {"news", "sport", "arts", "tech"};
  Attrs a;
  a.genre = r == 8 ? "rare" : r % 7 == 0 ? "" : kGenres[r % 4];
  a.year = r % 11 == 0 ? -1 : 2000 + r % 25;
  a.score = r % 5 == 0 ? -1 : static_cast<double>(r % 100) / 8;  // exact
  a.tags.push_back(absl::StrCat("t", r % 3));
  if (r % 2 == 1) a.tags.push_back(absl::StrCat("u", r % 5));
  a.when = r % 3 == 0 ? "early" : "late";
  return a;
}

knnd::v1::Filter ParseFilter(const std::string& text) {
  knnd::v1::Filter filter;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &filter))
      << text;
  return filter;
}

// The ids `filter` admits in `snapshot`, by its compiled rows; and, when
// they are few, by a filtered search asking for more than their number,
// which returns every admitted id (filter_planner.h) and no other.
std::set<int64_t> AdmittedIds(const IndexSnapshot& snapshot,
                              const std::string& filter) {
  absl::StatusOr<RowBitmap> rows =
      snapshot.CompileFilter(ParseFilter(filter), {}, FilterLimits{});
  EXPECT_TRUE(rows.ok()) << filter << ": " << rows.status();
  std::set<int64_t> ids;
  if (!rows.ok()) return ids;
  for (int64_t r = 0; r < rows->size(); ++r) {
    if (rows->Test(r)) ids.insert(snapshot.IdOfRow(r));
  }
  if (ids.size() <= 40) {
    const testing::SearchResults found =
        SearchSnapshot(snapshot, MakeData(1, kDim, 3), 48, 1, 0, {}, &*rows);
    std::set<int64_t> searched;
    for (int64_t id : found.ids) {
      if (id >= 0) searched.insert(id);
    }
    EXPECT_EQ(searched, ids) << "filtered search of " << filter;
  }
  return ids;
}

TEST(UpdateIndexFileAttributes, FiltersAnswerTheUpdatedRows) {
  TempDir dir;
  BuildSpec spec;
  spec.n = kRows;
  spec.d = kDim;
  spec.factory = absl::StrCat("IVF", kNlist, ",PQ16x4fs");
  spec.vectors = VectorsDtype::kFloat32;
  std::map<int64_t, Attrs> model;  // id -> the attributes filters see
  std::string base_lines;
  for (int64_t r = 0; r < kRows; ++r) {
    spec.ids.push_back(1000 + 7 * r);
    model[1000 + 7 * r] = BaseAttrs(r);
    absl::StrAppend(&base_lines, BaseAttrs(r).Json(), "\n");
  }
  WriteFile(dir.path("base.jsonl"), base_lines);
  absl::StatusOr<AttributeColumns> base_columns =
      ReadAttributesJsonl(dir.path("base.jsonl"), kRows);
  ASSERT_TRUE(base_columns.ok()) << base_columns.status();
  spec.attributes = std::move(*base_columns);
  const std::string base_path = dir.path("base.index");
  BuildIndex(base_path, spec);

  // Upsert the ids of rows 3, 4, 10 and 12, add ids 5, 6 and 7, delete
  // rows 5, 6 and 8 (the only "rare" one).
  const int64_t upserted[] = {3, 4, 10, 12};
  std::vector<Attrs> delta(7);
  delta[0].genre = "science";  // a new keyword
  delta[0].year = 1999;
  delta[0].tags = {"fresh"};
  delta[0].when = "2024-01-01T00:00:00Z";  // a date-time, kept a keyword
  // delta[1]: no attributes at all.
  delta[2].genre = "news";
  delta[2].year = 2030;
  delta[2].score = 20;  // an integer into the float column
  delta[2].tags = {"t1"};
  delta[3].tags = {"t1", "brandnew"};
  delta[3].color = "red";  // a column the base lacks
  delta[4].genre = "science";
  delta[4].year = 2001;
  delta[4].color = "blue";
  delta[4].when = "2024-01-01T00:00:00Z";
  delta[5].genre = "arts";
  delta[5].score = 0.5;
  // delta[6]: no attributes at all.
  UpdateOptions options;
  options.base_path = base_path;
  options.output_path = dir.path("new.index");
  options.input_name = "delta";
  Matrix input;
  input.rows = 7;
  input.dim = kDim;
  input.values = MakeData(input.rows, kDim, 31);
  options.input = &input;
  std::string delta_lines;
  for (int i = 0; i < 7; ++i) {
    const int64_t id = i < 4 ? 1000 + 7 * upserted[i] : i + 1;
    options.input_ids.push_back(id);
    model[id] = delta[i];
    absl::StrAppend(&delta_lines, delta[i].Json(), "\n");
  }
  WriteFile(dir.path("delta.jsonl"), delta_lines);
  options.input_attributes = dir.path("delta.jsonl");
  for (int64_t r : {5, 6, 8}) {
    options.deletions.push_back(1000 + 7 * r);
    model.erase(1000 + 7 * r);
  }
  options.recall_queries = 0;
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->wrote_attributes);
  EXPECT_EQ(report->attribute_columns, 6);
  EXPECT_THAT(report->attribute_columns_added, ElementsAre("color"));
  auto meta = ReadIndexMetadata(MetadataPath(options.output_path));
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->attributes());
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  ASSERT_TRUE(snapshot->VerifyChecksums().ok());
  ASSERT_EQ(snapshot->info().ntotal, static_cast<int64_t>(model.size()));

  // What GetIndexInfo lists: the base's columns (in the order row 0 and
  // then row 1 named them), then the new one; "rare" is gone from the
  // dictionary, "science" joined it.
  const AttributeStore* store = snapshot->attributes();
  ASSERT_NE(store, nullptr);
  std::vector<std::string> columns;
  for (const AttributeStore::Column& column : store->columns()) {
    columns.push_back(
        absl::StrCat(column.name, ":", AttributeTypeName(column.type)));
  }
  EXPECT_THAT(columns,
              ElementsAre("tags:keyword_list", "when:keyword", "genre:keyword",
                          "year:integer", "score:float", "color:keyword"));
  EXPECT_EQ(store->Find("genre")->count, 5);
  EXPECT_EQ(store->Find("genre")->FindKeyword("rare"), -1);

  const std::pair<std::string, std::function<bool(const Attrs&)>> checks[] = {
      {R"(condition { field: "genre" eq { keyword: "news" } })",
       [](const Attrs& a) { return a.genre == "news"; }},
      {R"(condition { field: "genre" eq { keyword: "science" } })",
       [](const Attrs& a) { return a.genre == "science"; }},
      {R"(condition { field: "genre" eq { keyword: "rare" } })",
       [](const Attrs&) { return false; }},
      {R"(condition { field: "genre" exists: false })",
       [](const Attrs& a) { return a.genre.empty(); }},
      {R"(condition { field: "year" range { gte { int_value: 2000 }
                                            lte { int_value: 2003 } } })",
       [](const Attrs& a) { return a.year >= 2000 && a.year <= 2003; }},
      {R"(condition { field: "year" range { lt { int_value: 2000 } } })",
       [](const Attrs& a) { return a.year >= 0 && a.year < 2000; }},
      {R"(condition { field: "year" range { gte { int_value: 2030 } } })",
       [](const Attrs& a) { return a.year >= 2030; }},
      {R"(condition { field: "year" exists: false })",
       [](const Attrs& a) { return a.year < 0; }},
      {R"(condition { field: "score" range { gte { float_value: 12 } } })",
       [](const Attrs& a) { return a.score >= 12; }},
      {R"(condition { field: "score" range { gt { float_value: 12.4 } } })",
       [](const Attrs& a) { return a.score > 12.4; }},
      {R"(condition { field: "tags" eq { keyword: "t1" } })",
       [](const Attrs& a) { return a.HasTag("t1"); }},
      {R"(condition { field: "tags" in { values { keyword: "brandnew" }
                                         values { keyword: "fresh" } } })",
       [](const Attrs& a) {
         return a.HasTag("brandnew") || a.HasTag("fresh");
       }},
      {R"(condition { field: "when" eq { keyword: "2024-01-01T00:00:00Z" } })",
       [](const Attrs& a) { return a.when == "2024-01-01T00:00:00Z"; }},
      {R"(condition { field: "when" eq { keyword: "early" } })",
       [](const Attrs& a) { return a.when == "early"; }},
      {R"(condition { field: "color" exists: true })",
       [](const Attrs& a) { return !a.color.empty(); }},
      {R"(condition { field: "color" eq { keyword: "red" } })",
       [](const Attrs& a) { return a.color == "red"; }},
      {R"(all_of { filters { condition { field: "genre" eq { keyword: "news" } } }
                   filters { condition { field: "year"
                                         range { gte { int_value: 2023 } } } } })",
       [](const Attrs& a) { return a.genre == "news" && a.year >= 2023; }},
  };
  for (const auto& [filter, admits] : checks) {
    std::set<int64_t> expected;
    for (const auto& [id, attrs] : model) {
      if (admits(attrs)) expected.insert(id);
    }
    EXPECT_EQ(AdmittedIds(*snapshot, filter), expected) << filter;
  }
}

TEST(UpdateIndexFileAttributes, DeletionsAloneCarryAndTheFlagIsChecked) {
  TempDir dir;
  BuildSpec spec;
  spec.n = 1000;
  spec.d = kDim;
  spec.factory = "IVF8,PQ16x4fs";
  spec.vectors = VectorsDtype::kFloat32;
  spec.attributes = knnd::testing::MakeAttributes(1000, 3);
  const AttributeColumn& u = spec.attributes->columns[0];  // "u", every row
  BuildIndex(dir.path("attrs.index"), spec);
  UpdateOptions options;
  options.base_path = dir.path("attrs.index");
  options.output_path = dir.path("new.index");
  options.input_name = "gone";
  options.deletions = {0, 1, 500};
  options.recall_queries = 0;
  absl::StatusOr<UpdateReport> report = UpdateIndexFile(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->wrote_attributes);
  std::unique_ptr<IndexSnapshot> snapshot = LoadSnapshot(options.output_path);
  ASSERT_NE(snapshot, nullptr);
  // "u" of row r stays with id r: the ids below u[500] (500's gone).
  std::set<int64_t> expected;
  for (int64_t r = 2; r < 1000; ++r) {
    if (r != 500 && u.ints[r] <= u.ints[500]) expected.insert(r);
  }
  EXPECT_EQ(AdmittedIds(*snapshot,
                        absl::StrCat(R"(condition { field: "u" range { lte {
                                        int_value: )",
                                     u.ints[500], " } } }")),
            expected);

  // With vectors to add, the base's attributes need theirs.
  Matrix input;
  input.rows = 2;
  input.dim = kDim;
  input.values = MakeData(input.rows, kDim, 4);
  options.input = &input;
  options.input_name = "delta.npy";
  options.deletions.clear();
  absl::StatusOr<UpdateReport> missing = UpdateIndexFile(options);
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("--attributes"));
  EXPECT_THAT(missing.status().message(), HasSubstr("delta.npy"));

  // A base without attributes refuses them, by the flag's name.
  spec.attributes.reset();
  BuildIndex(dir.path("plain.index"), spec);
  WriteFile(dir.path("delta.jsonl"), "{\"u\": 1}\n{}\n");
  options.base_path = dir.path("plain.index");
  options.output_path = dir.path("plain2.index");
  options.input_attributes = dir.path("delta.jsonl");
  absl::StatusOr<UpdateReport> refused = UpdateIndexFile(options);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--attributes " + dir.path("delta.jsonl")));
  EXPECT_THAT(refused.status().message(), HasSubstr("has no attributes"));
  EXPECT_FALSE(std::ifstream(dir.path("plain2.index")).good());
}

}  // namespace
}  // namespace knnd
