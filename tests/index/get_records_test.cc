// get_records.h over small built indexes: ids found through the id table
// (and as rows without one, and in a shard), ids given twice answered
// once, unknown ids missing, each record's payload, attributes and vector
// as stored; the refusals named; the answer's size counted before it is
// built.
#include "knnd/index/get_records.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/storage/json_value.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using knnd::testing::BuildIndex;
using knnd::testing::BuildSpec;
using knnd::testing::LoadSnapshot;
using knnd::testing::MakeAttributes;
using knnd::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kDim = 8;
constexpr int64_t kRows = 600;

class GetRecordsTest : public ::testing::Test {
 protected:
  // Own ids 5 * r + 1, payloads, attributes and raw vectors.
  void SetUp() override {
    BuildSpec spec = Small();
    spec.vectors = VectorsDtype::kFloat32;
    spec.attributes = MakeAttributes(kRows, 3);
    for (int64_t r = 0; r < kRows; ++r) {
      spec.ids.push_back(5 * r + 1);
      spec.payloads.push_back(
          absl::StrCat("{\"text\": \"row ", r, "\", \"page\": ", r, "}"));
    }
    attributes_ = *spec.attributes;
    base_ = BuildIndex(tmp_.path("full"), spec);
    full_ = LoadSnapshot(tmp_.path("full"));
    BuildIndex(tmp_.path("bare"), Small());
    bare_ = LoadSnapshot(tmp_.path("bare"));
    ASSERT_NE(full_, nullptr);
    ASSERT_NE(bare_, nullptr);
  }
  static BuildSpec Small() {
    BuildSpec spec;
    spec.n = kRows;
    spec.d = kDim;
    spec.factory = "IVF8,PQ4";
    return spec;
  }

  TempDir tmp_;
  AttributeColumns attributes_;
  std::vector<float> base_;
  std::unique_ptr<IndexSnapshot> full_;
  std::unique_ptr<IndexSnapshot> bare_;
};

TEST_F(GetRecordsTest, FoundIdsOnceInOrderAndUnknownIdsMissing) {
  absl::StatusOr<PayloadSelection> payloads = full_->SelectPayloads(true, {});
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  const RecordsAsk ask{&*payloads, true, true};
  ASSERT_TRUE(CheckRecordsAsk(*full_, ask).ok());
  // 501 is row 100; 2 and 3001 are no row's id (3001 = 5 * 600 + 1).
  const std::vector<int64_t> ids = {501, 2, 1, 501, 3001, 2996, 2};
  absl::StatusOr<RecordsPlan> plan = PlanRecords(*full_, ids, ask, 16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->ids, ElementsAre(501, 1, 2996));
  EXPECT_THAT(plan->rows, ElementsAre(100, 0, 599));
  EXPECT_THAT(plan->missing, ElementsAre(2, 3001));
  knnd::v1::GetResponse response;
  FillRecords(*full_, ask, *plan, &response);
  // The size counted before is what the answer is, or more.
  EXPECT_GE(plan->answer_bytes, static_cast<int64_t>(response.ByteSizeLong()));
  EXPECT_LE(plan->answer_bytes,
            static_cast<int64_t>(response.ByteSizeLong()) + 16);
  ASSERT_EQ(response.records_size(), 3);
  EXPECT_THAT(response.missing(), ElementsAre(2, 3001));
  const knnd::v1::Record& record = response.records(0);
  EXPECT_EQ(record.id(), 501);
  EXPECT_EQ(record.payload(), "{\"text\":\"row 100\",\"page\":100}");
  ASSERT_EQ(record.vector_size(), kDim);
  for (int j = 0; j < kDim; ++j) {
    EXPECT_EQ(record.vector(j), base_[100 * kDim + j]) << j;
  }
  // The attributes of row 100, parsed back, hold each column's value.
  absl::StatusOr<JsonValue> parsed = ParseJson(record.attributes());
  ASSERT_TRUE(parsed.ok()) << record.attributes();
  for (const AttributeColumn& column : attributes_.columns) {
    const JsonValue* value = parsed->Find(column.name);
    const bool held = column.type == AttributeType::kKeywordList
                          ? column.offsets[101] > column.offsets[100]
                          : static_cast<bool>(column.present[100]);
    ASSERT_EQ(value != nullptr, held) << column.name;
    if (!held) continue;
    switch (column.type) {
      case AttributeType::kInteger:
        EXPECT_EQ(value->number_value(), column.ints[100]) << column.name;
        break;
      case AttributeType::kFloat:
        EXPECT_EQ(value->number_value(), column.floats[100]) << column.name;
        break;
      case AttributeType::kTimestamp:
        // MakeAttributes: a day apart from 2020-01-01.
        EXPECT_EQ(value->string_value(), "2020-04-10T00:00:00Z");
        break;
      case AttributeType::kKeyword:
        EXPECT_EQ(value->string_value(),
                  column.dictionary[column.codes[column.offsets[100]]]);
        break;
      case AttributeType::kKeywordList: {
        std::vector<std::string> want;
        for (int64_t i = column.offsets[100]; i < column.offsets[101]; ++i) {
          want.push_back(column.dictionary[column.codes[i]]);
        }
        std::sort(want.begin(), want.end());
        ASSERT_EQ(value->items().size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(value->items()[i].string_value(), want[i]);
        }
        break;
      }
    }
  }
}

