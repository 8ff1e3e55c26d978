// Reading /proc and /sys files: whole files, and keyed numbers in them.
#include "knnd/monitoring/kernel_files.h"

#include <string>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;
using ::knnd::testing::WriteFile;

TEST(FindKeyedNumber, MatchesWholeKeysAndConvertsKilobytes) {
  const std::string stat = "rss_huge 7\nrss 4096\ntotal_rss 8192\n";
  EXPECT_EQ(FindKeyedNumber(stat, "rss"), 4096);
  EXPECT_EQ(FindKeyedNumber(stat, "total_rss"), 8192);
  EXPECT_EQ(FindKeyedNumber(stat, "cache"), absl::nullopt);
  EXPECT_EQ(FindKeyedNumber("VmRSS:\t  12 kB\n", "VmRSS"), 12 * 1024);
  EXPECT_EQ(FindKeyedNumber("anon max\n", "anon"), absl::nullopt);
}

TEST(ReadKernelFile, ReadsTheWholeFileAndNothingWhenItIsMissing) {
  TempDir dir;
  WriteFile(dir.path("memory.max"), "max\n");
  EXPECT_EQ(ReadKernelFile(dir.path("memory.max")), "max\n");
  WriteFile(dir.path("empty"), "");
  EXPECT_EQ(ReadKernelFile(dir.path("empty")), "");
  EXPECT_EQ(ReadKernelFile(dir.path("absent")), absl::nullopt);
  EXPECT_TRUE(ReadKernelFile("/proc/self/status").has_value());
}

}  // namespace
}  // namespace knnd
