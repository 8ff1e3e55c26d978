// Fuzzes what a front of shards counts for a Search (shard_front_estimate.h)
// with every value from the input: the caller's k, refine_factor, nprobe,
// queries and payloads; what the shards reported (limits, payload and
// answer bounds, any int64, 1 to 256 shards); the front's own limit. Also
// the bounds check of a shard's GetIndexInfo and of its answers' payloads.
// Findings: a crash or sanitizer report (a signed overflow is one under
// UBSan), a negative estimate, an estimate below the request's own bytes,
// one that shrinks when a shard is added or k grows, a reported value
// accepted outside its range, or an answer accepted with a payload over
// its bound.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "knnd/base/saturating.h"
#include "knnd/rpc/shard_front_estimate.h"
#include "knnd/v1/knn_service.pb.h"

namespace {

using knnd::FrontFacts;
using knnd::ShardBounds;
using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;

// Small values half of the time (so that limits and shapes often agree
// enough to reach the arithmetic), any non-negative int64 otherwise.
int64_t SmallOrAny(FuzzedDataProvider& in, int64_t small) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, small)
                          : in.ConsumeIntegralInRange<int64_t>(
                                0, std::numeric_limits<int64_t>::max());
}

int64_t Estimate(const SearchRequest& request, const FrontFacts& facts) {
  absl::StatusOr<knnd::FrontDemand> demand =
      knnd::EstimateFrontSearch(request, facts);
  if (!demand.ok()) {
    if (demand.status().code() != absl::StatusCode::kInvalidArgument) {
      std::abort();
    }
    return -1;  // refused by name
  }
  if (demand->bytes < 0) std::abort();
  if (demand->bytes < static_cast<int64_t>(request.ByteSizeLong())) {
    std::abort();
  }
  return demand->bytes;
}

void CheckEstimate(FuzzedDataProvider& in) {
  FrontFacts facts;
  facts.dim = in.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
  facts.default_refine_factor = SmallOrAny(in, 64);
  facts.limits_known = in.ConsumeBool();
  facts.max_k = SmallOrAny(in, 2048);
  facts.max_refine_factor = SmallOrAny(in, 128);
  facts.max_queries_per_request = SmallOrAny(in, 8192);
  facts.max_filter_depth = SmallOrAny(in, 256);
  facts.max_send_message_bytes = SmallOrAny(in, int64_t{1} << 31);
  const int shards = in.ConsumeIntegralInRange<int>(1, 256);
  for (int i = 0; i < shards; ++i) {
    facts.shards.push_back(
        {SmallOrAny(in, 1 << 20), SmallOrAny(in, 1 << 28), SmallOrAny(in, 4)});
  }
  SearchRequest request;
  request.set_k(in.ConsumeIntegral<int32_t>());
  if (in.ConsumeBool())
    request.set_refine_factor(in.ConsumeIntegral<uint32_t>());
  if (in.ConsumeBool()) request.set_nprobe(in.ConsumeIntegral<uint32_t>());
  const size_t vector_bytes = in.ConsumeIntegralInRange<size_t>(0, 1 << 16);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      request.set_vectors_f32le(std::string(vector_bytes, '\0'));
      break;
    case 1:
      request.set_vectors_f16le(std::string(vector_bytes, '\0'));
      break;
    default:
      request.mutable_vectors()->Resize(static_cast<int>(vector_bytes / 4), 0);
  }
  if (in.ConsumeBool()) request.mutable_payloads()->set_all_fields(true);
  if (in.ConsumeBool()) request.mutable_filter()->mutable_condition();
  const int64_t bytes = Estimate(request, facts);
  if (bytes < 0) return;
  // One more shard never costs less.
  FrontFacts more = facts;
  more.shards.push_back(facts.shards.back());
  if (Estimate(request, more) < bytes) std::abort();
  // A larger k never costs less (when it is still accepted).
  if (request.k() < std::numeric_limits<int32_t>::max()) {
    SearchRequest wider = request;
    wider.set_k(request.k() + 1);
    const int64_t wider_bytes = Estimate(wider, facts);
    if (wider_bytes >= 0 && wider_bytes < bytes) std::abort();
  }
}

void CheckDeclared(FuzzedDataProvider& in) {
  GetIndexInfoResponse info;
  info.set_dim(in.ConsumeIntegral<uint32_t>());
  info.set_max_k(in.ConsumeIntegral<int32_t>());
  info.set_max_refine_factor(in.ConsumeIntegral<uint32_t>());
  info.set_default_refine_factor(in.ConsumeIntegral<uint32_t>());
  info.set_max_payload_bytes(in.ConsumeIntegral<int64_t>());
  info.set_max_send_message_bytes(in.ConsumeIntegral<int64_t>());
  const int64_t cap = SmallOrAny(in, int64_t{256} << 20);
  if (!knnd::CheckShardDeclared(info, cap).ok()) return;
  if (info.max_payload_bytes() < 0 || info.max_payload_bytes() > cap ||
      info.max_send_message_bytes() < 0 || info.max_k() < 0 ||
      info.dim() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()) ||
      info.default_refine_factor() > info.max_refine_factor()) {
    std::abort();
  }
}

void CheckAnswer(FuzzedDataProvider& in) {
  const ShardBounds bounds{SmallOrAny(in, 64), 0, SmallOrAny(in, 3)};
  SearchResponse answer;
  answer.set_index_version(SmallOrAny(in, 3));
  int64_t largest = 0;
  const int payloads = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < payloads; ++i) {
    const size_t size = in.ConsumeIntegralInRange<size_t>(0, 100);
    answer.add_payloads(std::string(size, 'x'));
    largest = std::max<int64_t>(largest, static_cast<int64_t>(size));
  }
  const bool ok = knnd::CheckAnswerWithinBounds(answer, bounds, "s").ok();
  if (ok != (largest <= bounds.max_payload_bytes)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      CheckEstimate(in);
      break;
    case 1:
      CheckDeclared(in);
      break;
    default:
      CheckAnswer(in);
  }
  return 0;
}
