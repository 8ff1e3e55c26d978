// The payload file: JSON Lines rows round-trip as compact JSON objects,
// whole or cut to the fields asked for; bad lines are refused naming the
// file and line; a damaged file is refused naming the file and the field.
#include "knnd/storage/payload_file.h"

#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::PokeByte;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const char kLines[] =
    "{\"text\": \"caf\\u00e9 \\\"au\\\" lait\", \"source\": \"a.pdf\", "
    "\"page\": 3}\n"
    "\"plain text\"\n"
    "{}\n"
    "{\"page\": 9007199254740993, \"tags\": [\"x\", {\"y\": null}], "
    "\"score\": 0.5}\r\n";

std::string Json(const PayloadFile& file, int64_t row,
                 const PayloadSelection& selection) {
  std::string out;
  file.AppendJson(row, selection, &out);
  EXPECT_EQ(static_cast<int64_t>(out.size()), file.JsonBytes(row, selection));
  return out;
}

class PayloadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jsonl_ = tmp_.path("payloads.jsonl");
    path_ = PayloadPath(tmp_.path("x.index"));
    WriteFile(jsonl_, kLines);
  }
  absl::StatusOr<std::unique_ptr<PayloadFile>> WriteAndOpen(
      bool verify = true) {
    const PayloadPart part{path_, 4};
    if (absl::Status s = WritePayloadsFromJsonLines(jsonl_, {&part, 1});
        !s.ok()) {
      return s;
    }
    return PayloadFile::Open(path_, 4, verify);
  }

  TempDir tmp_;
  std::string jsonl_;
  std::string path_;
};

TEST_F(PayloadFileTest, RoundTripsEveryRowAsCompactJson) {
  absl::StatusOr<std::unique_ptr<PayloadFile>> file = WriteAndOpen();
  ASSERT_TRUE(file.ok()) << file.status();
  const PayloadFile& f = **file;
  EXPECT_EQ(f.count(), 4);
  EXPECT_THAT(f.field_names(),
              ElementsAre("text", "source", "page", "tags", "score"));
  absl::StatusOr<PayloadSelection> all = f.Select(true, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Json(f, 0, *all),
            "{\"text\":\"caf\xc3\xa9 \\\"au\\\" lait\",\"source\":\"a.pdf\","
            "\"page\":3}");
  EXPECT_EQ(Json(f, 1, *all), "{\"text\":\"plain text\"}");
  EXPECT_EQ(Json(f, 2, *all), "{}");
  EXPECT_EQ(Json(f, 3, *all),
            "{\"page\":9007199254740993,\"tags\":[\"x\",{\"y\":null}],"
            "\"score\":0.5}");
  int64_t largest = 0;
  for (int64_t row = 0; row < 4; ++row) {
    largest = std::max(largest, f.JsonBytes(row, *all));
  }
  EXPECT_EQ(f.max_row_json_bytes(), largest);
}

TEST_F(PayloadFileTest, SelectsNamedFieldsInTheRowsOrder) {
  absl::StatusOr<std::unique_ptr<PayloadFile>> file = WriteAndOpen();
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<std::string> names = {"page", "source"};
  absl::StatusOr<PayloadSelection> some = (*file)->Select(false, names);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(Json(**file, 0, *some), "{\"source\":\"a.pdf\",\"page\":3}");
  EXPECT_EQ(Json(**file, 1, *some), "{}");  // a field it lacks is absent
  EXPECT_EQ(Json(**file, 3, *some), "{\"page\":9007199254740993}");
}

