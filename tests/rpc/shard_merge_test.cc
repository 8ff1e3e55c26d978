#include "knnd/rpc/shard_merge.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/test_util.h"

namespace knnd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using knnd::v1::SearchResponse;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One shard's answer of one query: ids with their (exact) distances and,
// for candidates, their PQ estimates.
SearchResponse Answer(int shard_id, int count, std::vector<int64_t> ids,
                      std::vector<float> distances,
                      std::vector<float> approx = {},
                      knnd::v1::Metric metric = knnd::v1::METRIC_L2,
                      int refine = 0) {
  SearchResponse r;
  r.set_num_queries(1);
  r.set_k(static_cast<int>(ids.size()));
  r.set_index_version(3);
  r.set_serving_version(3 + shard_id);
  r.set_metric(metric);
  r.set_nprobe(4);
  r.set_refine_factor(static_cast<uint32_t>(refine));
  for (int64_t id : ids) r.add_ids(id);
  for (float d : distances) r.add_distances(d);
  for (float a : approx) r.add_approx_distances(a);
  r.mutable_shard()->set_shard_id(static_cast<uint32_t>(shard_id));
  r.mutable_shard()->set_shard_count(static_cast<uint32_t>(count));
  r.mutable_shard()->set_build_id("b1");
  return r;
}

// `r` with its results moved to the bytes fields (results_as_bytes).
SearchResponse AsBytes(SearchResponse r) {
  knnd::testing::MoveResultsToBytes(r);
  return r;
}

std::vector<ShardAnswer> Of(const std::vector<SearchResponse>& responses) {
  std::vector<ShardAnswer> answers;
  for (size_t i = 0; i < responses.size(); ++i) {
    answers.push_back({&responses[i], "t" + std::to_string(i)});
  }
  return answers;
}

TEST(MergeShardAnswers, L2TakesTheSmallestAscendingTiesByIdAndPads) {
  const std::vector<SearchResponse> r = {
      Answer(0, 2, {7, 3, -1}, {1.0f, 2.0f, kInf}),
      Answer(1, 2, {2, 9, 11}, {0.5f, 2.0f, 3.0f})};
  ASSERT_TRUE(CheckShardAnswers(Of(r), 2, 3).ok());
  SearchResponse merged;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 4, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &merged)
                  .ok());
  EXPECT_THAT(merged.ids(), ElementsAre(2, 7, 3, 9));
  EXPECT_THAT(merged.distances(), ElementsAre(0.5f, 1.0f, 2.0f, 2.0f));
  EXPECT_EQ(merged.k(), 4);
  EXPECT_EQ(merged.index_version(), 3);
  EXPECT_EQ(merged.serving_version(), 3);  // the lowest

  SearchResponse padded;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 7, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &padded)
                  .ok());
  EXPECT_THAT(padded.ids(), ElementsAre(2, 7, 3, 9, 11, -1, -1));
  EXPECT_EQ(padded.distances(6), kInf);
}

// Payloads (SearchRequest.payloads) follow their results; a pad's is
// empty; an answer without one per result is refused by name.
TEST(MergeShardAnswers, PayloadsFollowTheirResults) {
  std::vector<SearchResponse> r = {
      Answer(0, 2, {7, 3, -1}, {1.0f, 2.0f, kInf}),
      Answer(1, 2, {2, 9, 11}, {0.5f, 2.0f, 3.0f})};
  for (SearchResponse& answer : r) {
    for (int64_t id : answer.ids()) {
      answer.add_payloads(id < 0 ? "" : "{\"id\":" + std::to_string(id) + "}");
    }
  }
  ASSERT_TRUE(CheckShardAnswers(Of(r), 2, 3).ok());
  SearchResponse merged;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 7, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &merged)
                  .ok());
  EXPECT_THAT(merged.ids(), ElementsAre(2, 7, 3, 9, 11, -1, -1));
  EXPECT_THAT(merged.payloads(),
              ElementsAre("{\"id\":2}", "{\"id\":7}", "{\"id\":3}",
                          "{\"id\":9}", "{\"id\":11}", "", ""));
  // Sized before any payload is copied: exactly the limit fits, a byte
  // less is refused naming both sizes (as knnd over one index does), and
  // the refused answer holds no payload.
  const int64_t size = static_cast<int64_t>(merged.ByteSizeLong());
  SearchResponse fits;
  EXPECT_TRUE(
      MergeShardAnswers(Of(r), 7, /*as_bytes=*/false, size, &fits).ok());
  EXPECT_EQ(fits.payloads_size(), 7);
  SearchResponse refused;
  const absl::Status over =
      MergeShardAnswers(Of(r), 7, /*as_bytes=*/false, size - 1, &refused);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(),
              HasSubstr(absl::StrCat("the answer with its payloads would be ",
                                     size, " bytes")));
  EXPECT_EQ(refused.payloads_size(), 0);
  r[1].mutable_payloads()->RemoveLast();
  EXPECT_THAT(CheckShardAnswers(Of(r), 2, 3).message(),
              HasSubstr("shard 1 (t1) answered 2 payloads for 3 results"));
}

