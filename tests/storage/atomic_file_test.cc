// Replacing files atomically: the contents arrive whole, a failed rename
// leaves the old file as it was and no temporary file, and errors name the
// path.
#include "knnd/storage/atomic_file.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

namespace fs = std::filesystem;
using ::knnd::testing::ReadFile;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(AtomicFile, WritesTheContentsAndReplacesAnOldFile) {
  TempDir tmp;
  const std::string path = tmp.path("sidecar.json");
  const std::string binary("a\0b\n", 4);
  ASSERT_TRUE(WriteFileAtomically(path, binary).ok());
  EXPECT_EQ(ReadFile(path), binary);
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(ReadFile(path), "second");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(fs::file_size(path), 0u);
  EXPECT_FALSE(fs::exists(TempPathFor(path)));
}

// A directory in the target's place cannot be renamed over: the write
// fails with PERMISSION_DENIED naming both names, the directory and the
// file inside it are as they were, and the temporary file is gone.
TEST(AtomicFile, FailedRenameLeavesTheOldFileAndNoTempFile) {
  TempDir tmp;
  const std::string path = tmp.path("target");
  WriteFile(path + "/old", "old contents");
  absl::Status s = WriteFileAtomically(path, "new contents");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot rename"), HasSubstr(TempPathFor(path)),
                    HasSubstr(path)));
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(ReadFile(path + "/old"), "old contents");
  EXPECT_FALSE(fs::exists(TempPathFor(path)));

  // CommitTempFile, the second half of the same write, likewise.
  const std::string temp = TempPathFor(path);
  WriteFile(temp, "new contents");
  s = CommitTempFile(temp, path);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(ReadFile(path + "/old"), "old contents");
  EXPECT_FALSE(fs::exists(temp));
}

TEST(AtomicFile, WriteIntoAMissingDirectoryNamesThePath) {
  TempDir tmp;
  const std::string path = tmp.path("missing/x.index.meta.json");
  absl::Status s = WriteFileAtomically(path, "{}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot write"), HasSubstr(path),
                    HasSubstr("No such file or directory")));
  EXPECT_FALSE(fs::exists(tmp.path("missing")));
}

// The temporary file sits beside the target, so that the rename stays
// within one filesystem, and is named for this process.
TEST(AtomicFile, TempNameIsInTheSameDirectory) {
  const std::string path = "/data/versions/3/index.faiss";
  const std::string temp = TempPathFor(path);
  EXPECT_EQ(fs::path(temp).parent_path(), fs::path(path).parent_path());
  EXPECT_NE(temp, path);
  EXPECT_EQ(temp, absl::StrCat(path, ".tmp.", getpid()));
  EXPECT_EQ(fs::path(TempPathFor("relative.json")).parent_path(), fs::path());
}

TEST(AtomicFile, SyncOfAMissingFileIsDataLoss) {
  TempDir tmp;
  absl::Status s = SyncFile(tmp.path("absent"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(tmp.path("absent")));
}

}  // namespace
}  // namespace knnd
