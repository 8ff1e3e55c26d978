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
