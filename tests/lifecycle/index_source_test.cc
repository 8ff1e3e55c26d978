// IndexSource's versions directories and PublishVersion.
#include "knnd/lifecycle/index_source.h"

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using ::knnd::testing::PublishIndex;
using ::knnd::testing::TempDir;
using ::knnd::testing::VersionSpec;
using ::knnd::testing::WriteIndex;
using ::testing::HasSubstr;

TEST(IndexSource, FileIsVersionOne) {
  TempDir tmp;
  IndexSource source(tmp.path("missing.index"));
  EXPECT_FALSE(source.IsDirectory());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version, 1);
  EXPECT_EQ(latest->path, tmp.path("missing.index"));
}

TEST(IndexSource, ServesHighestCompleteVersion) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  IndexSource source(dir);
  EXPECT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 1);
  EXPECT_EQ(PublishIndex(tmp, dir, VersionSpec(2)), 2);
  // Ignored: unfinished, without a sidecar, not a number.
  fs::create_directories(dir + "/9.tmp");
  fs::create_directories(dir + "/7");
  fs::copy_file(dir + "/2/index.faiss", dir + "/7/index.faiss");
  fs::create_directories(dir + "/latest");
  ASSERT_TRUE(source.IsDirectory());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version, 2);
  EXPECT_EQ(latest->path, dir + "/2/index.faiss");
  absl::StatusOr<IndexVersion> missing = source.Find(7);
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("complete: 1, 2"));
  // The next number is above every one in use, complete or not.
  EXPECT_EQ(PublishIndex(tmp, dir, VersionSpec(3)), 10);
}

TEST(IndexSource, EmptyDirectoryHasNoVersion) {
  TempDir tmp;
  IndexSource source(tmp.dir());
  absl::StatusOr<IndexVersion> latest = source.Latest();
  EXPECT_TRUE(absl::IsNotFound(latest.status()));
  EXPECT_THAT(latest.status().message(), HasSubstr("no complete version"));
}

TEST(IndexSource, PublishRefusesABrokenFile) {
  TempDir tmp;
  WriteIndex(tmp.path("good.index"), VersionSpec(1));
  fs::resize_file(tmp.path("good.index"),
                  fs::file_size(tmp.path("good.index")) / 2);
  absl::StatusOr<IndexVersion> published =
      PublishVersion(tmp.path("versions"), tmp.path("good.index"));
  EXPECT_FALSE(published.ok());
  EXPECT_TRUE(IndexSource(tmp.path("versions")).List()->empty());
}

}  // namespace
}  // namespace knnd