TEST_F(PayloadFileTest, UnknownFieldIsNamedWithTheFileFields) {
  absl::StatusOr<std::unique_ptr<PayloadFile>> file = WriteAndOpen();
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<std::string> names = {"page", "title"};
  absl::StatusOr<PayloadSelection> some = (*file)->Select(false, names);
  EXPECT_EQ(some.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(some.status().message(),
              AllOf(HasSubstr("\"title\""),
                    HasSubstr("text, source, page, tags, score")));
}

TEST_F(PayloadFileTest, RowsOfASliceKeepTheirFields) {
  absl::StatusOr<std::unique_ptr<PayloadFile>> file = WriteAndOpen();
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string slice_path = tmp_.path("slice.payloads");
  ASSERT_TRUE(WritePayloadRows(**file, 1, 4, slice_path).ok());
  absl::StatusOr<std::unique_ptr<PayloadFile>> slice =
      PayloadFile::Open(slice_path, 3, /*verify_checksum=*/true);
  ASSERT_TRUE(slice.ok()) << slice.status();
  absl::StatusOr<PayloadSelection> all = (*file)->Select(true, {});
  absl::StatusOr<PayloadSelection> slice_all = (*slice)->Select(true, {});
  for (int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(Json(**slice, row, *slice_all), Json(**file, row + 1, *all));
  }
}

TEST_F(PayloadFileTest, ShardPartsSplitTheLines) {
  const PayloadPart parts[] = {{tmp_.path("a.payloads"), 1},
                               {tmp_.path("b.payloads"), 4}};
  ASSERT_TRUE(WritePayloadsFromJsonLines(jsonl_, parts).ok());
  absl::StatusOr<std::unique_ptr<PayloadFile>> b =
      PayloadFile::Open(parts[1].path, 3, /*verify_checksum=*/true);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<PayloadSelection> all = (*b)->Select(true, {});
  EXPECT_EQ(Json(**b, 0, *all), "{\"text\":\"plain text\"}");
  EXPECT_TRUE(PayloadFile::Open(parts[0].path, 1, true).ok());
}

TEST_F(PayloadFileTest, BadLinesAreNamed) {
  struct Case {
    std::string lines;
    std::string message;
  };
  const Case cases[] = {
      {"{}\n{\"a\": }\n{}\n{}\n", ":2: at byte"},
      {"{}\n{}\n42\n{}\n", ":3: a payload is a JSON object"},
      {"{}\n\n{}\n{}\n", ":2: the line is blank"},
      {"{}\n{}\n{}\n", "has 3 lines, but there are 4 vectors"},
      {"{}\n{}\n{}\n{}\n{}\n", "line 5 has no vector row"},
      {"{\"a\": 1, \"a\": 2}\n{}\n{}\n{}\n", ":1: "},
  };
  for (const Case& c : cases) {
    WriteFile(jsonl_, c.lines);
    absl::Status s = WriteAndOpen().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.lines;
    EXPECT_THAT(s.message(), AllOf(HasSubstr(jsonl_), HasSubstr(c.message)))
        << c.lines;
    EXPECT_NE(access(path_.c_str(), F_OK), 0) << "no file left: " << c.lines;
  }
}

TEST_F(PayloadFileTest, DamageIsRefused) {
  ASSERT_TRUE(WriteAndOpen().ok());
  FlipByteFromEnd(path_, 3);  // in the dictionary
  EXPECT_TRUE(PayloadFile::Open(path_, 4, /*verify_checksum=*/false).ok());
  absl::Status s = PayloadFile::Open(path_, 4, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));

  ASSERT_TRUE(WriteAndOpen().ok());
  PokeByte(path_, 0, 'X');
  s = PayloadFile::Open(path_, 4, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not a knnd payload file"));

  ASSERT_TRUE(WriteAndOpen().ok());
  s = PayloadFile::Open(path_, 5, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ntotal=5"));

  ASSERT_TRUE(WriteAndOpen().ok());
  ASSERT_EQ(truncate(path_.c_str(), 100), 0);
  s = PayloadFile::Open(path_, 4, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));

  EXPECT_TRUE(absl::IsNotFound(
      PayloadFile::Open(tmp_.path("none"), 4, true).status()));
}

TEST_F(PayloadFileTest, DamagedRecordsNeverReadOutsideTheRow) {
  ASSERT_TRUE(WriteAndOpen().ok());
  // Row 0's first record claims a value of 0xff...: the walk stops.
  PokeByte(path_, kPayloadHeaderBytes + 7, '\xff');
  absl::StatusOr<std::unique_ptr<PayloadFile>> file =
      PayloadFile::Open(path_, 4, /*verify_checksum=*/false);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<PayloadSelection> all = (*file)->Select(true, {});
  EXPECT_EQ(Json(**file, 0, *all), "{}");
  EXPECT_EQ(Json(**file, 1, *all), "{\"text\":\"plain text\"}");
}

}  // namespace
}  // namespace knnd
