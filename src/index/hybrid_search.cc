#include "knnd/index/hybrid_search.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"

namespace knnd {
namespace {

// One candidate of a query's fusion: where each retriever put it.
struct Candidate {
  int64_t id = -1;
  uint32_t vector_rank = 0;
  float vector_score = 0;
  uint32_t text_rank = 0;
  float text_score = 0;
  double fused = 0;
};

// Min-max normalisation of one retriever's scores over its window: its
// best 1, its worst 0 (all 1 when they are equal).
class Normalizer {
 public:
  Normalizer(float best, float worst) : best_(best), worst_(worst) {}
  double operator()(float score) const {
    if (best_ == worst_) return 1.0;
    return (static_cast<double>(score) - worst_) /
           (static_cast<double>(best_) - worst_);
  }

 private:
  const float best_;
  const float worst_;
};

void Fuse(const HybridQuery& query, std::vector<Candidate>& candidates,
          int vector_count, int text_count, float vector_best,
          float vector_worst, float text_best, float text_worst) {
  const Normalizer vector_norm(vector_best, vector_worst);
  const Normalizer text_norm(text_best, text_worst);
  for (Candidate& c : candidates) {
    switch (query.fusion) {
      case Fusion::kNone:
        c.fused = c.text_score;
        break;
      case Fusion::kRrf:
        c.fused =
            (c.vector_rank > 0 ? 1.0 / (query.rrf_k + c.vector_rank) : 0.0) +
            (c.text_rank > 0 ? 1.0 / (query.rrf_k + c.text_rank) : 0.0);
        break;
      case Fusion::kWeighted:
        c.fused = (c.vector_rank > 0 && vector_count > 0
                       ? query.vector_weight * vector_norm(c.vector_score)
                       : 0.0) +
                  (c.text_rank > 0 && text_count > 0
                       ? query.text_weight * text_norm(c.text_score)
                       : 0.0);
        break;
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) {
              return a.fused != b.fused ? a.fused > b.fused : a.id < b.id;
            });
}

}  // namespace

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
  std::vector<Candidate> candidates;
  absl::flat_hash_map<int64_t, size_t> at;
  for (int64_t q = 0; q < nq; ++q) {
    candidates.clear();
    at.clear();
    int vector_count = 0;
    float vector_best = 0, vector_worst = 0;
    for (int r = 0; r < vw; ++r) {
      const int64_t id = vector_ids[static_cast<size_t>(q * vw + r)];
      if (id < 0) break;
      const float d = vector_distances[static_cast<size_t>(q * vw + r)];
      // Scores for normalisation: larger better.
      const float score = larger_closer ? d : -d;
      if (vector_count == 0) vector_best = score;
      vector_worst = score;
      ++vector_count;
      at[id] = candidates.size();
      Candidate c;
      c.id = id;
      c.vector_rank = static_cast<uint32_t>(r + 1);
      c.vector_score = d;
      candidates.push_back(c);
    }
    const std::vector<TextHit>& hits = text_hits[static_cast<size_t>(q)];
    const int text_count = static_cast<int>(hits.size());
    for (int r = 0; r < text_count; ++r) {
      const int64_t id = snapshot.IdOfRow(hits[r].row);
      auto [it, added] = at.try_emplace(id, candidates.size());
      if (added) {
        Candidate c;
        c.id = id;
        candidates.push_back(c);
      }
      Candidate& c = candidates[it->second];
      c.text_rank = static_cast<uint32_t>(r + 1);
      c.text_score = hits[r].score;
    }
    // The vector scores normalised on the larger-is-better scale.
    if (!larger_closer) {
      for (Candidate& c : candidates) {
        if (c.vector_rank > 0) c.vector_score = -c.vector_score;
      }
    }
    Fuse(query, candidates, vector_count, text_count, vector_best, vector_worst,
         text_count > 0 ? hits.front().score : 0,
         text_count > 0 ? hits.back().score : 0);
    if (!larger_closer) {
      for (Candidate& c : candidates) {
        if (c.vector_rank > 0) c.vector_score = -c.vector_score;
      }
    }
    for (int i = 0; i < k; ++i) {
      const size_t e = static_cast<size_t>(q * k + i);
      const bool have = i < static_cast<int>(candidates.size());
      const Candidate c =
          have ? candidates[static_cast<size_t>(i)] : Candidate();
      args.ids[e] = c.id;
      args.distances[e] = have ? static_cast<float>(c.fused)
                               : -std::numeric_limits<float>::infinity();
      if (out.vector_ranks != nullptr) {
        out.vector_ranks[e] = c.vector_rank;
        out.vector_scores[e] = c.vector_score;
      }
      out.text_ranks[e] = c.text_rank;
      out.text_scores[e] = c.text_score;
    }
  }
  return absl::OkStatus();
}

}  // namespace knnd
