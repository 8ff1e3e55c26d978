// Scoring ranked answers against relevance labels (knnctl eval --labels):
// nDCG@k with binary gains, Recall@k and MRR@k, the three figures BEIR and
// TREC-style evaluations report for text and hybrid retrieval, defined as
// bench/hybrid/hybrid_bench.py computes them so that the tool and the
// benchmark agree on the same answers.
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_RELEVANCE_EVAL_H_
#define KNND_INDEX_RELEVANCE_EVAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace knnd {

// Means over the scored queries.
struct RelevanceScores {
  double ndcg = 0;
  double recall = 0;
  double mrr = 0;
  int64_t queries = 0;  // queries scored (those with at least one label)
};

// The first `k` distinct labels of `labels` (one query's answers mapped to
// labels, best first), in order: several answers may carry one label (the
// chunks of one page), and a label counts once, at its best rank. Empty
// labels (an answer with none) are skipped.
std::vector<std::string> FirstDistinct(absl::Span<const std::string> labels,
                                       int k);

// Scores `ranked` (per query, FirstDistinct() of its answers: at most k
// labels, best first) against `relevant` (per query, its relevant labels;
// repeats count once). A query with no relevant label is not scored. Per
// query: nDCG@k = sum of 1/log2(rank + 1) over relevant labels at ranks
// 1..k, over the same sum for min(|relevant|, k) relevant labels ranked
// first; Recall@k = relevant labels found / |relevant|; MRR@k = 1 / the
// rank of the first relevant label (0 without one). `ranked` and
// `relevant` have one entry per query.
RelevanceScores ScoreRankings(
    absl::Span<const std::vector<std::string>> ranked,
    absl::Span<const std::vector<std::string>> relevant, int k);

}  // namespace knnd

#endif  // KNND_INDEX_RELEVANCE_EVAL_H_
