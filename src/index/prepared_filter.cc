#include "knnd/index/prepared_filter.h"

#include <algorithm>
#include <string>
#include <utility>

#include "knnd/index/filter_cache.h"

namespace knnd {
namespace {

FilterPlanInput PlanInput(const IndexSnapshot& snapshot,
                          const FilteredSearchShape& shape,
                          int64_t matched_rows, bool filtered_lists) {
  FilterPlanInput input =
      PlanInputFor(matched_rows, shape.nprobe, shape.k, shape.refine_factor,
                   snapshot.info().has_vectors);
  input.filtered_lists = filtered_lists;
  return input;
}

// The plan and starting nprobe of `filter`, whose form is set.
void Plan(const IndexSnapshot& snapshot, const FilteredSearchShape& shape,
          PreparedFilter& filter) {
  const FilterPlanInput input =
      PlanInput(snapshot, shape, filter.matched_rows, filter.lists != nullptr);
  filter.plan = ChooseFilterPlan(snapshot.info(), input);
  filter.start_nprobe = StartingNprobe(snapshot.info(), input);
}

// Whether the IVF plan of a filter of one numeric condition costs less
// through its bounds than through a bitmap compiled for this request. The
// bitmap sets a bit per matching row (per other row past half the column);
// the bounds cost nothing up front but a test, a read of the mapped column,
// per code the IVF plan looks at: at most every code of the lists it starts
// with, and far fewer once a query's heap holds matches. So the bitmap
// where its rows are fewer than those codes (1M rows at 1%: 10,000 bits
// against 20 of 1,024 lists, ~20,000 codes; bench/RESULTS.md "Filters").
// A bitmap the filter cache already holds costs nothing up front and a
// test of ntotal / 8 bytes in cache per code: it beats the bounds.
bool BoundsCheaperThanCompiling(const IndexSnapshot& snapshot,
                                const FilteredSearchShape& shape,
                                int64_t matched_rows) {
  const IndexInfo& index = snapshot.info();
  const int64_t bits = std::min(matched_rows, index.ntotal - matched_rows);
  const int64_t codes =
      shape.num_queries *
      StartingNprobe(index, PlanInput(snapshot, shape, matched_rows, false)) *
      (index.ntotal / std::max<int64_t>(index.nlist, 1));
  return bits > codes;
}

// A bitmap admitting `matched` rows (counted by the caller: a count reads
// the whole bitmap), with its lists or null, planned for `shape`; `cached`:
// the filter cache holds it.
PreparedFilter FromRows(const IndexSnapshot& snapshot,
                        const FilteredSearchShape& shape,
                        std::shared_ptr<const RowBitmap> rows, int64_t matched,
                        std::shared_ptr<const FilteredLists> lists,
                        PreparedFilter::CacheUse cache_use, bool cached) {
  PreparedFilter filter;
  filter.rows = std::move(rows);
  filter.matched_rows = matched;
  filter.lists = std::move(lists);
  filter.cache_use = cache_use;
  filter.cached = cached;
  Plan(snapshot, shape, filter);
  return filter;
}

// A filter cache hit's bitmap and lists, as they are, with their count.
PreparedFilter Kept(const IndexSnapshot& snapshot,
                    const FilteredSearchShape& shape,
                    FilterCache::Lookup kept) {
  return FromRows(snapshot, shape, std::move(kept.rows), kept.matched,
                  std::move(kept.lists), PreparedFilter::CacheUse::kHit,
                  /*cached=*/true);
}

}  // namespace

PreparedFilter PrepareRows(const IndexSnapshot& snapshot,
                           std::shared_ptr<const RowBitmap> rows,
                           std::shared_ptr<const FilteredLists> lists,
                           const FilteredSearchShape& shape) {
  const int64_t matched = rows->Count();
  return FromRows(snapshot, shape, std::move(rows), matched, std::move(lists),
                  PreparedFilter::CacheUse::kNone, /*cached=*/false);
}

PreparedFilter PrepareRange(const IndexSnapshot& snapshot, ColumnRange range,
                            const FilteredSearchShape& shape) {
  PreparedFilter filter;
  filter.matched_rows = range.matched;
  filter.range = std::move(range);
  Plan(snapshot, shape, filter);
  return filter;
}

absl::StatusOr<PreparedFilter> PrepareFilter(const knnd::v1::Filter& filter,
                                             std::vector<int64_t>& allowed_ids,
                                             const FilteredSearchShape& shape,
                                             const IndexSnapshot& snapshot,
                                             const FilterLimits& limits) {
  FilterCache* const cache =
      allowed_ids.empty() ? snapshot.filter_cache() : nullptr;
  std::string key;
  if (cache != nullptr) {
    // A kept filter is used as it is: nothing compiled, not even a
    // column's bounds.
    key = filter.SerializeAsString();
    FilterCache::Lookup kept = cache->FindIfKept(key);
    if (kept.rows != nullptr) return Kept(snapshot, shape, std::move(kept));
  }
  std::optional<ColumnRange> range;
  bool exact_plan = false;
  if (allowed_ids.empty()) {
    // One numeric condition may need no bitmap: two binary searches count
    // its rows, and the search tests only the candidates it looks at. The
    // exact plan lists its few matches from the column's sorted rows;
    // where the snapshot would keep the filter with its lists (flat plan,
    // cheaper still), it is kept on its second sighting.
    absl::StatusOr<std::optional<ColumnRange>> compiled =
        snapshot.CompileColumnRange(filter, limits);
    if (!compiled.ok()) return compiled.status();
    range = std::move(*compiled);
    exact_plan = range.has_value() &&
                 ChooseFilterPlan(snapshot.info(),
                                  PlanInput(snapshot, shape, range->matched,
                                            false)) == FilterPlan::kExact;
    if (exact_plan &&
        (cache == nullptr || !snapshot.KeepsFilterLists(range->matched))) {
      return PrepareRange(snapshot, *range, shape);
    }
  }
  bool keep_bounds =
      range.has_value() && (exact_plan || BoundsCheaperThanCompiling(
                                              snapshot, shape, range->matched));
  PreparedFilter::CacheUse cache_use = PreparedFilter::CacheUse::kNone;
  if (cache != nullptr) {
    FilterCache::Lookup found = cache->Find(key);
    if (found.rows != nullptr) {  // kept since FindIfKept, by another call
      return Kept(snapshot, shape, std::move(found));
    }
    cache_use = PreparedFilter::CacheUse::kMiss;
    // Seen before: compiled now, and kept for the next ones.
    keep_bounds = keep_bounds && !found.seen_before;
  }
  if (keep_bounds) {
    PreparedFilter prepared = PrepareRange(snapshot, *range, shape);
    prepared.cache_use = cache_use;
    return prepared;
  }
  absl::StatusOr<RowBitmap> rows =
      snapshot.CompileFilter(filter, allowed_ids, limits);
  if (!rows.ok()) return rows.status();
  allowed_ids.clear();  // folded into the bitmap
  const int64_t matched = rows->Count();
  if (cache == nullptr) {
    return FromRows(snapshot, shape,
                    std::make_shared<const RowBitmap>(std::move(*rows)),
                    matched, nullptr, cache_use, /*cached=*/false);
  }
  // A filter admitting few rows is kept with its lists cut down to them.
  std::unique_ptr<const FilteredLists> lists =
      snapshot.FilterLists(*rows, matched);
  FilterCache::Inserted inserted = cache->Insert(
      std::move(key), std::move(*rows), std::move(lists), matched);
  return FromRows(snapshot, shape, std::move(inserted.rows), inserted.matched,
                  inserted.kept ? std::move(inserted.lists) : nullptr,
                  cache_use, /*cached=*/inserted.kept);
}

}  // namespace knnd
