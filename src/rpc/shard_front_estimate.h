// What a front of shards (shard_front.h) counts against its byte budget for
// one Search, and the bounds it holds the shards to so that the count is
// true (docs/api.md, "How a front of shards sizes a request"):
//   - every value comes from the caller (k, refine_factor, the queries) or
//     from a shard over the network (max_payload_bytes, the largest answer
//     it sends), so every product saturates (base/saturating.h) and a
//     saturated estimate is refused by name, never wrapped into a small or
//     negative one that the gate would take;
//   - a shard's GetIndexInfo is bounded before the front counts with it
//     (CheckShardDeclared), and a shard's answer may carry no payload
//     larger than the shard declared (CheckAnswerWithinBounds): what the
//     front admitted is what it holds and forwards;
//   - payloads are sized as knnd over one index sizes them: at most the
//     largest answer the sender may send (each shard's
//     max_send_message_bytes, the front's own for the merged answer), since
//     a larger answer is refused before its payloads are copied.
//
// Thread-safety: pure functions.
#ifndef KNND_RPC_SHARD_FRONT_ESTIMATE_H_
#define KNND_RPC_SHARD_FRONT_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "knnd/rpc/search_admission.h"
#include "knnd/v1/knn_service.pb.h"

namespace knnd {

// What one shard declared in its last GetIndexInfo that passed
// CheckShardDeclared, as the estimate and the check of its answers use it.
struct ShardBounds {
  // The largest payload of one result, in bytes.
  int64_t max_payload_bytes = 0;
  // The largest answer it sends: its max_send_message_bytes, at most the
  // front's max_shard_response_bytes (what the front's channel receives).
  int64_t max_answer_bytes = 0;
  // The version these were reported for; 0 when the shard has never
  // answered a poll and another shard's values stand in for it.
  int64_t version = 0;
};

// What the front knows of its shards when a call arrives.
struct FrontFacts {
  int64_t dim = 0;
  int64_t default_refine_factor = 0;
  // The limits every shard accepts (the lowest of the shards'), when some
  // shard has reported them.
  bool limits_known = false;
  int64_t max_k = 0;
  int64_t max_refine_factor = 0;
  int64_t max_queries_per_request = 0;
  int64_t max_filter_depth = 0;
  int64_t max_get_ids = 0;
  // One per target, in the front's order.
  std::vector<ShardBounds> shards;
  // The front's own max_send_message_bytes: the largest merged answer with
  // payloads it builds (larger ones are refused before payloads are
  // copied).
  int64_t max_send_message_bytes = 0;
};

// What the front asks of its gate for one call; bytes == kSaturated when
// the estimate saturated (refuse it: SearchAdmission::RefuseSaturated).
struct FrontDemand {
  SearchAdmission::Shape shape;
  int64_t bytes = 0;
  // For a Get: per target, the largest answer counted for it, which its
  // answer is held to.
  std::vector<int64_t> shard_answer_bytes;
};

// Bytes the estimate counts for each payload string the front holds
// beyond its characters: the std::string, its pointer in the repeated
// field, and the allocator's header of its characters.
inline constexpr int64_t kPayloadEntryOverheadBytes = 48;
// Bytes of an answer besides its results: the header fields.
inline constexpr int64_t kAnswerHeaderBytes = 64;

// The rows of `request` (its query values / dim, at least 1).
int64_t FrontQueries(const knnd::v1::SearchRequest& request, int64_t dim);

// The demand of `request` on the front:
//   the request, copied for the shards and serialised once per shard
//     (1 + shards) * request bytes
//   per shard i, its answer as received and as parsed
//     2 * min(64 + E * (16 + [payloads] p_i + 5), max_answer_bytes_i)
//     + [payloads] E * kPayloadEntryOverheadBytes
//     where E = queries * k * r, r = max(1, refine_factor) without a
//     filter and 1 with one (a filtered shard answers its k best)
//   the merge: its candidates of one query, shards * k * r * 24, and the
//     merged answer, queries * k * (12 + 8), with payloads
//     min(queries * k * p, max_send_message_bytes) and their strings
//   the answer serialised: queries * k * 12 + 64, with payloads
//     min(queries * k * (12 + p + 5) + 64, max_send_message_bytes)
// (p_i: shard i's max_payload_bytes; p: the largest of them).
// INVALID_ARGUMENT naming the field and the limit when k,
// refine_factor or the number of queries is outside what every shard
// accepts (as the shards would answer, before anything is sent).
absl::StatusOr<FrontDemand> EstimateFrontSearch(
    const knnd::v1::SearchRequest& request, const FrontFacts& facts);

// The demand of a Get of `request` on the front, each shard answering
// for every id (it holds some of them; the others it names missing):
//   the request, copied per shard: (1 + shards) * request bytes
//   per shard i, its answer as received and as parsed: 2 * a_i where
//     a_i = min(max_answer_bytes_i, 64 + n * (24 + [payloads] p_i
//           + [vectors] (dim * 4 + 6))), and max_answer_bytes_i with
//     attributes (no shard declares a bound on them)
//   the merged answer: min(sum a_i, max_send_message_bytes)
// (n: the request's ids). INVALID_ARGUMENT as a shard would answer for
// no ids, a negative id or more than every shard's max_get_ids.
absl::StatusOr<FrontDemand> EstimateFrontGet(
    const knnd::v1::GetRequest& request, const FrontFacts& facts);

// OK when the values of a shard's GetIndexInfo that the front counts with
// are in range: max_payload_bytes in [0, max_shard_response_bytes] (no
// answer the front receives can carry a larger payload),
// max_send_message_bytes and the limits >= 0, dim and max_k within int32,
// default_refine_factor <= max_refine_factor. Else FAILED_PRECONDITION
// naming the field, its value and the range; the front then treats the
// poll as failed and never counts with its values.
absl::Status CheckShardDeclared(const knnd::v1::GetIndexInfoResponse& info,
                                int64_t max_shard_response_bytes);

// OK when every payload of `answer` (from shard `name`) is at most
// bounds.max_payload_bytes. Else, naming the shard, the payload's size and
// the bound: FAILED_PRECONDITION when the answer is of the version the
// bound was declared for (the shard broke its word), UNAVAILABLE when it
// is of another (a new version whose bound the front has not polled yet:
// retry).
absl::Status CheckAnswerWithinBounds(const knnd::v1::SearchResponse& answer,
                                     const ShardBounds& bounds,
                                     const std::string& name);

}  // namespace knnd

#endif  // KNND_RPC_SHARD_FRONT_ESTIMATE_H_
