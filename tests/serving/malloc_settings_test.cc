// ApplyMallocSettings' top pad: a large request's buffers, freed at the
// top of the heap, are kept for the next one instead of being given back
// and faulted in again.
#include "knnd/serving/malloc_settings.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "testing/glibc_malloc.h"

namespace knnd {
namespace {

using ::knnd::testing::kGlibcMalloc;

// Keeps the compiler from eliding a malloc, memset and free as unused.
void Use(void* p) { asm volatile("" : : "r"(p) : "memory"); }

int64_t MinorFaults() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Minor faults of 20 rounds of taking, touching and freeing 1000 KiB (a
// 256-row request of 784 float dims is 800 KB), under the 1 MiB mmap
// threshold: from the top of the main heap, as the request's copy is.
int64_t FaultsOfRepeatedLargeBuffers() {
  void* warm = std::malloc(1000 << 10);  // the first round's faults
  std::memset(warm, 1, 1000 << 10);
  Use(warm);
  std::free(warm);
  const int64_t before = MinorFaults();
  for (int round = 0; round < 20; ++round) {
    void* p = std::malloc(1000 << 10);
    std::memset(p, 1, 1000 << 10);
    Use(p);
    std::free(p);
  }
  return MinorFaults() - before;
}

// The settings are process-wide: each test sets all it depends on.
TEST(MallocSettings, TopPadKeepsALargeBufferResidentBetweenRequests) {
  if (!kGlibcMalloc) GTEST_SKIP() << "needs glibc malloc";
  MallocSettings settings;  // knnd's defaults: 1 MiB threshold, 2 MiB pad
  ASSERT_EQ(settings.top_pad_bytes, 2 << 20);
  ApplyMallocSettings(settings);
  // 250 pages a round without the pad (next test); a few in all with it.
  EXPECT_LT(FaultsOfRepeatedLargeBuffers(), 100);
}

TEST(MallocSettings, WithoutTheTopPadEachLargeBufferIsFaultedInAgain) {
  if (!kGlibcMalloc) GTEST_SKIP() << "needs glibc malloc";
  MallocSettings settings;
  settings.top_pad_bytes = 0;  // leaves glibc's pad as it is
  ApplyMallocSettings(settings);
  mallopt(M_TOP_PAD, 128 << 10);  // glibc's default, should the test before
                                  // have run in this process
  EXPECT_GT(FaultsOfRepeatedLargeBuffers(), 20 * 100);
}

}  // namespace
}  // namespace knnd
