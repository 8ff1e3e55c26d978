// The id table: rows translate to ids and back for any distinct ids >= 0
// (sparse, unordered, 63-bit); bad ids are refused naming their source,
// row and id; a damaged file is refused naming the file and the field.
#include "knnd/storage/id_table.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
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
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kRows = 1000;

// kRows seeded random 63-bit ids, distinct, in no order.
std::vector<int64_t> HashIds() {
  std::mt19937_64 rng(11);
  std::vector<int64_t> ids(kRows);
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() >> 1);
  return ids;
}

TEST(IdTable, TranslatesRowsAndIdsBothWays) {
  TempDir tmp;
  const std::string path = IdTablePath(tmp.path("x.index"));
  EXPECT_EQ(path, tmp.path("x.index.ids"));
  const std::vector<int64_t> ids = HashIds();
  ASSERT_TRUE(WriteIdTable(path, ids, "ids.npy").ok());
  absl::StatusOr<std::unique_ptr<IdTable>> table =
      IdTable::Open(path, kRows, /*verify_checksum=*/true);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->count(), kRows);
  EXPECT_EQ((*table)->file_bytes(), kIdTableHeaderBytes + 24 * kRows);
  for (int64_t row = 0; row < kRows; ++row) {
    EXPECT_EQ((*table)->IdOf(row), ids[row]);
    EXPECT_EQ((*table)->RowOf(ids[row]), row);
  }
  EXPECT_EQ((*table)->RowOf(-1), -1);
  EXPECT_EQ((*table)->RowOf(ids[0] ^ 1), -1);
  EXPECT_EQ((*table)->RowOf(INT64_MAX), -1);
}

TEST(IdTable, EmptyTableOpens) {
  TempDir tmp;
  const std::string path = tmp.path("x.index.ids");
  ASSERT_TRUE(WriteIdTable(path, {}, "ids.npy").ok());
  absl::StatusOr<std::unique_ptr<IdTable>> table = IdTable::Open(path, 0, true);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->RowOf(0), -1);
}

TEST(IdTable, NegativeIdIsRefusedNamingSourceRowAndId) {
  TempDir tmp;
  std::vector<int64_t> ids = {7, 3, -5, 9};
  absl::Status s = WriteIdTable(tmp.path("x.ids"), ids, "ids.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("ids.npy"), HasSubstr("row 2"),
                    HasSubstr("id -5"), HasSubstr(">= 0")));
  EXPECT_NE(access(tmp.path("x.ids").c_str(), F_OK), 0);
}

TEST(IdTable, DuplicateIdIsRefusedNamingSourceRowsAndId) {
  std::vector<int64_t> ids = {10, 24, 31, 24, 5};
  absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> sorted =
      SortedIdRows(ids, "ids.npy");
  EXPECT_EQ(sorted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sorted.status().message(),
              AllOf(HasSubstr("ids.npy"), HasSubstr("row 3 holds id 24"),
                    HasSubstr("row 1"), HasSubstr("distinct")));
}

// Each test owns a fresh good table of kRows HashIds() to damage.
class BadIdTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tmp_.path("x.index.ids");
    ASSERT_TRUE(WriteIdTable(path_, HashIds(), "ids.npy").ok());
  }
  absl::Status Open(int64_t count = kRows, bool verify = true) {
    return IdTable::Open(path_, count, verify).status();
  }

  TempDir tmp_;
  std::string path_;
};

TEST_F(BadIdTableTest, MissingFileIsNotFound) {
  ASSERT_EQ(unlink(path_.c_str()), 0);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path_));
}

TEST_F(BadIdTableTest, TruncatedFileIsRefused) {
  ASSERT_EQ(truncate(path_.c_str(), kIdTableHeaderBytes + 100), 0);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(path_), HasSubstr("size 164 bytes"),
                    HasSubstr(absl::StrCat("= ", 64 + 24 * kRows)),
                    HasSubstr("truncated")));
}

TEST_F(BadIdTableTest, ShortHeaderIsRefused) {
  ASSERT_EQ(truncate(path_.c_str(), 10), 0);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("less than the 64-byte header"));
}

TEST_F(BadIdTableTest, BadMagicIsRefused) {
  PokeByte(path_, 0, 'X');
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not a knnd id table"));
}

TEST_F(BadIdTableTest, NewerVersionIsRefused) {
  PokeByte(path_, 8, 9);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("format version 9"));
}

TEST_F(BadIdTableTest, CountOfAnotherIndexIsRefused) {
  absl::Status s = Open(kRows + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("count=1000"),
                                 HasSubstr("ntotal=1001")));
}

TEST_F(BadIdTableTest, CorruptArraysFailTheChecksum) {
  FlipByteFromEnd(path_, 3);
  EXPECT_TRUE(Open(kRows, /*verify=*/false).ok());
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));
  absl::StatusOr<std::unique_ptr<IdTable>> unchecked =
      IdTable::Open(path_, kRows, /*verify_checksum=*/false);
  ASSERT_TRUE(unchecked.ok());
  EXPECT_EQ((*unchecked)->VerifyChecksum().code(),
            absl::StatusCode::kDataLoss);
  std::atomic<bool> cancel{true};
  EXPECT_EQ((*unchecked)->VerifyChecksum(&cancel).code(),
            absl::StatusCode::kCancelled);
}

TEST_F(BadIdTableTest, RowOutsideTheTableIsNeverReturned) {
  // The last entry of row_of set to a huge row: RowOf must not hand it out.
  for (int b = 0; b < 8; ++b) {
    PokeByte(path_, 64 + 24 * kRows - 8 + b, b == 7 ? 0x3f : 0);
  }
  absl::StatusOr<std::unique_ptr<IdTable>> table =
      IdTable::Open(path_, kRows, /*verify_checksum=*/false);
  ASSERT_TRUE(table.ok());
  std::vector<int64_t> ids = HashIds();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ((*table)->RowOf(ids.back()), -1);
}

}  // namespace
}  // namespace knnd
