// The FAISS build knnd links is the one the build was configured with
// (KNND_FAISS_SIMD), and `knnd --version` / knnd_build_info say so: FAISS's
// get_compile_options() names AVX2 only when it was compiled with it.
#include "knnd/monitoring/build_info.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(BuildInfoTest, ReportsTheConfiguredFaissSimdBuild) {
  const std::string options = GetBuildInfo().faiss_compile_options;
  if (std::string(KNND_EXPECTED_FAISS_SIMD) == "avx2") {
    EXPECT_THAT(options, HasSubstr("AVX2"));
  } else {
    EXPECT_THAT(options, Not(HasSubstr("AVX2")));
  }
  EXPECT_EQ(GetBuildInfo().faiss_version, "1.7.3");
}

TEST(BuildInfoTest, VersionLineNamesTheFaissBuild) {
  EXPECT_THAT(BuildInfoLine(),
              HasSubstr("faiss 1.7.3 [" + GetBuildInfo().faiss_compile_options + "]"));
}

// The commit is the one built, not the one of the last CMake configure
// (cmake/build_version.cmake runs at every build).
TEST(BuildInfoTest, CommitIsTheCheckedOutOne) {
  std::string head;
  if (::knnd::testing::RunCommand(std::string("git -C '") + KNND_SOURCE_DIR +
                                      "' rev-parse --short=12 HEAD 2>/dev/null",
                                  &head) != 0) {
    GTEST_SKIP() << "not a git checkout";
  }
  while (!head.empty() && head.back() == '\n') head.pop_back();
  EXPECT_EQ(GetBuildInfo().git_commit, head);
  EXPECT_THAT(BuildInfoLine(), HasSubstr("git " + head));
}

}  // namespace
}  // namespace knnd
