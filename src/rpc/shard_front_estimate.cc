#include "knnd/rpc/shard_front_estimate.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "knnd/base/saturating.h"
#include "knnd/index/get_records.h"
#include "knnd/rpc/shard_merge.h"

namespace knnd {
namespace {

using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// A result entry of a shard's answer: its id and two distances.
constexpr int64_t kShardEntryBytes = 8 + 4 + 4;
// A hybrid answer's entry adds each retriever's rank and score.
constexpr int64_t kHybridEntryBytes = 4 + 4 + 4 + 4;
// A merged result: id and distance, and the merge's pointer to its payload.
constexpr int64_t kMergedEntryBytes = 8 + 4 + 8;
// One candidate in the merge's per-query working set (shard_merge.cc).
constexpr int64_t kMergeCandidateBytes = 24;
// A payload's tag and length in an answer (a length under 2^28: 4 bytes).
constexpr int64_t kPayloadFramingBytes = 1 + 4;

absl::Status OutOfRange(const char* field, int64_t value, int64_t lo,
                        int64_t hi, const char* why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "reports ", field, "=", value, ", outside [", lo, ", ", hi, "]", why));
}

}  // namespace

int64_t FrontQueries(const SearchRequest& request, int64_t dim) {
  const int64_t values =
      request.vectors_size() > 0
          ? request.vectors_size()
          : static_cast<int64_t>(request.vectors_f32le().size() / 4 +
                                 request.vectors_f16le().size() / 2 +
                                 request.vectors_bf16le().size() / 2);
  return std::max<int64_t>(
      {1, values / std::max<int64_t>(1, dim), int64_t{request.texts_size()}});
}

absl::StatusOr<FrontDemand> EstimateFrontSearch(const SearchRequest& request,
                                                const FrontFacts& facts) {
  FrontDemand demand;
  SearchAdmission::Shape& shape = demand.shape;
  shape.queries = FrontQueries(request, facts.dim);
  shape.k = request.k();
  shape.refine_factor = request.has_refine_factor()
                            ? int64_t{request.refine_factor()}
                            : facts.default_refine_factor;
  shape.nprobe = request.has_nprobe() ? int64_t{request.nprobe()} : 0;
  shape.payloads = request.has_payloads();
  // The shards' own checks, made here first: what they would refuse is
  // refused before anything is counted or sent.
  if (shape.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("k=", shape.k, " must be positive"));
  }
  if (facts.limits_known) {
    if (shape.queries > facts.max_queries_per_request) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_queries=", shape.queries, " exceeds max_queries_per_request=",
          facts.max_queries_per_request, " (the shards' limit)"));
    }
    if (shape.k > facts.max_k) {
      return absl::InvalidArgumentError(
          absl::StrCat("k=", shape.k, " exceeds max_k=", facts.max_k,
                       " (the shards' limit)"));
    }
    if (request.has_refine_factor() &&
        shape.refine_factor > facts.max_refine_factor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "refine_factor=", shape.refine_factor, " is outside [0, ",
          facts.max_refine_factor, "] (max_refine_factor, the shards' limit)"));
    }
  }
  const bool hybrid = request.texts_size() > 0;
  const HybridMerge windows = hybrid ? HybridMergeOf(request) : HybridMerge();
  if (hybrid && facts.limits_known) {
    for (auto [name, window] :
         {std::pair{"vector_window", windows.vector_window},
          std::pair{"text_window", windows.text_window}}) {
      if (window > facts.max_k) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "=", window, " exceeds max_k=", facts.max_k,
                         " (the shards' limit)"));
      }
    }
  }
  const int64_t shards = static_cast<int64_t>(facts.shards.size());
  const bool payloads = shape.payloads;
  // A filtered shard answers its k best exact distances; otherwise, with
  // re-ranking, its refine_factor * k candidates (AnswersWithCandidates);
  // a hybrid one its windows (shard_merge.h), each entry with its ranks
  // and scores.
  const int64_t width =
      hybrid ? SatAdd(windows.vector_window, windows.text_window)
      : request.has_filter()
          ? shape.k
          : SatMul(shape.k, std::max<int64_t>(1, shape.refine_factor));
  const int64_t entries = SatMul(shape.queries, width);
  const int64_t results = SatMul(shape.queries, shape.k);

  const int64_t request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  int64_t bytes = SatMul(SatAdd(1, shards), request_bytes);
  int64_t largest_payload = 0;
  for (const ShardBounds& shard : facts.shards) {
    int64_t entry =
        hybrid ? kShardEntryBytes + kHybridEntryBytes : kShardEntryBytes;
    if (payloads) {
      entry =
          SatAdd(entry, SatAdd(shard.max_payload_bytes, kPayloadFramingBytes));
    }
    const int64_t answer =
        std::min(SatAdd(kAnswerHeaderBytes, SatMul(entries, entry)),
                 shard.max_answer_bytes);
    // Received, then parsed (its payload strings have their own headers).
    bytes = SatAdd(bytes, SatMul(2, answer));
    if (payloads) {
      bytes = SatAdd(bytes, SatMul(entries, kPayloadEntryOverheadBytes));
    }
    largest_payload = std::max(largest_payload, shard.max_payload_bytes);
  }
  // The merge's candidates of one query, and the merged answer.
  bytes = SatAdd(bytes, SatMul(shards, width, kMergeCandidateBytes));
  bytes = SatAdd(bytes,
                 SatMul(results, hybrid ? kMergedEntryBytes + kHybridEntryBytes
                                        : kMergedEntryBytes));
  int64_t sent = SatAdd(SatMul(results, 12), kAnswerHeaderBytes);
  if (payloads) {
    bytes = SatAdd(bytes, std::min(SatMul(results, largest_payload),
                                   facts.max_send_message_bytes));
    bytes = SatAdd(bytes, SatMul(results, kPayloadEntryOverheadBytes));
    sent = std::min(SatAdd(SatMul(results, SatAdd(12 + kPayloadFramingBytes,
                                                  largest_payload)),
                           kAnswerHeaderBytes),
                    facts.max_send_message_bytes);
  }
  // The answer serialised for the caller.
  demand.bytes = SatAdd(bytes, sent);
  return demand;
}

