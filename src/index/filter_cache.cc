#include "knnd/index/filter_cache.h"

#include <utility>

#include "absl/hash/hash.h"

namespace knnd {

bool FilterCache::FindKept(absl::string_view key, Lookup& found) {
  const auto it = index_.find(key);
  if (it == index_.end()) return false;
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  found.rows = it->second->rows;
  found.matched = it->second->matched;
  found.lists = it->second->lists;
  return true;
}

FilterCache::Lookup FilterCache::FindIfKept(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  Lookup found;
  FindKept(key, found);
  return found;
}

FilterCache::Lookup FilterCache::Find(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  Lookup found;
  if (FindKept(key, found)) return found;
  ++stats_.misses;
  const uint64_t hash = absl::HashOf(key);
  found.seen_before = seen_.contains(hash);
  if (!found.seen_before) RememberMiss(hash);
  return found;
}

void FilterCache::RememberMiss(uint64_t hash) {
  seen_.insert(hash);
  seen_order_.push_back(hash);
  if (seen_order_.size() > static_cast<size_t>(kSeenKeys)) {
    seen_.erase(seen_order_.front());
    seen_order_.pop_front();
  }
}

FilterCache::Inserted FilterCache::Insert(
    std::string key, RowBitmap rows,
    std::unique_ptr<const FilteredLists> lists, int64_t matched) {
  const int64_t bytes = Bytes(key, rows, lists.get());
  if (matched < 0) matched = rows.Count();
  auto shared = std::make_shared<const RowBitmap>(std::move(rows));
  std::shared_ptr<const FilteredLists> shared_lists = std::move(lists);
  if (bytes > max_bytes_) {
    return Inserted{std::move(shared), matched, std::move(shared_lists),
                    false};
  }
  absl::MutexLock lock(&mu_);
  const auto it = index_.find(key);
  if (it != index_.end()) {
    return Inserted{it->second->rows, it->second->matched, it->second->lists,
                    true};
  }
  while (!lru_.empty() && stats_.bytes + bytes > max_bytes_) {
    Entry& oldest = lru_.back();
    stats_.bytes -= oldest.bytes;
    --stats_.entries;
    ++stats_.evictions;
    index_.erase(oldest.key);
    lru_.pop_back();
  }
  lru_.push_front(Entry{std::move(key), shared, matched, shared_lists, bytes});
  index_.emplace(lru_.front().key, lru_.begin());
  stats_.bytes += bytes;
  ++stats_.entries;
  ++stats_.insertions;
  return Inserted{std::move(shared), matched, std::move(shared_lists), true};
}

FilterCache::Stats FilterCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace knnd
