#include "knnd/serving/heap_trimmer.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "knnd/monitoring/process_stats.h"
#include "testing/glibc_malloc.h"

namespace knnd {
namespace {

using ::knnd::testing::kGlibcMalloc;

int64_t RssAnon() {
  return ReadProcessStats("/proc").resident_anonymous_bytes.value_or(-1);
}

// Leaves `mib` MiB of freed, touched memory in the middle of the main heap:
// 32 KiB blocks (below the mmap threshold) taken in a row from the heap's
// top, all freed but the last, which stays (returned) to pin the top, so
// free() alone cannot give the pages back.
void* LeaveFreedMemoryInTheHeap(int mib) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // fixed: the blocks stay in the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  std::vector<void*> blocks;
  for (int i = 0; i <= mib * 32; ++i) {
    void* p = std::malloc(32 << 10);
    std::memset(p, 1, 32 << 10);
    blocks.push_back(p);
  }
  void* pin = blocks.back();
  blocks.pop_back();
  for (void* p : blocks) std::free(p);
  return pin;
}

TEST(HeapTrimmer, GivesFreedMiddleOfHeapMemoryBack) {
  if (!kGlibcMalloc) GTEST_SKIP() << "needs glibc malloc";
  const int64_t before = RssAnon();
  ASSERT_GT(before, 0);
  void* pin = LeaveFreedMemoryInTheHeap(64);
  const int64_t freed = RssAnon();
  // free() kept the pages: that is what the trimmer exists for.
  EXPECT_GT(freed - before, 48 << 20);
  EXPECT_GE(HeapFreeBytes(), 48 << 20);

  HeapTrimmer::Options options;
  options.interval = absl::ZeroDuration();
  HeapTrimmer trimmer(options);
  EXPECT_GE(trimmer.TrimIfWorthIt(), 48 << 20);
  EXPECT_EQ(trimmer.trims(), 1);
  EXPECT_LT(RssAnon() - before, 16 << 20);
  std::free(pin);
}

TEST(HeapTrimmer, DoesNotTrimBelowTheMinimum) {
  HeapTrimmer::Options options;
  options.interval = absl::ZeroDuration();
  options.min_free_bytes = int64_t{1} << 40;
  HeapTrimmer trimmer(options);
  EXPECT_EQ(trimmer.TrimIfWorthIt(), 0);
  EXPECT_EQ(trimmer.trims(), 0);
}

TEST(HeapTrimmer, ItsThreadTrimsAfterABurst) {
  if (!kGlibcMalloc) GTEST_SKIP() << "needs glibc malloc";
  HeapTrimmer::Options options;
  options.interval = absl::Milliseconds(20);
  options.min_free_bytes = 8 << 20;
  HeapTrimmer trimmer(options);
  trimmer.Start();
  const int64_t before = RssAnon();
  void* pin = LeaveFreedMemoryInTheHeap(64);
  // Polled (not timed): the thread trims within a few intervals. It may
  // first trim halfway through the burst, so wait for the memory, not for
  // the first trim: free() alone never gives it back (the test above), and
  // the thread trims again while the arena holds >= min_free_bytes free.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while ((trimmer.trims() == 0 || RssAnon() - before >= (16 << 20)) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(trimmer.trims(), 1);
  EXPECT_GE(trimmer.trimmed_free_bytes(), 8 << 20);
  EXPECT_LT(RssAnon() - before, 16 << 20);
  trimmer.Stop();
  trimmer.Stop();  // idempotent
  std::free(pin);
}

TEST(HeapTrimmer, ZeroIntervalStartsNoThread) {
  HeapTrimmer::Options options;
  options.interval = absl::ZeroDuration();
  HeapTrimmer trimmer(options);
  trimmer.Start();
  trimmer.Stop();
  EXPECT_EQ(trimmer.trims(), 0);
}

TEST(HeapTrimmer, OptionsOutOfRangeNameTheField) {
  HeapTrimmer::Options options;
  options.interval = absl::Hours(2);
  absl::Status s = HeapTrimmer::ValidateOptions(options);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("heap_trim_interval_ms=7200000"),
            std::string::npos)
      << s;
  options.interval = absl::Seconds(1);
  options.min_free_bytes = 100;
  s = HeapTrimmer::ValidateOptions(options);
  EXPECT_NE(s.message().find("heap_trim_min_free_bytes=100"), std::string::npos)
      << s;
  options.min_free_bytes = 8 << 20;
  EXPECT_TRUE(HeapTrimmer::ValidateOptions(options).ok());
}

}  // namespace
}  // namespace knnd
