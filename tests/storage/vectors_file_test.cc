// The raw-vectors file: opening checks its header against the file's size
// and against the index it belongs to, and its payload against the CRC-32.
#include "knnd/storage/vectors_file.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::MakeData;
using ::knnd::testing::PokeByte;
using ::knnd::testing::TempDir;
using ::knnd::testing::WriteVectorsFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kRows = 2000;
constexpr int kDim = 16;

// The files a loader must refuse, each with a message naming the file, the
// field, the expected and the actual value. Each test owns a fresh good
// vectors file of kRows x kDim (MakeData(kRows, kDim, 5)) to damage.
class BadVectorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = VectorsPath(tmp_.path("x.index"));
    absl::Status written = WriteVectorsFile(path_, MakeData(kRows, kDim, 5),
                                            kDim, VectorsDtype::kFloat32);
    ASSERT_TRUE(written.ok()) << written;
  }
  absl::Status Open() {
    return VectorsFile::Open(path_, kDim, kRows, /*verify_checksum=*/true)
        .status();
  }

  TempDir tmp_;
  std::string path_;
};

TEST_F(BadVectorsFileTest, GoodFileOpens) { EXPECT_TRUE(Open().ok()); }

TEST_F(BadVectorsFileTest, WrongSizeIsRefused) {
  ASSERT_EQ(truncate(path_.c_str(), kVectorsHeaderBytes + 100), 0);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(path_), HasSubstr("size 164 bytes"),
                    HasSubstr(absl::StrCat(
                        "= ", kVectorsHeaderBytes + int64_t{kRows} * kDim * 4)),
                    HasSubstr("truncated")));
}

TEST_F(BadVectorsFileTest, WrongDimIsRefused) {
  absl::Status s =
      VectorsFile::Open(path_, kDim * 2, kRows, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(path_), HasSubstr("dim=16"),
                    HasSubstr("index has dim=32")));
}

TEST_F(BadVectorsFileTest, WrongCountIsRefused) {
  absl::Status s = VectorsFile::Open(path_, kDim, kRows + 1, true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("count=2000"),
                                 HasSubstr("ntotal=2001")));
}

TEST_F(BadVectorsFileTest, BadMagicIsRefused) {
  PokeByte(path_, 0, 'X');
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("bad magic")));
}

TEST_F(BadVectorsFileTest, ChangedPayloadFailsTheChecksum) {
  PokeByte(path_, kVectorsHeaderBytes + 7, 0x55);
  absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path_), HasSubstr("CRC-32")));
  EXPECT_TRUE(VectorsFile::Open(path_, kDim, kRows, false).ok());
}

}  // namespace
}  // namespace knnd
