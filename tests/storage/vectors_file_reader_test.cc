// VectorsFileReader: the rows it reads equal the mapped file's, in windows
// and one at a time, float32 and float16; bad windows and a file replaced
// since it was opened are refused; and a pass over every row leaves the
// file's pages out of the process's RSS, where a pass through the mapping
// puts all of them in (what knnctl update's peak showed).
#include "knnd/storage/vectors_file_reader.h"

#include <unistd.h>

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/monitoring/process_stats.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::MakeData;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteVectorsFile;
using ::testing::HasSubstr;

std::unique_ptr<VectorsFile> WriteAndOpen(const std::string& path, int64_t rows,
                                          int dim, VectorsDtype dtype) {
  absl::Status written =
      WriteVectorsFile(path, MakeData(rows, dim, 7), dim, dtype);
  EXPECT_TRUE(written.ok()) << written;
  auto file = VectorsFile::Open(path, dim, rows, /*verify_checksum=*/false);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

// Every row of `file` read through `reader` by Row() in ascending order
// equals the mapped row, bit for bit.
void ExpectRowsEqualTheMapping(const VectorsFile& file,
                               VectorsFileReader& reader) {
  std::vector<float> scratch(file.dim());
  for (int64_t r = 0; r < file.count(); ++r) {
    absl::StatusOr<const float*> row = reader.Row(r);
    ASSERT_TRUE(row.ok()) << row.status();
    const float* mapped = file.RowAsFloats(r, scratch.data());
    ASSERT_EQ(std::memcmp(*row, mapped, file.dim() * sizeof(float)), 0)
        << "row " << r;
  }
}

TEST(VectorsFileReader, RowsEqualTheMappedRowsInBothDtypes) {
  TempDir tmp;
  for (VectorsDtype dtype : {VectorsDtype::kFloat32, VectorsDtype::kFloat16}) {
    const std::string path = tmp.path(VectorsDtypeName(dtype));
    auto file = WriteAndOpen(path, 1000, 12, dtype);
    ASSERT_NE(file, nullptr);
    // 7 rows a window: the pass crosses 143 windows, the last one short.
    auto reader = VectorsFileReader::Open(*file, 7 * 12 * sizeof(float));
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->window_rows(), 7);
    ExpectRowsEqualTheMapping(*file, **reader);
    // One row far from the window, then one before it.
    for (int64_t r : {999, 3}) {
      absl::StatusOr<const float*> one = (*reader)->ReadRows(r, 1);
      ASSERT_TRUE(one.ok()) << one.status();
      std::vector<float> scratch(12);
      EXPECT_EQ(std::memcmp(*one, file->RowAsFloats(r, scratch.data()),
                            12 * sizeof(float)),
                0);
    }
  }
}

TEST(VectorsFileReader, RefusesRowsOutsideTheFileOrTheWindow) {
  TempDir tmp;
  auto file = WriteAndOpen(tmp.path("v"), 100, 4, VectorsDtype::kFloat32);
  ASSERT_NE(file, nullptr);
  auto reader = VectorsFileReader::Open(*file, 10 * 4 * sizeof(float));
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->ReadRows(95, 6).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadRows(0, 11).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string((*reader)->Row(100).status().message()),
              HasSubstr(tmp.path("v")));
  EXPECT_TRUE((*reader)->Row(99).ok());
}

TEST(VectorsFileReader, RefusesAFileReplacedSinceItWasOpened) {
  TempDir tmp;
  const std::string path = tmp.path("v");
  auto file = WriteAndOpen(path, 100, 4, VectorsDtype::kFloat32);
  ASSERT_NE(file, nullptr);
  ASSERT_TRUE(
      WriteVectorsFile(path, MakeData(50, 4, 8), 4, VectorsDtype::kFloat32)
          .ok());
  absl::StatusOr<std::unique_ptr<VectorsFileReader>> reader =
      VectorsFileReader::Open(*file);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("changed"));
}

int64_t ResidentFileBytes() {
  return ReadProcessStats("/proc").resident_file_bytes.value_or(-1);
}

// RssFile counts the pages of mapped files this process has touched; ASan
// does not change it (its shadow and quarantine are anonymous memory).
TEST(VectorsFileReader, APassKeepsTheFileOutOfTheProcesssRss) {
  TempDir tmp;
  constexpr int64_t kRows = 96 * 1024;
  constexpr int kDim = 128;  // 48 MiB of rows
  auto file = WriteAndOpen(tmp.path("v"), kRows, kDim, VectorsDtype::kFloat32);
  ASSERT_NE(file, nullptr);
  const int64_t file_bytes = file->file_bytes();
  ASSERT_GE(ResidentFileBytes(), 0) << "no RssFile in /proc/self/status";
  auto reader = VectorsFileReader::Open(*file);
  ASSERT_TRUE(reader.ok());
  const int64_t before = ResidentFileBytes();
  double sum = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    absl::StatusOr<const float*> row = (*reader)->Row(r);
    ASSERT_TRUE(row.ok());
    sum += (*row)[0];
  }
  const int64_t through_reader = ResidentFileBytes() - before;
  // The same pass through the mapping: every page of the file resident.
  std::vector<float> scratch(kDim);
  double mapped_sum = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    mapped_sum += file->RowAsFloats(r, scratch.data())[0];
  }
  const int64_t through_mapping = ResidentFileBytes() - before;
  EXPECT_EQ(sum, mapped_sum);
  EXPECT_LT(through_reader, file_bytes / 16) << "of " << file_bytes;
  EXPECT_GT(through_mapping, file_bytes * 3 / 4) << "of " << file_bytes;
}

}  // namespace
}  // namespace knnd
