// The attribute store: every column type reads back as written (values,
// presence, the sorted numeric index and keyword postings); a shard's
// slice equals the store of its rows; a damaged file is refused naming the
// file and what is wrong.
#include "knnd/storage/attribute_store.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::MakeAttributes;
using ::knnd::testing::PokeByte;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kRows = 1000;

std::unique_ptr<AttributeStore> WriteAndOpen(const std::string& path,
                                             const AttributeColumns& columns) {
  absl::Status written = WriteAttributeStore(path, columns);
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<std::unique_ptr<AttributeStore>> store =
      AttributeStore::Open(path, columns.rows, /*verify_checksum=*/true);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

TEST(AttributeStore, EveryColumnReadsBackAsWritten) {
  TempDir tmp;
  const AttributeColumns columns = MakeAttributes(kRows, 3);
  EXPECT_EQ(AttributeStorePath(tmp.path("x.index")), tmp.path("x.index.attrs"));
  std::unique_ptr<AttributeStore> store =
      WriteAndOpen(AttributeStorePath(tmp.path("x.index")), columns);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->rows(), kRows);
  ASSERT_EQ(store->columns().size(), columns.columns.size());
  EXPECT_EQ(store->Find("nope"), nullptr);
  for (const AttributeColumn& want : columns.columns) {
    SCOPED_TRACE(want.name);
    const AttributeStore::Column* got = store->Find(want.name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->type, want.type);
    for (int64_t r = 0; r < kRows; ++r) ASSERT_EQ(got->Has(r), want.present[r]);
    if (want.type == AttributeType::kFloat) {
      for (int64_t r = 0; r < kRows; ++r) {
        ASSERT_EQ(got->floats[r], want.present[r] ? want.floats[r] : 0);
      }
      EXPECT_TRUE(std::is_sorted(got->sorted_floats,
                                 got->sorted_floats + got->count));
      for (int64_t i = 0; i < got->count; ++i) {
        ASSERT_EQ(got->floats[got->sorted_rows[i]], got->sorted_floats[i]);
      }
      continue;
    }
    if (IsNumeric(want.type)) {
      for (int64_t r = 0; r < kRows; ++r) {
        ASSERT_EQ(got->ints[r], want.present[r] ? want.ints[r] : 0);
      }
      EXPECT_TRUE(
          std::is_sorted(got->sorted_ints, got->sorted_ints + got->count));
      for (int64_t i = 0; i < got->count; ++i) {
        ASSERT_EQ(got->ints[got->sorted_rows[i]], got->sorted_ints[i]);
      }
      continue;
    }
    // Keywords: each one's postings are exactly the rows holding it.
    ASSERT_EQ(got->count, static_cast<int64_t>(want.dictionary.size()));
    EXPECT_EQ(got->FindKeyword("absent"), -1);
    for (uint32_t code = 0; code < want.dictionary.size(); ++code) {
      std::vector<int64_t> rows;
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t i = want.offsets[r]; i < want.offsets[r + 1]; ++i) {
          if (want.codes[i] == code) {
            rows.push_back(r);
            break;
          }
        }
      }
      const int64_t k = got->FindKeyword(want.dictionary[code]);
      ASSERT_GE(k, 0);
      EXPECT_EQ(got->Keyword(k), want.dictionary[code]);
      const absl::Span<const int64_t> postings = got->Postings(k);
      EXPECT_EQ(std::vector<int64_t>(postings.begin(), postings.end()), rows);
    }
  }
}

TEST(AttributeStore, SliceOfStoreEqualsSliceOfColumns) {
  TempDir tmp;
  const AttributeColumns columns = MakeAttributes(kRows, 5);
  std::unique_ptr<AttributeStore> store =
      WriteAndOpen(tmp.path("whole.attrs"), columns);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(
      WriteAttributeStore(tmp.path("a.attrs"), store->Slice(300, 700)).ok());
  ASSERT_TRUE(WriteAttributeStore(tmp.path("b.attrs"),
                                  SliceColumns(columns, 300, 700))
                  .ok());
  EXPECT_EQ(ReadFile(tmp.path("a.attrs")), ReadFile(tmp.path("b.attrs")));
  EXPECT_TRUE(AttributeStore::Open(tmp.path("a.attrs"), 400, true).ok());
}

TEST(AttributeStore, CorruptFileIsDataLoss) {
  TempDir tmp;
  const std::string path = tmp.path("x.attrs");
  ASSERT_NE(WriteAndOpen(path, MakeAttributes(kRows, 3)), nullptr);
  FlipByteFromEnd(path, 10);
  absl::StatusOr<std::unique_ptr<AttributeStore>> store =
      AttributeStore::Open(path, kRows, /*verify_checksum=*/true);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), AllOf(HasSubstr(path),
                                              HasSubstr("CRC")));
  store = AttributeStore::Open(path, kRows, /*verify_checksum=*/false);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->VerifyChecksum().code(), absl::StatusCode::kDataLoss);
}

TEST(AttributeStore, DamagedLayoutIsRefusedNamingTheFile) {
  TempDir tmp;
  const std::string path = tmp.path("x.attrs");
  ASSERT_NE(WriteAndOpen(path, MakeAttributes(kRows, 3)), nullptr);
  const std::string good = ReadFile(path);
  // Truncated: the arrays reach past the end.
  WriteFile(path, good.substr(0, good.size() - 100));
  absl::StatusOr<std::unique_ptr<AttributeStore>> store =
      AttributeStore::Open(path, kRows, false);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  // Not an attribute store at all.
  WriteFile(path, good);
  PokeByte(path, 0, 'X');
  store = AttributeStore::Open(path, kRows, false);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr("magic"));
  // Another index's store.
  WriteFile(path, good);
  store = AttributeStore::Open(path, kRows + 1, false);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(),
              AllOf(HasSubstr("rows=1000"), HasSubstr("ntotal=1001")));
  EXPECT_EQ(AttributeStore::Open(tmp.path("none"), kRows, false).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AttributeStore, WriterRefusesInconsistentColumns) {
  TempDir tmp;
  AttributeColumns columns = MakeAttributes(10, 3);
  columns.columns.push_back(columns.columns[0]);
  absl::Status s = WriteAttributeStore(tmp.path("x.attrs"), columns);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"u\""));
  columns = MakeAttributes(10, 3);
  columns.columns[0].ints.pop_back();
  s = WriteAttributeStore(tmp.path("x.attrs"), columns);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"u\""), HasSubstr("10 rows")));
  EXPECT_NE(access(tmp.path("x.attrs").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace knnd