TEST(MergeShardAnswers, InnerProductTakesTheLargestDescending) {
  const std::vector<SearchResponse> r = {
      Answer(0, 2, {1, 2}, {0.9f, 0.1f}, {}, knnd::v1::METRIC_INNER_PRODUCT),
      Answer(1, 2, {5, -1}, {0.5f, -kInf}, {}, knnd::v1::METRIC_INNER_PRODUCT)};
  SearchResponse merged;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 4, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &merged)
                  .ok());
  EXPECT_THAT(merged.ids(), ElementsAre(1, 5, 2, -1));
  EXPECT_EQ(merged.distances(3), -kInf);
}

// With re-ranking the merge keeps the refine*k best PQ estimates over all
// shards (what the unsharded index would re-rank) and then the k best
// exact distances among them: id 8 has the best exact distance of all but
// its estimate ranks it outside the unsharded candidates, so it is not
// returned, as the unsharded index would not return it.
TEST(MergeShardAnswers, RerankingReranksOnlyTheUnshardedCandidates) {
  // k = 1, refine = 2: 2 candidates per shard, 2 kept over both.
  const std::vector<SearchResponse> r = {
      Answer(0, 2, {4, 8}, {3.0f, 0.1f}, {1.0f, 9.0f}, knnd::v1::METRIC_L2, 2),
      Answer(1, 2, {6, 5}, {2.0f, 5.0f}, {1.5f, 2.5f}, knnd::v1::METRIC_L2,
             2)};
  ASSERT_TRUE(CheckShardAnswers(Of(r), 2, 1).ok());
  SearchResponse merged;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &merged)
                  .ok());
  // Candidates by estimate: 4 (1.0), 6 (1.5); by exact distance 6 (2.0).
  EXPECT_THAT(merged.ids(), ElementsAre(6));
  EXPECT_THAT(merged.distances(), ElementsAre(2.0f));
  EXPECT_EQ(merged.refine_factor(), 2u);
}

