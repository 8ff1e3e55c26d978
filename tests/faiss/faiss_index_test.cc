// The FAISS wrapper's arithmetic that the memory model relies on.
#include "knnd/faiss/faiss_index.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace knnd {
namespace {

TEST(MemoryModel, PrecomputedTableIsNlistTimesMTimesKsubFloats) {
  EXPECT_EQ(PrecomputedTableBytes(4096, 32, 8), int64_t{4096} * 32 * 256 * 4);
  EXPECT_EQ(PrecomputedTableBytes(1024, 16, 4), int64_t{1024} * 16 * 16 * 4);
}

}  // namespace
}  // namespace knnd
