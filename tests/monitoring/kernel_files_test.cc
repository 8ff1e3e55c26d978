// Keyed numbers in /proc and /sys files.
#include "knnd/monitoring/kernel_files.h"

#include <string>

#include <gtest/gtest.h>

namespace knnd {
namespace {

TEST(FindKeyedNumber, MatchesWholeKeysAndConvertsKilobytes) {
  const std::string stat = "rss_huge 7\nrss 4096\ntotal_rss 8192\n";
  EXPECT_EQ(FindKeyedNumber(stat, "rss"), 4096);
  EXPECT_EQ(FindKeyedNumber(stat, "total_rss"), 8192);
  EXPECT_EQ(FindKeyedNumber(stat, "cache"), absl::nullopt);
  EXPECT_EQ(FindKeyedNumber("VmRSS:\t  12 kB\n", "VmRSS"), 12 * 1024);
  EXPECT_EQ(FindKeyedNumber("anon max\n", "anon"), absl::nullopt);
}

}  // namespace
}  // namespace knnd