// Filtered, each shard planned alone: shard 0 searched its few matching
// rows exactly (its estimates are those exact distances), shard 1 scanned
// its lists (PQ estimates). Estimates of the two kinds do not compare, so
// the merge takes the k best exact distances over every candidate: id 4
// (exact 0.5) wins although shard 1's estimate of id 6 (0.1) is smaller.
TEST(MergeShardAnswers, FilteredMergesTheExactDistancesOfEveryCandidate) {
  std::vector<SearchResponse> r = {
      Answer(0, 2, {4, 7}, {0.5f, 4.0f}, {0.5f, 4.0f}, knnd::v1::METRIC_L2,
             2),
      Answer(1, 2, {6, 5}, {2.0f, 3.0f}, {0.1f, 0.2f}, knnd::v1::METRIC_L2,
             2)};
  r[0].set_filter_plan(knnd::v1::FILTER_PLAN_EXACT);
  r[0].set_filter_matched_rows(2);
  r[1].set_filter_plan(knnd::v1::FILTER_PLAN_IVF);
  r[1].set_filter_matched_rows(40);
  ASSERT_TRUE(CheckShardAnswers(Of(r), 2, 1).ok());
  SearchResponse merged;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 2, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &merged)
                  .ok());
  EXPECT_THAT(merged.ids(), ElementsAre(4, 6));
  EXPECT_THAT(merged.distances(), ElementsAre(0.5f, 2.0f));
  EXPECT_EQ(merged.filter_plan(), knnd::v1::FILTER_PLAN_MIXED);
  EXPECT_EQ(merged.filter_matched_rows(), 42u);

  // Shards of this version answer a filtered search with their k best
  // exact distances and no estimates: accepted and merged alike.
  std::vector<SearchResponse> k_best = {
      Answer(0, 2, {4}, {0.5f}, {}, knnd::v1::METRIC_L2, 2),
      Answer(1, 2, {6}, {2.0f}, {}, knnd::v1::METRIC_L2, 2)};
  for (SearchResponse& answer : k_best) {
    answer.set_filter_plan(knnd::v1::FILTER_PLAN_IVF);
  }
  ASSERT_TRUE(CheckShardAnswers(Of(k_best), 2, 1).ok());
  SearchResponse from_k_best;
  ASSERT_TRUE(MergeShardAnswers(Of(k_best), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &from_k_best)
                  .ok());
  EXPECT_THAT(from_k_best.ids(), ElementsAre(4));
  // Unfiltered, the same width is refused: the merge needs candidates.
  for (SearchResponse& answer : k_best) answer.clear_filter_plan();
  EXPECT_FALSE(CheckShardAnswers(Of(k_best), 2, 1).ok());

  // Unfiltered, the same answers merge as the unsharded index would have
  // (its refine * k = 4 best estimates: 6, 5, 4, 7; then exact): the same
  // ids here, but through the estimates: k = 1 with refine 1 keeps only
  // the best estimate, id 6.
  for (SearchResponse& answer : r) {
    answer.clear_filter_plan();
    answer.clear_filter_matched_rows();
    answer.set_refine_factor(1);
  }
  SearchResponse unfiltered;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &unfiltered)
                  .ok());
  EXPECT_THAT(unfiltered.ids(), ElementsAre(6));
  for (SearchResponse& answer : r) {
    answer.set_filter_plan(knnd::v1::FILTER_PLAN_IVF);
  }
  SearchResponse filtered;
  ASSERT_TRUE(MergeShardAnswers(Of(r), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &filtered)
                  .ok());
  EXPECT_THAT(filtered.ids(), ElementsAre(4));
}

// Shards asked for bytes answer with them, or (older ones) with the
// repeated fields: the merge reads both, and writes the form asked for.
TEST(MergeShardAnswers, ReadsAndWritesTheBytesForm) {
  const std::vector<SearchResponse> repeated = {
      Answer(0, 2, {4, 8}, {3.0f, 0.1f}, {1.0f, 9.0f}, knnd::v1::METRIC_L2, 2),
      Answer(1, 2, {6, 5}, {2.0f, 5.0f}, {1.5f, 2.5f}, knnd::v1::METRIC_L2,
             2)};
  const std::vector<SearchResponse> mixed = {AsBytes(repeated[0]),
                                             repeated[1]};
  ASSERT_TRUE(CheckShardAnswers(Of(mixed), 2, 1).ok());
  SearchResponse want;
  ASSERT_TRUE(MergeShardAnswers(Of(repeated), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &want)
                  .ok());
  SearchResponse from_mixed;
  ASSERT_TRUE(MergeShardAnswers(Of(mixed), 1, /*as_bytes=*/false,
                                /*max_answer_bytes=*/0, &from_mixed)
                  .ok());
  EXPECT_EQ(from_mixed.SerializeAsString(), want.SerializeAsString());

  SearchResponse as_bytes;
  ASSERT_TRUE(MergeShardAnswers(Of(mixed), 1, /*as_bytes=*/true,
                                /*max_answer_bytes=*/0, &as_bytes)
                  .ok());
  EXPECT_EQ(as_bytes.ids_size() + as_bytes.distances_size(), 0);
  EXPECT_EQ(as_bytes.SerializeAsString(), AsBytes(want).SerializeAsString());
}

