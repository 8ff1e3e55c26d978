// IndexSource's versions directories and PublishVersion.
#include "knnd/lifecycle/index_source.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "knnd/storage/vectors_file.h"
#include "knnd/storage/version_manifest.h"
#include "testing/test_util.h"
#include "testing/version_util.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using ::knnd::testing::DeadPid;
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

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

TEST(IndexSource, PublishRemovesTheDirectoriesOfKilledPublishes) {
  TempDir tmp;
  const std::string dir = tmp.path("versions");
  const std::string dead = absl::StrCat(DeadPid());
  ::knnd::testing::WriteFile(dir + "/4.tmp/.publisher",
                             HostName() + " " + dead);
  ::knnd::testing::WriteFile(dir + "/4.tmp/index.faiss", "half");
  ::knnd::testing::WriteFile(dir + "/5.tmp/.publisher",
                             absl::StrCat(HostName(), " ", getpid()));
  ::knnd::testing::WriteFile(dir + "/6.tmp/.publisher", "another-host " + dead);
  fs::create_directories(dir + "/8.tmp");
  fs::last_write_time(dir + "/8.tmp",
                      fs::file_time_type::clock::now() - std::chrono::hours(2));
  EXPECT_EQ(PublishIndex(tmp, dir, VersionSpec(1)), 7);
  EXPECT_FALSE(fs::exists(dir + "/4.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/8.tmp"));
  EXPECT_TRUE(fs::exists(dir + "/5.tmp"));  // its publisher runs
  EXPECT_TRUE(fs::exists(dir + "/6.tmp"));  // another host's
  EXPECT_FALSE(fs::exists(dir + "/7/.publisher"));
}

TEST(IndexSource, PublishRefusesCompanionsNoManifestBinds) {
  TempDir tmp;
  const std::string index = tmp.path("x.index");
  ::knnd::testing::BuildSpec spec;
  spec.n = 1000;
  spec.d = 16;
  spec.factory = "IVF8,PQ4x4fs";
  for (int64_t i = 0; i < spec.n; ++i) spec.ids.push_back(1000 + 3 * i);
  ::knnd::testing::BuildIndex(index, spec);
  ASSERT_EQ(std::remove(ManifestPath(index).c_str()), 0);
  absl::StatusOr<IndexVersion> published =
      PublishVersion(tmp.path("versions"), index);
  ASSERT_FALSE(published.ok());
  EXPECT_EQ(published.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(published.status().message(), HasSubstr("x.index.ids"));
  EXPECT_FALSE(fs::exists(tmp.path("versions")));
}

TEST(IndexSource, PublishCopiesWhatTheManifestBindsOnly) {
  TempDir tmp;
  const std::string index = tmp.path("x.index");
  const std::string other = tmp.path("y.index");
  ::knnd::testing::BuildSpec spec;
  spec.n = 1000;
  spec.d = 16;
  spec.factory = "IVF8,PQ4x4fs";
  ::knnd::testing::BuildIndex(index, spec);
  spec.vectors = VectorsDtype::kFloat32;
  ::knnd::testing::BuildIndex(other, spec);
  fs::copy_file(VectorsPath(other), VectorsPath(index));
  absl::StatusOr<IndexVersion> published =
      PublishVersion(tmp.path("versions"), index);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_TRUE(fs::exists(ManifestPath(published->path)));
  EXPECT_FALSE(fs::exists(VectorsPath(published->path)));
}

}  // namespace
}  // namespace knnd
