// FileResidency: how much of a mapped file is in the page cache, scanned
// a bounded amount per sample.
#include "knnd/monitoring/file_residency.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace knnd {
namespace {

using ::knnd::testing::TempDir;

TEST(FileResidency, ScansABoundedAmountPerTake) {
  TempDir dir;
  const std::string path = dir.path("index");
  constexpr size_t kBytes = size_t{40} << 20;  // 3 chunks of 16 MiB
  {
    std::ofstream out(path, std::ios::binary);
    std::vector<char> block(1 << 20, 'x');
    for (size_t i = 0; i < kBytes / block.size(); ++i) {
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
  }
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);

  FileResidency::Options options;
  options.max_scan_bytes_per_sample = int64_t{16} << 20;
  FileResidency residency(options);
  EXPECT_FALSE(residency.Take().has_value());  // nothing tracked yet
  ASSERT_TRUE(residency.Track(path).ok());

  // Just written, so every page is in the page cache; one chunk is checked
  // per Take().
  absl::optional<FileResidency::Sample> s = residency.Take();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->mapped_bytes, static_cast<int64_t>(kBytes));
  EXPECT_EQ(s->resident_bytes, int64_t{16} << 20);
  s = residency.Take();
  EXPECT_EQ(s->resident_bytes, int64_t{32} << 20);
  s = residency.Take();
  EXPECT_EQ(s->resident_bytes, static_cast<int64_t>(kBytes));

  munmap(map, kBytes);
  s = residency.Take();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->mapped_bytes, 0);
  EXPECT_EQ(s->resident_bytes, 0);
}

TEST(FileResidency, TrackOfAMissingFileFails) {
  FileResidency residency(FileResidency::Options{});
  absl::Status s = residency.Track("/nonexistent/knnd.index");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent/knnd.index"), std::string::npos);
}

}  // namespace
}  // namespace knnd