TEST_F(GetRecordsTest, OnlyWhatIsAskedAndRowNumbersWithoutAnIdTable) {
  absl::StatusOr<RecordsPlan> plan =
      PlanRecords(*bare_, {7, 600, 0}, RecordsAsk{}, 16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  knnd::v1::GetResponse response;
  FillRecords(*bare_, RecordsAsk{}, *plan, &response);
  ASSERT_EQ(response.records_size(), 2);
  EXPECT_EQ(response.records(0).id(), 7);
  EXPECT_EQ(response.records(1).id(), 0);
  EXPECT_THAT(response.missing(), ElementsAre(600));
  for (const knnd::v1::Record& r : response.records()) {
    EXPECT_TRUE(r.payload().empty());
    EXPECT_TRUE(r.attributes().empty());
    EXPECT_EQ(r.vector_size(), 0);
  }
}

TEST_F(GetRecordsTest, RefusalsNameTheInputAndTheLimit) {
  absl::Status none = CheckGetIds({}, 4);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("ids is empty"));
  absl::Status many = CheckGetIds({1, 2, 3, 4, 5}, 4);
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(many.message(),
              HasSubstr("ids holds 5 ids, more than max_get_ids=4"));
  EXPECT_TRUE(CheckGetIds({1, 2, 3, 4, 5}, 0).ok());  // 0: not checked
  absl::Status negative = CheckGetIds({1, -9}, 4);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("ids[1]=-9 is negative"));
  EXPECT_EQ(PlanRecords(*full_, {1, -9}, RecordsAsk{}, 4).status(), negative);

  absl::Status vectors =
      CheckRecordsAsk(*bare_, RecordsAsk{nullptr, false, true});
  EXPECT_EQ(vectors.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(vectors.message(), HasSubstr("with_vectors: index "));
  EXPECT_THAT(vectors.message(), HasSubstr("--keep_vectors"));
  absl::Status attributes =
      CheckRecordsAsk(*bare_, RecordsAsk{nullptr, true, false});
  EXPECT_EQ(attributes.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(attributes.message(), HasSubstr("--attributes"));
}

TEST(AttributesJson, EveryTypeAndRowsWithoutValues) {
  AttributeColumns columns;
  columns.rows = 3;
  AttributeColumn& n = columns.columns.emplace_back();
  n.name = "n";
  n.type = AttributeType::kInteger;
  n.present = {true, false, true};
  n.ints = {-4, 0, 9};
  AttributeColumn& f = columns.columns.emplace_back();
  f.name = "f";
  f.type = AttributeType::kFloat;
  f.present = {true, true, false};
  f.floats = {0.5, 0.25, 0};
  AttributeColumn& t = columns.columns.emplace_back();
  t.name = "t";
  t.type = AttributeType::kTimestamp;
  t.present = {false, true, true};
  t.ints = {0, 1500, 86400000000};
  AttributeColumn& k = columns.columns.emplace_back();
  k.name = "k\"";
  k.type = AttributeType::kKeyword;
  k.present = {true, true, false};
  k.dictionary = {"b", "a\n"};
  k.offsets = {0, 1, 2, 2};
  k.codes = {0, 1};
  AttributeColumn& l = columns.columns.emplace_back();
  l.name = "l";
  l.type = AttributeType::kKeywordList;
  l.present = {true, false, true};
  l.dictionary = {"y", "x"};
  l.offsets = {0, 2, 2, 3};
  l.codes = {0, 1, 0};
  TempDir tmp;
  ASSERT_TRUE(WriteAttributeStore(tmp.path("s"), columns).ok());
  absl::StatusOr<std::unique_ptr<AttributeStore>> store =
      AttributeStore::Open(tmp.path("s"), 3, true);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT(
      AttributesJson(**store, {2, 0, 1}),
      ElementsAre("{\"n\":9,\"t\":\"1970-01-02T00:00:00Z\",\"l\":[\"y\"]}",
                  "{\"n\":-4,\"f\":0.5,\"k\\\"\":\"b\",\"l\":[\"x\",\"y\"]}",
                  "{\"f\":0.25,\"t\":\"1970-01-01T00:00:00.0015Z\",\"k\\\"\":"
                  "\"a\\n\"}"));
}

}  // namespace
}  // namespace knnd
