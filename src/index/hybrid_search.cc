#include "knnd/index/hybrid_search.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/time/clock.h"

namespace knnd {

absl::Status SearchHybrid(const IndexSnapshot& snapshot, const SearchArgs& args,
                          const PreparedFilter* filter,
                          const HybridQuery& query, int64_t first,
                          const HybridOutputs& out) {
  const TextIndex* text = snapshot.text();
  if (text == nullptr) {
    return absl::FailedPreconditionError(
        "the index has no text index (build it with knnctl build --text)");
  }
  const int64_t nq = args.num_queries;
  const int k = args.k;
  const bool vectors = query.fusion != Fusion::kNone;
  // The vector retriever: the search every request runs, for the window.
  std::vector<int64_t> vector_ids;
  std::vector<float> vector_distances;
  const int vw = vectors ? query.vector_window : 0;
  if (vectors) {
    const absl::Time start = absl::Now();
    vector_ids.resize(static_cast<size_t>(nq * vw));
    vector_distances.resize(static_cast<size_t>(nq * vw));
    SearchArgs v = args;
    v.k = vw;
    v.ids = vector_ids.data();
    v.distances = vector_distances.data();
    v.return_candidates = false;
    v.approx_distances = nullptr;
    if (absl::Status s = snapshot.Search(v, filter); !s.ok()) return s;
    if (out.vector_time != nullptr) *out.vector_time = absl::Now() - start;
  }
  // The text retriever, admitting what the filter and allow-list admit.
  const absl::Time text_start = absl::Now();
  std::function<bool(int64_t)> admit;
  if (filter != nullptr && filter->rows != nullptr) {
    const RowBitmap* rows = filter->rows.get();
    admit = [rows](int64_t row) { return rows->Test(row); };
  } else if (filter != nullptr && filter->range.has_value()) {
    const ColumnRange* range = &*filter->range;
    admit = [range](int64_t row) { return range->Test(row); };
  }
  if (!args.allowed_ids.empty()) {
    const absl::Span<const int64_t> ids = args.allowed_ids;
    std::function<bool(int64_t)> before = std::move(admit);
    admit = [&snapshot, ids, before = std::move(before)](int64_t row) {
      return (!before || before(row)) &&
             std::binary_search(ids.begin(), ids.end(), snapshot.IdOfRow(row));
    };
  }
  std::vector<float> scratch;
  std::vector<std::vector<TextHit>> text_hits(static_cast<size_t>(nq));
  for (int64_t q = 0; q < nq; ++q) {
    text->Search(query.terms[static_cast<size_t>(first + q)],
                 admit ? &admit : nullptr, query.text_window, &scratch,
                 &text_hits[static_cast<size_t>(q)]);
  }
  if (out.text_time != nullptr) *out.text_time = absl::Now() - text_start;

  const bool larger_closer = snapshot.info().metric != Metric::kL2;
  std::vector<RetrievedHit> vector_list;
  std::vector<RetrievedHit> text_list;
  for (int64_t q = 0; q < nq; ++q) {
    vector_list.clear();
    text_list.clear();
    for (int r = 0; r < vw; ++r) {
      const size_t at = static_cast<size_t>(q * vw + r);
      if (vector_ids[at] < 0) break;
      vector_list.push_back({vector_ids[at], vector_distances[at]});
    }
    for (const TextHit& hit : text_hits[static_cast<size_t>(q)]) {
      text_list.push_back({snapshot.IdOfRow(hit.row), hit.score});
    }
    int64_t* ids = args.ids + q * k;
    float* scores = args.distances + q * k;
    const size_t first_entry = static_cast<size_t>(q * k);
    if (query.windows) {
      // For a merger: each retriever's list as it is, vector window first.
      for (int i = 0; i < k; ++i) {
        const size_t e = first_entry + static_cast<size_t>(i);
        const bool in_vector = i < vw;
        const std::vector<RetrievedHit>& list =
            in_vector ? vector_list : text_list;
        const int r = in_vector ? i : i - vw;
        const bool have = r < static_cast<int>(list.size());
        ids[i] = have ? list[static_cast<size_t>(r)].id : -1;
        scores[i] = have ? list[static_cast<size_t>(r)].score : 0.0f;
        if (out.vector_ranks != nullptr) {
          out.vector_ranks[e] = in_vector && have ? r + 1 : 0;
          out.vector_scores[e] = in_vector ? scores[i] : 0.0f;
        }
        out.text_ranks[e] = !in_vector && have ? r + 1 : 0;
        out.text_scores[e] = in_vector ? 0.0f : scores[i];
      }
      continue;
    }
    const std::vector<FusedHit> fused =
        FuseResults(vector_list, larger_closer, text_list, query);
    for (int i = 0; i < k; ++i) {
      const size_t e = first_entry + static_cast<size_t>(i);
      const bool have = i < static_cast<int>(fused.size());
      const FusedHit h = have ? fused[static_cast<size_t>(i)] : FusedHit();
      ids[i] = h.id;
      scores[i] = have ? static_cast<float>(h.fused)
                       : -std::numeric_limits<float>::infinity();
      if (out.vector_ranks != nullptr) {
        out.vector_ranks[e] = h.vector_rank;
        out.vector_scores[e] = h.vector_score;
      }
      out.text_ranks[e] = h.text_rank;
      out.text_scores[e] = h.text_score;
    }
  }
  return absl::OkStatus();
}

}  // namespace knnd