TEST(CheckShardAnswers, RefusesAnswersThatDoNotFormOneSet) {
  {
    std::vector<SearchResponse> r = {Answer(0, 2, {1}, {1}),
                                     Answer(1, 2, {2}, {1})};
    r[1].mutable_shard()->set_build_id("b2");
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("disagree on build_id"));
  }
  {
    const std::vector<SearchResponse> r = {Answer(1, 2, {1}, {1}),
                                           Answer(1, 2, {2}, {1})};
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("shard_id (each shard must appear once)"));
  }
  {
    std::vector<SearchResponse> r = {Answer(0, 2, {1}, {1}),
                                     Answer(1, 2, {2}, {1})};
    r[1].set_index_version(4);
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("disagree on index_version"));
  }
  {
    const std::vector<SearchResponse> r = {Answer(0, 3, {1}, {1}),
                                           Answer(1, 3, {2}, {1})};
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("shard_count (2 targets are configured)"));
  }
  {
    std::vector<SearchResponse> r = {Answer(0, 2, {1}, {1}),
                                     Answer(1, 2, {2}, {1})};
    r[0].clear_shard();
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("target t0 serves a whole index, not a shard"));
  }
  {
    std::vector<SearchResponse> r = {Answer(0, 2, {1}, {1}),
                                     Answer(1, 2, {2}, {1})};
    r[1].set_refine_factor(3);
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("disagree on refine_factor"));
  }
  {
    std::vector<SearchResponse> r = {Answer(0, 2, {1}, {1}),
                                     Answer(1, 2, {2}, {1})};
    r[1].add_ids(5);
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("answered 2 ids, 1 distances"));
  }
  {
    std::vector<SearchResponse> r = {AsBytes(Answer(0, 2, {1}, {1})),
                                     Answer(1, 2, {2}, {1})};
    r[0].mutable_ids_i64le()->push_back('\0');
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("does not hold a whole number of values"));
  }
  {
    // Re-ranked answers without their estimates cannot be merged as the
    // unsharded index would: refused, not merged by exact distances.
    const std::vector<SearchResponse> r = {
        Answer(0, 2, {4, 8}, {3.0f, 0.1f}, {}, knnd::v1::METRIC_L2, 2),
        Answer(1, 2, {6, 5}, {2.0f, 5.0f}, {}, knnd::v1::METRIC_L2, 2)};
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 1).message(),
                HasSubstr("a shard answers 2 per query with their estimates"));
    // And a width that is not refine_factor * k is refused.
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 2).message(),
                HasSubstr("a shard answers 4 per query"));
  }
  {
    // A refine_factor from the network whose product with k overflows 32
    // bits (before, refine * k in int: undefined, and wrapped it could
    // match an answer's width) names the width it would need.
    std::vector<SearchResponse> r = {
        Answer(0, 2, {4, 8}, {3.0f, 0.1f}, {1, 2}),
        Answer(1, 2, {6, 5}, {2.0f, 5.0f}, {1, 2})};
    for (SearchResponse& answer : r) answer.set_refine_factor(2147483649u);
    EXPECT_THAT(CheckShardAnswers(Of(r), 2, 2).message(),
                HasSubstr("a shard answers 4294967298 per query"));
  }
  // A subset (partial results) of one set is fine.
  const std::vector<SearchResponse> one = {Answer(1, 2, {2}, {1})};
  EXPECT_TRUE(CheckShardAnswers(Of(one), 2, 1).ok());
}

// Shards tuned one by one serve different defaults: the refusal names
// every shard with its value and says how to make them agree.
TEST(CheckShardAnswers, DifferentDefaultsNameTheShardsTheValuesAndTheFix) {
  for (const char* field : {"nprobe", "refine_factor"}) {
    std::vector<SearchResponse> r = {
        Answer(0, 2, {1, 2}, {1, 2}, {1, 2}, knnd::v1::METRIC_L2, 2),
        Answer(1, 2, {3, 4, 5, 6}, {1, 2, 3, 4}, {1, 2, 3, 4},
               knnd::v1::METRIC_L2, 4)};
    if (std::string(field) == "nprobe") {
      r[1] = r[0];
      r[1].mutable_shard()->set_shard_id(1);
      r[1].set_nprobe(8);
    }
    const std::string message = std::string(
        CheckShardAnswers(Of(r), 2, 1).message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("disagree on ", field)));
    const bool nprobe = std::string(field) == "nprobe";
    EXPECT_THAT(message, HasSubstr(absl::StrCat("shard 0 (t0): ",
                                                nprobe ? 4 : 2)));
    EXPECT_THAT(message, HasSubstr(absl::StrCat("shard 1 (t1): ",
                                                nprobe ? 8 : 4)));
    EXPECT_THAT(message, HasSubstr("tune the set as one (knnctl tune "
                                   "--index OUT --shards N"));
  }
}

