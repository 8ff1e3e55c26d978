#include "knnd/index/hybrid_fusion.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace knnd {
namespace {

// Min-max normalisation over one retriever's list: its best 1, its worst
// 0 (all 1 when they are equal), on a larger-is-better scale.
double Normalized(float score, float best, float worst) {
  if (best == worst) return 1.0;
  return (static_cast<double>(score) - worst) /
         (static_cast<double>(best) - worst);
}

}  // namespace

std::vector<FusedHit> FuseResults(absl::Span<const RetrievedHit> vector,
                                  bool larger_closer,
                                  absl::Span<const RetrievedHit> text,
                                  const FusionParams& params) {
  std::vector<FusedHit> hits;
  hits.reserve(vector.size() + text.size());
  absl::flat_hash_map<int64_t, size_t> at;
  for (size_t r = 0; r < vector.size(); ++r) {
    at[vector[r].id] = hits.size();
    FusedHit h;
    h.id = vector[r].id;
    h.vector_rank = static_cast<uint32_t>(r + 1);
    h.vector_score = vector[r].score;
    hits.push_back(h);
  }
  for (size_t r = 0; r < text.size(); ++r) {
    auto [it, added] = at.try_emplace(text[r].id, hits.size());
    if (added) {
      FusedHit h;
      h.id = text[r].id;
      hits.push_back(h);
    }
    FusedHit& h = hits[it->second];
    h.text_rank = static_cast<uint32_t>(r + 1);
    h.text_score = text[r].score;
  }
  // Vector scores on a larger-is-better scale for the normalisation.
  auto oriented = [larger_closer](float d) { return larger_closer ? d : -d; };
  const float vector_best = vector.empty() ? 0 : oriented(vector.front().score);
  const float vector_worst = vector.empty() ? 0 : oriented(vector.back().score);
  const float text_best = text.empty() ? 0 : text.front().score;
  const float text_worst = text.empty() ? 0 : text.back().score;
  for (FusedHit& h : hits) {
    switch (params.fusion) {
      case Fusion::kNone:
        h.fused = h.text_score;
        break;
      case Fusion::kRrf:
        h.fused =
            (h.vector_rank > 0 ? 1.0 / (params.rrf_k + h.vector_rank) : 0.0) +
            (h.text_rank > 0 ? 1.0 / (params.rrf_k + h.text_rank) : 0.0);
        break;
      case Fusion::kWeighted:
        h.fused = (h.vector_rank > 0 ? params.vector_weight *
                                           Normalized(oriented(h.vector_score),
                                                      vector_best, vector_worst)
                                     : 0.0) +
                  (h.text_rank > 0
                       ? params.text_weight *
                             Normalized(h.text_score, text_best, text_worst)
                       : 0.0);
        break;
    }
  }
  std::sort(hits.begin(), hits.end(), [](const FusedHit& a, const FusedHit& b) {
    return a.fused != b.fused ? a.fused > b.fused : a.id < b.id;
  });
  return hits;
}

}  // namespace knnd
