// The order in which a merger of shards (docs/sharding.md, rules 2 and 3)
// takes one query's results: one function shared by knnd's front
// (rpc/shard_merge.h) and the search of a shard set that tuning measures
// (shard_set_search.h), so that what is tuned is what a front serves.
//
// Thread-safety: a pure function of its arguments.
#ifndef KNND_INDEX_SHARD_MERGE_ORDER_H_
#define KNND_INDEX_SHARD_MERGE_ORDER_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace knnd {

// Reorders `entries`, one query's results from every shard, so that the
// first of them, as many as it returns (at most k), are the merged answer,
// best first. An Entry has `approx` (the PQ estimate; the exact distance
// when not re-ranked), `exact` (the distance answered) and `id`; none is
// NaN and none is a missing result (id < 0). With refine_factor r > 0
// the unsharded index's candidates are the r * k best estimates over
// every shard, and its answer the k best exact distances among them; with
// 0 the answer is the k best distances. Best is smallest when
// `ascending` (L2), else largest; equal values go by ascending id, as
// every shard and the whole index order them.
template <typename Entry>
size_t MergeOrder(std::vector<Entry>& entries, int k, int refine_factor,
                  bool ascending) {
  auto better = [ascending](float a, float b) {
    return ascending ? a < b : a > b;
  };
  auto by_approx = [&better](const Entry& a, const Entry& b) {
    if (a.approx != b.approx) return better(a.approx, b.approx);
    return a.id < b.id;
  };
  auto by_exact = [&better](const Entry& a, const Entry& b) {
    if (a.exact != b.exact) return better(a.exact, b.exact);
    return a.id < b.id;
  };
  if (refine_factor > 0) {
    const size_t kc =
        std::min(entries.size(),
                 static_cast<size_t>(refine_factor) * static_cast<size_t>(k));
    std::partial_sort(entries.begin(), entries.begin() + kc, entries.end(),
                      by_approx);
    entries.resize(kc);
  }
  const size_t keep = std::min(entries.size(), static_cast<size_t>(k));
  std::partial_sort(entries.begin(), entries.begin() + keep, entries.end(),
                    by_exact);
  return keep;
}

}  // namespace knnd

#endif  // KNND_INDEX_SHARD_MERGE_ORDER_H_