// One shard's windows of one query (a hybrid request asked for them):
// `vector` entries (id, distance) then `text` entries (id, BM25 score).
SearchResponse Windows(int shard_id,
                       std::vector<std::pair<int64_t, float>> vector,
                       std::vector<std::pair<int64_t, float>> text) {
  std::vector<int64_t> ids;
  std::vector<float> scores;
  for (auto [id, d] : vector) {
    ids.push_back(id);
    scores.push_back(d);
  }
  for (auto [id, s] : text) {
    ids.push_back(id);
    scores.push_back(s);
  }
  SearchResponse r = Answer(shard_id, 2, ids, scores);
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool v = i < vector.size();
    r.add_vector_ranks(v && ids[i] >= 0 ? i + 1 : 0);
    r.add_vector_scores(v ? scores[i] : 0);
    r.add_text_ranks(!v && ids[i] >= 0 ? i - vector.size() + 1 : 0);
    r.add_text_scores(v ? 0 : scores[i]);
    r.add_payloads("{\"id\":" + std::to_string(ids[i]) + "}");
  }
  return r;
}

TEST(MergeHybridAnswers, RanksEachRetrieverOverTheSetThenFuses) {
  // Windows of 2: shard 0 holds ids 1-4, shard 1 ids 5-8.
  const std::vector<SearchResponse> responses = {
      Windows(0, {{1, 0.5f}, {2, 0.9f}}, {{3, 4.0f}, {1, 1.0f}}),
      Windows(1, {{5, 0.1f}, {6, 2.0f}}, {{7, 3.0f}, {-1, 0}})};
  knnd::v1::SearchRequest request;
  request.set_k(3);
  request.add_vectors(0);
  request.add_texts("q");
  request.set_vector_window(2);
  request.set_text_window(2);
  const HybridMerge merge = HybridMergeOf(request);
  EXPECT_EQ(merge.fusion.fusion, Fusion::kRrf);
  ASSERT_TRUE(CheckHybridAnswers(Of(responses), 2, merge).ok());
  SearchResponse merged;
  ASSERT_TRUE(MergeHybridAnswers(Of(responses), merge, false, 0, &merged).ok());
  // Vector window over the set: 5 (0.1), 1 (0.5); text: 3 (4.0), 7 (3.0).
  // RRF(60): each 1/61 or 1/62; ties by id.
  EXPECT_THAT(merged.ids(), ElementsAre(3, 5, 1));
  EXPECT_NEAR(merged.distances(0), 1.0 / 61, 1e-7);
  EXPECT_NEAR(merged.distances(2), 1.0 / 62, 1e-7);
  EXPECT_THAT(merged.text_ranks(), ElementsAre(1, 0, 0));
  EXPECT_THAT(merged.vector_ranks(), ElementsAre(0, 1, 2));
  EXPECT_THAT(merged.payloads(),
              ElementsAre("{\"id\":3}", "{\"id\":5}", "{\"id\":1}"));
  EXPECT_EQ(merged.fusion(), knnd::v1::FUSION_RRF);
  EXPECT_EQ(merged.k(), 3);
}

TEST(MergeHybridAnswers, TextsAloneMergeByScoreAndAWrongWidthIsRefused) {
  const std::vector<SearchResponse> responses = {
      Windows(0, {}, {{3, 4.0f}, {1, 1.0f}}),
      Windows(1, {}, {{7, 3.0f}, {8, 3.0f}})};
  knnd::v1::SearchRequest request;
  request.set_k(2);
  request.add_texts("q");
  const HybridMerge merge = HybridMergeOf(request);
  EXPECT_EQ(merge.vector_window, 0);
  SearchResponse merged;
  ASSERT_TRUE(MergeHybridAnswers(Of(responses), merge, true, 0, &merged).ok());
  EXPECT_EQ(merged.fusion(), knnd::v1::FUSION_UNSPECIFIED);
  EXPECT_EQ(merged.ids_i64le().size(), 2 * sizeof(int64_t));
  request.set_text_window(3);
  absl::Status wrong =
      CheckHybridAnswers(Of(responses), 2, HybridMergeOf(request));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(), HasSubstr("vector_window + text_window = 3"));
}

}  // namespace
}  // namespace knnd
