// shard_front_estimate.h: what a front of shards counts for a Search, the
// bounds of what a shard reports, and the check of its answers' payloads.
#include "knnd/rpc/shard_front_estimate.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knnd/base/saturating.h"

namespace knnd {
namespace {

using knnd::v1::GetIndexInfoResponse;
using knnd::v1::SearchRequest;
using knnd::v1::SearchResponse;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int kDim = 32;

// Two shards of an index with vectors and payloads, each sending answers
// of up to 64 MiB, behind a front sending up to 64 MiB.
FrontFacts TwoShards(int64_t payload_bytes) {
  FrontFacts facts;
  facts.dim = kDim;
  facts.default_refine_factor = 0;
  facts.limits_known = true;
  facts.max_k = 1024;
  facts.max_refine_factor = 64;
  facts.max_queries_per_request = 4096;
  facts.max_filter_depth = 16;
  facts.shards = {{payload_bytes, 64 * kMiB, 1}, {payload_bytes, 64 * kMiB, 1}};
  facts.max_send_message_bytes = 64 * kMiB;
  return facts;
}

SearchRequest Request(int queries, int k, uint32_t refine, bool payloads) {
  SearchRequest request;
  request.set_k(k);
  request.set_refine_factor(refine);
  request.set_vectors_f32le(
      std::string(static_cast<size_t>(queries) * kDim * 4, '\0'));
  if (payloads) request.mutable_payloads()->set_all_fields(true);
  return request;
}

// The front knows the limits every shard accepts: what the shards would
// refuse it refuses first, naming the field and the limit (a wrapped
// estimate of k = 2^31 - 1 with refine_factor = 2^32 - 1 used to be
// admitted and sent on).
TEST(ShardFrontEstimate, RefusesWhatTheShardsWouldNamingTheLimit) {
  const FrontFacts facts = TwoShards(100);
  absl::StatusOr<FrontDemand> wide =
      EstimateFrontSearch(Request(1, 2147483647, 4294967295u, false), facts);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.status().message(),
              HasSubstr("k=2147483647 exceeds max_k=1024"));
  absl::StatusOr<FrontDemand> refine =
      EstimateFrontSearch(Request(1, 10, 4294967295u, false), facts);
  EXPECT_THAT(refine.status().message(),
              HasSubstr("refine_factor=4294967295 is outside [0, 64]"));
  absl::StatusOr<FrontDemand> many =
      EstimateFrontSearch(Request(5000, 10, 0, false), facts);
  EXPECT_THAT(
      many.status().message(),
      HasSubstr("num_queries=5000 exceeds max_queries_per_request=4096"));
  EXPECT_THAT(
      EstimateFrontSearch(Request(1, 0, 0, false), facts).status().message(),
      HasSubstr("k=0 must be positive"));
}

// A hybrid request: its queries are its texts when it has no vectors, its
// shards answer both windows with their ranks, and a window past the
// shards' max_k is refused here.
TEST(ShardFrontEstimate, HybridRequestsCountBothWindows) {
  const FrontFacts facts = TwoShards(100);
  SearchRequest texts;
  texts.set_k(10);
  for (int i = 0; i < 7; ++i) texts.add_texts("q");
  EXPECT_EQ(FrontQueries(texts, kDim), 7);
  SearchRequest hybrid = Request(7, 10, 0, false);
  for (int i = 0; i < 7; ++i) hybrid.add_texts("q");
  absl::StatusOr<FrontDemand> narrow = EstimateFrontSearch(hybrid, facts);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  hybrid.set_vector_window(500);
  hybrid.set_text_window(500);
  absl::StatusOr<FrontDemand> wide = EstimateFrontSearch(hybrid, facts);
  ASSERT_TRUE(wide.ok()) << wide.status();
  // 2 shards x 7 queries x 980 more entries, received and parsed.
  EXPECT_GE(wide->bytes - narrow->bytes, 2 * 2 * 7 * 980 * 32);
  hybrid.set_text_window(5000);
  EXPECT_THAT(EstimateFrontSearch(hybrid, facts).status().message(),
              HasSubstr("text_window=5000 exceeds max_k=1024"));
}

// Limits unknown (or as large as a shard may claim): the estimate
// saturates, never wraps into a small or negative one.
TEST(ShardFrontEstimate, SaturatesInsteadOfWrapping) {
  FrontFacts facts = TwoShards(int64_t{1} << 40);
  facts.limits_known = false;
  facts.shards.resize(256, facts.shards.front());
  for (bool payloads : {false, true}) {
    absl::StatusOr<FrontDemand> demand = EstimateFrontSearch(
        Request(1, 2147483647, 4294967295u, payloads), facts);
    ASSERT_TRUE(demand.ok()) << demand.status();
    EXPECT_EQ(demand->bytes, kSaturated) << payloads;
    EXPECT_EQ(demand->shape.k, 2147483647);
    EXPECT_EQ(demand->shape.refine_factor, 4294967295);
  }
}

// Payloads are sized as knnd over one index sizes them: each shard's
// answer at most what it may send, the merged answer at most what the
// front may send. Beyond those caps a larger payload bound changes
// nothing, and 500 queries with payloads of up to 32 KiB over two shards
// fit the default 1 GiB budget (before: 3,373,164,880 bytes, refused).
TEST(ShardFrontEstimate, PayloadsAreBoundedByWhatTheSendersMaySend) {
  const SearchRequest request = Request(500, 10, 10, true);
  absl::StatusOr<FrontDemand> small =
      EstimateFrontSearch(request, TwoShards(32 << 10));
  absl::StatusOr<FrontDemand> large =
      EstimateFrontSearch(request, TwoShards(64 << 10));
  ASSERT_TRUE(small.ok() && large.ok());
  EXPECT_EQ(small->bytes, large->bytes);
  EXPECT_LE(small->bytes, int64_t{1} << 30);
  EXPECT_EQ(small->shape.queries, 500);
  // Each shard's answer counts twice (received, parsed) at its cap.
  EXPECT_GE(small->bytes, 2 * 2 * 64 * kMiB);
  // Without payloads, far less; with fewer shards, less.
  absl::StatusOr<FrontDemand> plain =
      EstimateFrontSearch(Request(500, 10, 10, false), TwoShards(32 << 10));
  ASSERT_TRUE(plain.ok());
  EXPECT_LT(plain->bytes, small->bytes / 10);
  FrontFacts one = TwoShards(32 << 10);
  one.shards.pop_back();
  EXPECT_LT(EstimateFrontSearch(request, one)->bytes, small->bytes);
  // A filtered request's shards answer k per query, not refine * k.
  SearchRequest filtered = Request(500, 10, 10, false);
  filtered.mutable_filter()->mutable_condition()->set_field("genre");
  EXPECT_LT(EstimateFrontSearch(filtered, TwoShards(0))->bytes, plain->bytes);
}

TEST(ShardFrontEstimate, ShardsMustReportValuesTheFrontCanCountWith) {
  GetIndexInfoResponse info;
  info.set_dim(kDim);
  info.set_max_k(1024);
  info.set_max_refine_factor(64);
  info.set_max_payload_bytes(16 << 10);
  info.set_max_send_message_bytes(64 * kMiB);
  EXPECT_TRUE(CheckShardDeclared(info, 256 * kMiB).ok());
  GetIndexInfoResponse lie = info;
  lie.set_max_payload_bytes(int64_t{1} << 62);
  absl::Status status = CheckShardDeclared(lie, 256 * kMiB);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("max_payload_bytes=4611686018427387904, outside [0, "
                        "268435456]"));
  lie = info;
  lie.set_max_payload_bytes(-1);
  EXPECT_FALSE(CheckShardDeclared(lie, 256 * kMiB).ok());
  lie = info;
  lie.set_max_send_message_bytes(-5);
  EXPECT_THAT(CheckShardDeclared(lie, 256 * kMiB).message(),
              HasSubstr("max_send_message_bytes=-5"));
  lie = info;
  lie.set_default_refine_factor(4294967295u);
  EXPECT_THAT(CheckShardDeclared(lie, 256 * kMiB).message(),
              HasSubstr("default_refine_factor=4294967295, outside [0, 64]"));
  lie = info;
  lie.set_dim(4294967295u);
  EXPECT_FALSE(CheckShardDeclared(lie, 256 * kMiB).ok());
}

TEST(ShardFrontEstimate, AnAnswerMayCarryNoPayloadLargerThanItsShardReported) {
  SearchResponse answer;
  answer.set_index_version(3);
  answer.add_payloads(std::string(100, 'x'));
  answer.add_payloads(std::string(300, 'y'));
  EXPECT_TRUE(CheckAnswerWithinBounds(answer, {300, 64 * kMiB, 3}, "s").ok());
  absl::Status broke =
      CheckAnswerWithinBounds(answer, {200, 64 * kMiB, 3}, "shard 1 (t:1)");
  EXPECT_EQ(broke.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(broke.message(),
              HasSubstr("shard 1 (t:1) answered a payload of 300 bytes "
                        "(result 1) of version 3, more than the "
                        "max_payload_bytes=200 it reported"));
  // Of a version the front has not polled yet: retry.
  absl::Status newer =
      CheckAnswerWithinBounds(answer, {200, 64 * kMiB, 2}, "shard 1 (t:1)");
  EXPECT_EQ(newer.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(newer.message(), HasSubstr("reported for version 2"));
}

}  // namespace
}  // namespace knnd
