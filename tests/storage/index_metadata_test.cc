// The metadata sidecar: its JSON round trip and format version, and the
// CRC-32 that catches an index file changed after it was built.
#include "knnd/storage/index_metadata.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "knnd/index/index_snapshot.h"
#include "knnd/storage/atomic_file.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::BuildIndex;
using ::knnd::testing::BuildSpec;
using ::knnd::testing::FlipByteFromEnd;
using ::knnd::testing::TempDir;
using ::testing::HasSubstr;

TEST(IndexMetadata, ChecksumMismatchIsRefused) {
  TempDir dir;
  const std::string path = dir.path("x.index");
  BuildIndex(path, BuildSpec{});
  ASSERT_TRUE(IndexSnapshot::Load(path, {}).ok());
  {
    // Flip one byte of the last stored code: structurally still valid.
    FlipByteFromEnd(path, 40);
  }
  auto loaded = IndexSnapshot::Load(path, {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("CRC-32"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("x.index.meta.json"));
  LoadOptions unchecked;
  unchecked.verify_checksum = false;
  EXPECT_TRUE(IndexSnapshot::Load(path, unchecked).ok());
}

TEST(IndexMetadata, RoundTripsThroughJson) {
  TempDir dir;
  knnd::v1::IndexMetadata written;
  written.set_format_version(kIndexMetadataFormatVersion);
  written.set_dim(784);
  written.set_metric("cosine");
  written.set_normalized(true);
  written.set_ntotal(60000);
  written.set_crc32("0badf00d");
  ASSERT_TRUE(WriteIndexMetadata(dir.path("m.json"), written).ok());
  auto read = ReadIndexMetadata(dir.path("m.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), written.SerializeAsString());
  EXPECT_TRUE(absl::IsNotFound(ReadIndexMetadata(dir.path("none")).status()));
  written.set_format_version(kIndexMetadataFormatVersion + 1);
  ASSERT_TRUE(WriteIndexMetadata(dir.path("m.json"), written).ok());
  EXPECT_THAT(ReadIndexMetadata(dir.path("m.json")).status().message(),
              HasSubstr("format_version"));
}

// A field a newer knnctl added is skipped (a knnd rolled back serves the
// versions written since); the fields it knows are read; broken JSON is
// still refused.
TEST(IndexMetadata, FieldsOfANewerWriterAreSkipped) {
  TempDir dir;
  const std::string path = dir.path("m.json");
  ASSERT_TRUE(WriteFileAtomically(
                  path, "{\"formatVersion\": 1, \"dim\": 16, "
                        "\"aFieldFromTheFuture\": {\"x\": [1, 2]}}")
                  .ok());
  absl::StatusOr<knnd::v1::IndexMetadata> read = ReadIndexMetadata(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->dim(), 16);
  ASSERT_TRUE(WriteFileAtomically(path, "{\"dim\": 16,").ok());
  EXPECT_THAT(ReadIndexMetadata(path).status().message(),
              HasSubstr("is not valid"));
}

}  // namespace
}  // namespace knnd
