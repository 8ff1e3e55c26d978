// FilterCache: the row bitmaps of attribute filters that requests repeat,
// kept by one index version (IndexSnapshot owns one), so that a repeated
// filter costs a lookup instead of its compilation, and the IVF scan tests
// a bitmap of ntotal / 8 bytes (in cache) for each candidate instead of
// reading the candidate's value at a random row of a mapped column.
//
// Keyed by the filter's serialised bytes: the same filter sent again (a
// tenant, a date range, a category) is the same key; an equivalent filter
// written differently is another key. Which filters are kept is the
// caller's policy (search_request.cc ParseFilter): one compiled to a bitmap
// anyway is kept at once, its compilation already paid; one the scan could
// test through a column's bounds only on its second sighting among the last
// kSeenKeys distinct filters missed (Find's seen_before), so a filter sent
// once costs nothing more than before.
//
// A kept filter admitting few rows may come with its FastScan lists cut
// down to those rows (faiss/filtered_lists.h; the caller builds them,
// IndexSnapshot::FilterLists): the search then reads only the matching
// codes (the IVF plan's probed lists, or the flat plan's every match).
//
// Bounded: entries (bitmap + lists + key bytes) are evicted least recently used
// first so that their sum stays <= max_bytes, the bound the memory model
// counts with the index's heap (IndexInfo::filter_cache_bytes); a bitmap
// larger than max_bytes is not kept. The missed keys' hashes (at most
// kSeenKeys, ~100 KiB) are outside that bound. Each version's cache goes
// with it: a hot swap starts the new version with an empty one.
//
// Thread-safety: every method is thread-safe (one mutex, held for a hash
// lookup or an insertion, never while a bitmap is compiled). Bitmaps are
// handed out as shared, immutable values: one evicted, or the cache gone,
// stays valid for the requests holding it.
#ifndef KNND_INDEX_FILTER_CACHE_H_
#define KNND_INDEX_FILTER_CACHE_H_

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "knnd/base/row_bitmap.h"
#include "knnd/faiss/filtered_lists.h"

namespace knnd {

class FilterCache {
 public:
  // Distinct missed keys remembered (by 64-bit hash) for seen_before.
  static constexpr int kSeenKeys = 4096;

  struct Lookup {
    // The kept bitmap and its count of rows set; null on a miss.
    std::shared_ptr<const RowBitmap> rows;
    int64_t matched = 0;
    // Its lists, when kept with it; else null.
    std::shared_ptr<const FilteredLists> lists;
    // On a miss: whether this key missed before, among the last kSeenKeys
    // distinct keys that missed.
    bool seen_before = false;
  };

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t insertions = 0;
    int64_t evictions = 0;
    int64_t entries = 0;
    int64_t bytes = 0;  // bitmaps, lists and keys kept now
  };

  explicit FilterCache(int64_t max_bytes) : max_bytes_(max_bytes) {}
  FilterCache(const FilterCache&) = delete;
  FilterCache& operator=(const FilterCache&) = delete;

  int64_t max_bytes() const { return max_bytes_; }

  // What is kept for `key`: a hit makes it the most recently used; a miss
  // is remembered for the next lookup's seen_before.
  Lookup Find(absl::string_view key);
  // Find() for a hit; a miss changes nothing (not counted, not
  // remembered): the handler asks this first, before it compiles anything
  // that a kept filter makes unneeded, and Find() only where it did.
  Lookup FindIfKept(absl::string_view key);

  struct Inserted {
    std::shared_ptr<const RowBitmap> rows;
    int64_t matched = 0;  // rows->Count()
    std::shared_ptr<const FilteredLists> lists;
    bool kept = false;  // false: larger than max_bytes, handed back only
  };
  // Keeps `rows` (and `lists`, when not null: rows' lists) for `key`
  // (evicting the least recently used entries it needs room from) and
  // returns the bitmap and lists to use: those another thread kept first
  // for the same key, or these, shared, and kept only when they fit
  // (Bytes(key, rows, lists) <= max_bytes). `matched`: rows.Count() where
  // the caller has it (a count reads the whole bitmap), else -1.
  Inserted Insert(std::string key, RowBitmap rows,
                  std::unique_ptr<const FilteredLists> lists = nullptr,
                  int64_t matched = -1);

  Stats stats() const;

  // What an entry counts against max_bytes.
  static int64_t Bytes(absl::string_view key, const RowBitmap& rows,
                       const FilteredLists* lists = nullptr) {
    return rows.bytes() + static_cast<int64_t>(key.size()) +
           (lists != nullptr ? lists->bytes() : 0);
  }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const RowBitmap> rows;
    int64_t matched = 0;
    std::shared_ptr<const FilteredLists> lists;
    int64_t bytes = 0;
  };
  using Lru = std::list<Entry>;  // most recently used first

  // A hit's entry into `found` (and its use counted); false on a miss.
  bool FindKept(absl::string_view key, Lookup& found)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers a missed key's hash, forgetting the oldest past kSeenKeys.
  void RememberMiss(uint64_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  // Keys view the entries' own strings, which live as long as the entries.
  absl::flat_hash_map<absl::string_view, Lru::iterator> index_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> seen_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> seen_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knnd

#endif  // KNND_INDEX_FILTER_CACHE_H_