absl::StatusOr<FrontDemand> EstimateFrontGet(
    const knnd::v1::GetRequest& request, const FrontFacts& facts) {
  const absl::Span<const int64_t> ids(request.ids().data(),
                                      request.ids().size());
  if (absl::Status s = CheckGetIds(ids, facts.max_get_ids); !s.ok()) return s;
  FrontDemand demand;
  demand.shape.queries = 1;
  demand.shape.payloads = request.has_payloads();
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t shards = static_cast<int64_t>(facts.shards.size());
  int64_t bytes =
      SatMul(SatAdd(1, shards), static_cast<int64_t>(request.ByteSizeLong()));
  int64_t answers = 0;
  for (const ShardBounds& shard : facts.shards) {
    int64_t answer = shard.max_answer_bytes;
    if (!request.with_attributes()) {
      int64_t record = 24;
      if (request.has_payloads()) {
        record = SatAdd(record,
                        SatAdd(shard.max_payload_bytes, kPayloadFramingBytes));
      }
      if (request.with_vectors()) {
        record = SatAdd(record, SatAdd(SatMul(facts.dim, 4), 6));
      }
      answer = std::min(answer, SatAdd(kAnswerHeaderBytes, SatMul(n, record)));
    }
    demand.shard_answer_bytes.push_back(answer);
    answers = SatAdd(answers, answer);
  }
  bytes = SatAdd(bytes, SatMul(2, answers));
  demand.bytes = SatAdd(bytes, std::min(answers, facts.max_send_message_bytes));
  return demand;
}

absl::Status CheckShardDeclared(const GetIndexInfoResponse& info,
                                int64_t max_shard_response_bytes) {
  if (info.max_payload_bytes() < 0 ||
      info.max_payload_bytes() > max_shard_response_bytes) {
    return OutOfRange("max_payload_bytes", info.max_payload_bytes(), 0,
                      max_shard_response_bytes,
                      " (no answer the front receives, at most "
                      "max_shard_response_bytes, holds a larger payload)");
  }
  if (info.max_send_message_bytes() < 0) {
    return OutOfRange("max_send_message_bytes", info.max_send_message_bytes(),
                      0, std::numeric_limits<int64_t>::max(), "");
  }
  if (info.dim() > kInt32Max) {
    return OutOfRange("dim", info.dim(), 1, kInt32Max, "");
  }
  if (info.max_k() < 0) {
    return OutOfRange("max_k", info.max_k(), 0, kInt32Max, "");
  }
  if (info.default_refine_factor() > info.max_refine_factor()) {
    return OutOfRange("default_refine_factor", info.default_refine_factor(), 0,
                      info.max_refine_factor(), " (max_refine_factor)");
  }
  return absl::OkStatus();
}

absl::Status CheckAnswerWithinBounds(const SearchResponse& answer,
                                     const ShardBounds& bounds,
                                     const std::string& name) {
  for (int i = 0; i < answer.payloads_size(); ++i) {
    const int64_t size = static_cast<int64_t>(answer.payloads(i).size());
    if (size <= bounds.max_payload_bytes) continue;
    const bool declared =
        bounds.version > 0 && answer.index_version() == bounds.version;
    const std::string what = absl::StrCat(
        name, " answered a payload of ", size, " bytes (result ", i,
        ") of version ", answer.index_version(), ", more than the ",
        "max_payload_bytes=", bounds.max_payload_bytes);
    if (declared) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " it reported for that version; the answer is refused"));
    }
    return absl::UnavailableError(absl::StrCat(
        what, " the front knows of it (",
        bounds.version > 0
            ? absl::StrCat("reported for version ", bounds.version)
            : std::string("another shard's: it has not answered a poll"),
        "); retry once the front has polled it"));
  }
  return absl::OkStatus();
}

}  // namespace knnd
