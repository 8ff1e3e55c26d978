// FilterCache (index/filter_cache.h): kept bitmaps found by key (and by
// FindIfKept, which changes nothing on a miss), a second miss of a key
// seen, least recently used entries evicted within the
// bound, a bitmap larger than the bound handed back unkept, the same key
// kept once when two threads insert it, and bitmaps held by requests valid
// after their eviction.
#include "knnd/index/filter_cache.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace knnd {
namespace {

// A bitmap of `rows` rows with every `step`-th row set.
RowBitmap Every(int64_t rows, int64_t step) {
  RowBitmap bitmap(rows);
  for (int64_t r = 0; r < rows; r += step) bitmap.Set(r);
  return bitmap;
}

TEST(FilterCache, FindsWhatWasKeptByItsKey) {
  FilterCache cache(1 << 20);
  const FilterCache::Inserted in = cache.Insert("a", Every(1000, 3));
  ASSERT_TRUE(in.kept);
  EXPECT_EQ(in.matched, 334);
  const FilterCache::Lookup a = cache.Find("a");
  EXPECT_EQ(a.rows, in.rows);  // the same shared bitmap, not a copy
  EXPECT_EQ(a.matched, 334);
  EXPECT_EQ(*a.rows, Every(1000, 3));
  EXPECT_EQ(cache.Find("b").rows, nullptr);
  const FilterCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.insertions, 1);
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.bytes, FilterCache::Bytes("a", Every(1000, 3)));
}

TEST(FilterCache, ASecondMissOfAKeyWasSeenBeforeUntilForgotten) {
  FilterCache cache(1 << 20);
  EXPECT_FALSE(cache.Find("x").seen_before);
  EXPECT_TRUE(cache.Find("x").seen_before);
  EXPECT_FALSE(cache.Find("y").seen_before);
  // kSeenKeys other keys missed since: "x" is forgotten.
  for (int i = 0; i < FilterCache::kSeenKeys; ++i) {
    cache.Find("other " + std::to_string(i));
  }
  EXPECT_FALSE(cache.Find("x").seen_before);
}

// FindIfKept: a hit as Find's (counted, the entry made the most recent);
// a miss neither counted nor remembered for seen_before.
TEST(FilterCache, FindIfKeptChangesNothingOnAMiss) {
  FilterCache cache(1 << 20);
  EXPECT_EQ(cache.FindIfKept("x").rows, nullptr);
  EXPECT_EQ(cache.FindIfKept("x").rows, nullptr);
  EXPECT_FALSE(cache.Find("x").seen_before);  // never remembered above
  EXPECT_EQ(cache.stats().misses, 1);
  const FilterCache::Inserted in = cache.Insert("x", Every(640, 4));
  const FilterCache::Lookup kept = cache.FindIfKept("x");
  EXPECT_EQ(kept.rows, in.rows);
  EXPECT_EQ(kept.matched, 160);
  EXPECT_EQ(cache.stats().hits, 1);
}

TEST(FilterCache, EvictsTheLeastRecentlyUsedWithinItsBound) {
  const int64_t one = FilterCache::Bytes("a", RowBitmap(6400));
  FilterCache cache(2 * one);
  ASSERT_TRUE(cache.Insert("a", Every(6400, 2)).kept);
  ASSERT_TRUE(cache.Insert("b", Every(6400, 5)).kept);
  const std::shared_ptr<const RowBitmap> held_b = cache.Find("b").rows;
  ASSERT_NE(cache.Find("a").rows, nullptr);  // "a" now the most recent
  ASSERT_TRUE(cache.Insert("c", Every(6400, 7)).kept);
  EXPECT_NE(cache.Find("a").rows, nullptr);
  EXPECT_EQ(cache.Find("b").rows, nullptr);
  EXPECT_NE(cache.Find("c").rows, nullptr);
  const FilterCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.entries, 2);
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_LE(stats.bytes, cache.max_bytes());
  // A request holding "b" still reads it after its eviction.
  EXPECT_EQ(*held_b, Every(6400, 5));
}

TEST(FilterCache, ABitmapLargerThanTheBoundIsHandedBackUnkept) {
  FilterCache cache(100);
  const FilterCache::Inserted in = cache.Insert("big", Every(64 * 100, 2));
  EXPECT_FALSE(in.kept);
  ASSERT_NE(in.rows, nullptr);
  EXPECT_EQ(in.matched, 3200);
  EXPECT_EQ(cache.Find("big").rows, nullptr);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(cache.stats().bytes, 0);
  FilterCache off(0);
  EXPECT_FALSE(off.Insert("a", Every(64, 2)).kept);
}

// Threads compiling the same filter at once: the first insertion is kept
// and every thread gets it; lookups meanwhile see one entry or none.
TEST(FilterCache, ThreadsInsertingOneKeyShareTheFirstKept) {
  FilterCache cache(1 << 20);
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const RowBitmap>> got(8);
  std::atomic<int> kept{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) cache.Find("k" + std::to_string(i % 5));
      const FilterCache::Inserted in = cache.Insert("same", Every(4096, 3));
      kept += in.kept;
      got[t] = in.rows;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(kept.load(), 8);
  for (const auto& rows : got) EXPECT_EQ(rows, got[0]);
  EXPECT_EQ(cache.stats().entries, 1);
  EXPECT_EQ(cache.stats().insertions, 1);
  EXPECT_EQ(cache.Find("same").rows, got[0]);
}

}  // namespace
}  // namespace knnd
