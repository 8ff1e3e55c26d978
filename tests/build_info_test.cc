// The FAISS build knnd links is the one the build was configured with
// (KNND_FAISS_SIMD), and `knnd --version` / knnd_build_info say so: FAISS's
// get_compile_options() names AVX2 only when it was compiled with it.
#include "knnd/build_info.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace knnd
