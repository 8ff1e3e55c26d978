#include "knnd/index/list_ids.h"

#include <algorithm>

namespace knnd {

std::vector<int64_t> ListIds::ListIdsOf(
    absl::Span<const int64_t> sorted_ids) const {
  if (table_ == nullptr) {
    return std::vector<int64_t>(sorted_ids.begin(), sorted_ids.end());
  }
  std::vector<int64_t> list_ids;
  list_ids.reserve(sorted_ids.size());
  for (int64_t id : sorted_ids) {
    const int64_t row = table_->RowOf(id);
    if (row >= 0) list_ids.push_back(row + first_);
  }
  if (list_ids.empty()) return {-1};
  std::sort(list_ids.begin(), list_ids.end());
  return list_ids;
}

void ListIds::ToAnswerIds(int64_t num_queries, int k, const float* distances,
                          int64_t* ids) const {
  if (table_ == nullptr) return;
  const int64_t n = num_queries * k;
  for (int64_t i = 0; i < n; ++i) ids[i] = IdOf(ids[i]);
  for (int64_t q = 0; q < num_queries; ++q) {
    const float* d = distances + q * k;
    int64_t* out = ids + q * k;
    for (int begin = 0; begin < k;) {
      int end = begin + 1;
      while (end < k && d[end] == d[begin]) ++end;
      std::sort(out + begin, out + end, [](int64_t a, int64_t b) {
        return (a < 0) != (b < 0) ? b < 0 : a < b;  // missing ones last
      });
      begin = end;
    }
  }
}

}  // namespace knnd
