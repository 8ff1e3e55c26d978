// The fusion of hybrid retrieval (hybrid_search.h): one query's vector
// and text results, each in its retriever's order, ranked into one list by
// RRF or by weighted min-max normalised scores. A pure function shared by
// the search over one index and by the merge of shards' windows
// (rpc/shard_merge.h), so that a sharded index fuses exactly as one index.
//
// Thread-safety: pure functions.
#ifndef KNND_INDEX_HYBRID_FUSION_H_
#define KNND_INDEX_HYBRID_FUSION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace knnd {

enum class Fusion {
  kNone,      // text alone: no vectors
  kRrf,       // reciprocal rank fusion
  kWeighted,  // weighted min-max normalised scores
};
inline constexpr int kDefaultRrfK = 60;
inline constexpr int kMaxRrfK = 100000;
inline constexpr float kDefaultFusionWeight = 0.5f;

// How one request fuses.
struct FusionParams {
  Fusion fusion = Fusion::kRrf;
  int rrf_k = kDefaultRrfK;
  float vector_weight = kDefaultFusionWeight;
  float text_weight = kDefaultFusionWeight;
};

// One result of one retriever: its id and its score there (a vector
// distance, or a BM25 score).
struct RetrievedHit {
  int64_t id = -1;
  float score = 0;
};

// One fused result: its fused score (BM25's with Fusion::kNone), and each
// retriever's rank (from 1; 0: not in its list) and score (0 without).
struct FusedHit {
  int64_t id = -1;
  double fused = 0;
  uint32_t vector_rank = 0;
  float vector_score = 0;
  uint32_t text_rank = 0;
  float text_score = 0;
};

// The union of `vector` (best first; distances, smaller better unless
// `larger_closer`) and `text` (best first; BM25 scores), fused by
// `params`, best first, equal scores by id. Each list's ids are distinct.
std::vector<FusedHit> FuseResults(absl::Span<const RetrievedHit> vector,
                                  bool larger_closer,
                                  absl::Span<const RetrievedHit> text,
                                  const FusionParams& params);

}  // namespace knnd

#endif  // KNND_INDEX_HYBRID_FUSION_H_
