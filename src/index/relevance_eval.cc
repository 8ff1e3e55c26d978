#include "knnd/index/relevance_eval.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"

namespace knnd {

std::vector<std::string> FirstDistinct(absl::Span<const std::string> labels,
                                       int k) {
  std::vector<std::string> out;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& label : labels) {
    if (static_cast<int>(out.size()) >= k) break;
    if (label.empty() || !seen.insert(label).second) continue;
    out.push_back(label);
  }
  return out;
}

RelevanceScores ScoreRankings(
    absl::Span<const std::vector<std::string>> ranked,
    absl::Span<const std::vector<std::string>> relevant, int k) {
  RelevanceScores scores;
  const size_t n = std::min(ranked.size(), relevant.size());
  for (size_t q = 0; q < n; ++q) {
    const absl::flat_hash_set<std::string> wanted(relevant[q].begin(),
                                                  relevant[q].end());
    if (wanted.empty()) continue;
    double dcg = 0, reciprocal = 0;
    int found = 0;
    const size_t depth = std::min(ranked[q].size(), static_cast<size_t>(k));
    for (size_t i = 0; i < depth; ++i) {
      if (!wanted.contains(ranked[q][i])) continue;
      dcg += 1.0 / std::log2(static_cast<double>(i) + 2.0);
      if (found++ == 0) reciprocal = 1.0 / static_cast<double>(i + 1);
    }
    double ideal = 0;
    const size_t ideal_depth = std::min(wanted.size(), static_cast<size_t>(k));
    for (size_t i = 0; i < ideal_depth; ++i) {
      ideal += 1.0 / std::log2(static_cast<double>(i) + 2.0);
    }
    scores.ndcg += dcg / ideal;
    scores.recall +=
        static_cast<double>(found) / static_cast<double>(wanted.size());
    scores.mrr += reciprocal;
    ++scores.queries;
  }
  if (scores.queries > 0) {
    const double q = static_cast<double>(scores.queries);
    scores.ndcg /= q;
    scores.recall /= q;
    scores.mrr /= q;
  }
  return scores;
}

}  // namespace knnd
