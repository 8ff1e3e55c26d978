// SHA-256 of files: the digests of FIPS 180-2's examples, of an empty file,
// of a file of several read blocks (the value Python's hashlib gives, which
// a pod's sync computes), and the error naming a missing file.
#include "knnd/storage/file_sha256.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;
using ::testing::HasSubstr;

std::string Sha256Of(const std::string& contents) {
  TempDir tmp;
  WriteFile(tmp.path("file"), contents);
  absl::StatusOr<std::string> digest = FileSha256(tmp.path("file"));
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.value_or("");
}

TEST(FileSha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(Sha256Of(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Of("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      Sha256Of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(FileSha256, ReadsAFileOfSeveralBlocks) {
  // 3 MiB + 7 bytes: three whole read blocks and a short one.
  std::string contents((3 << 20) + 7, '\0');
  for (size_t i = 0; i < contents.size(); ++i) {
    contents[i] = static_cast<char>((i * 7 + 3) % 251);
  }
  // hashlib.sha256(bytes((i * 7 + 3) % 251 for i in range(3 * 2**20 + 7)))
  EXPECT_EQ(Sha256Of(contents),
            "68f3a8890801bb19eec9694519e71f8a1ceb5502fee96d4161069d6e96227645");
}

TEST(FileSha256, NamesAFileItCannotOpen) {
  TempDir tmp;
  absl::StatusOr<std::string> digest = FileSha256(tmp.path("missing"));
  ASSERT_FALSE(digest.ok());
  EXPECT_TRUE(absl::IsNotFound(digest.status()));
  EXPECT_THAT(digest.status().message(), HasSubstr(tmp.path("missing")));
}

}  // namespace
}  // namespace knnd
