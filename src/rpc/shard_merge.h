// Merging the answers of the shards of one index into the answer of the
// unsharded index (docs/sharding.md, rules 2 to 4): the checks that the
// answers belong together and the merge itself, as pure functions over
// the response messages, shared by knnd's front (shard_front.h) and its
// tests.
//
// Thread-safety: pure functions.
#ifndef KNND_RPC_SHARD_MERGE_H_
#define KNND_RPC_SHARD_MERGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "knnd/index/hybrid_fusion.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// One shard's answer and the target that gave it (named in errors).
struct ShardAnswer {
  const knnd::v1::SearchResponse* response = nullptr;
  std::string target;
};

// Rule 4: every answer is a shard (its `shard` is set) of one build with
// shard_count == `shard_count`, the shard ids are distinct, and all
// answered with the same index_version, metric, num_queries, nprobe and
// refine_factor; each holds k (the request's) results per query, or with
// re-ranking refine_factor * k candidates with their PQ estimates
// (return_candidates), and, when any answer carries payloads, each holds
// one per result. `answers` may be a subset of the set (partial
// results). FAILED_PRECONDITION naming the targets that disagree
// otherwise.
absl::Status CheckShardAnswers(const std::vector<ShardAnswer>& answers,
                               int shard_count, int k);

// A hybrid request (SearchRequest.texts) as a merger sends it to its
// shards: each shard answers its windows (return_candidates; index/
// hybrid_search.h), and the merge fuses the set's.
struct HybridMerge {
  int64_t k = 0;              // results per query of the merged answer
  int64_t vector_window = 0;  // 0 without vectors
  int64_t text_window = 0;
  FusionParams fusion;
};

// The windows of `request` (texts set) as its shards answer them; its
// rrf_k, weights and windows as the shards resolve them (unset: 60, 0.5
// and k). The values are the caller's, unchecked: a merge runs only on
// answers, which the shards give only to requests within their limits.
HybridMerge HybridMergeOf(const knnd::v1::SearchRequest& request);

// CheckShardAnswers' rule 4 for answers of windows: the same set, version,
// metric, num_queries, nprobe and refine_factor, and each answer
// vector_window + text_window entries per query with their ranks (and
// payloads when any has them). FAILED_PRECONDITION naming the target
// otherwise.
absl::Status CheckHybridAnswers(const std::vector<ShardAnswer>& answers,
                                int shard_count, const HybridMerge& merge);

// The answer of the unsharded index to a hybrid request from its shards'
// windows (checked by CheckHybridAnswers): per query, the vector_window
// best distances over every shard (as MergeShardAnswers orders them) and
// the text_window best BM25 scores (larger first, equal ones by id; a
// shard's scores are the whole corpus's, text/text_index.h), fused by
// FuseResults as one index fuses them; k results with their fused score,
// each retriever's rank over the set and score, and payloads as
// MergeShardAnswers carries them (RESOURCE_EXHAUSTED past
// `max_answer_bytes`). Pads with id -1 and -inf.
absl::Status MergeHybridAnswers(const std::vector<ShardAnswer>& answers,
                                const HybridMerge& merge, bool as_bytes,
                                int64_t max_answer_bytes,
                                knnd::v1::SearchResponse* merged);

// Rules 2 and 3: the k best per query over `answers` (checked by
// CheckShardAnswers), into `merged`'s num_queries, k, ids, distances,
// index_version, serving_version (the lowest of the answers'), metric,
// nprobe and refine_factor. Without re-ranking, the k best distances
// (ascending for L2, descending otherwise; equal ones by ascending id);
// with it, the refine_factor * k best PQ estimates over every shard, then
// the k best exact distances among them. An entry with id < 0 or a NaN
// distance is a missing one. Pads with id -1 and +inf (L2) or -inf. The
// answers' results may come in either form (result_fields.h); `merged`
// holds them as bytes fields when `as_bytes` (the caller's
// results_as_bytes), else as repeated fields. When the answers carry
// payloads (SearchRequest.payloads), each kept result's payload goes with
// it, and a pad's is empty: sized first, and when the answer with them
// would exceed `max_answer_bytes` (the front's max_send_message_bytes; 0:
// no limit) none is copied and the merge answers RESOURCE_EXHAUSTED
// naming both sizes (AnswerTooLarge), as knnd over one index does. OK
// otherwise.
absl::Status MergeShardAnswers(const std::vector<ShardAnswer>& answers, int k,
                               bool as_bytes, int64_t max_answer_bytes,
                               knnd::v1::SearchResponse* merged);

}  // namespace knnd

#endif  // KNND_RPC_SHARD_MERGE_H_
