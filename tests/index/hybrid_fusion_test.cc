#include "knnd/index/hybrid_fusion.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

TEST(FuseResults, RrfSumsReciprocalRanksAndReportsEachRetrieversRank) {
  const std::vector<RetrievedHit> vector = {{7, 0.1f}, {3, 0.4f}, {9, 0.5f}};
  const std::vector<RetrievedHit> text = {{9, 8.0f}, {4, 2.0f}};
  FusionParams params;
  params.rrf_k = 10;
  const std::vector<FusedHit> fused =
      FuseResults(vector, /*larger_closer=*/false, text, params);
  ASSERT_EQ(fused.size(), 4u);
  // 9: 1/13 + 1/11; 7: 1/11; 4: 1/12; 3: 1/12 (ties by id).
  EXPECT_EQ(fused[0].id, 9);
  EXPECT_DOUBLE_EQ(fused[0].fused, 1.0 / 13 + 1.0 / 11);
  EXPECT_EQ(fused[0].vector_rank, 3u);
  EXPECT_EQ(fused[0].text_rank, 1u);
  EXPECT_EQ(fused[0].vector_score, 0.5f);
  EXPECT_EQ(fused[0].text_score, 8.0f);
  EXPECT_EQ(fused[1].id, 7);
  EXPECT_EQ(fused[2].id, 3);
  EXPECT_EQ(fused[3].id, 4);
  EXPECT_EQ(fused[3].vector_rank, 0u);
}

TEST(FuseResults, WeightedNormalisesEachListTurningDistancesAround) {
  const std::vector<RetrievedHit> vector = {{1, 1.0f}, {2, 3.0f}};  // L2
  const std::vector<RetrievedHit> text = {{2, 10.0f}, {3, 5.0f}};
  FusionParams params;
  params.fusion = Fusion::kWeighted;
  params.vector_weight = 0.25f;
  params.text_weight = 0.75f;
  std::vector<FusedHit> fused = FuseResults(vector, false, text, params);
  ASSERT_EQ(fused.size(), 3u);
  // 2: 0.25 * 0 + 0.75 * 1; 1: 0.25 * 1; 3: 0.75 * 0.
  EXPECT_EQ(fused[0].id, 2);
  EXPECT_DOUBLE_EQ(fused[0].fused, 0.75);
  EXPECT_EQ(fused[1].id, 1);
  EXPECT_DOUBLE_EQ(fused[1].fused, 0.25);
  EXPECT_EQ(fused[2].id, 3);
  EXPECT_DOUBLE_EQ(fused[2].fused, 0.0);
  // Inner product: larger is closer, so 2 (3.0) is the best vector.
  const std::vector<RetrievedHit> similar = {{2, 3.0f}, {1, 1.0f}};
  fused = FuseResults(similar, true, text, params);
  EXPECT_EQ(fused[0].id, 2);
  EXPECT_DOUBLE_EQ(fused[0].fused, 1.0);
  // One-entry lists normalise to 1.
  fused = FuseResults({{{5, 2.0f}}}, false, {}, params);
  EXPECT_DOUBLE_EQ(fused[0].fused, 0.25);
}

TEST(FuseResults, TextAloneKeepsBm25Scores) {
  FusionParams params;
  params.fusion = Fusion::kNone;
  const std::vector<FusedHit> fused =
      FuseResults({}, false, {{{4, 3.5f}, {2, 3.5f}, {8, 1.0f}}}, params);
  ASSERT_EQ(fused.size(), 3u);
  EXPECT_EQ(fused[0].id, 2);  // ties by id
  EXPECT_DOUBLE_EQ(fused[0].fused, 3.5);
  EXPECT_EQ(fused[2].id, 8);
}

}  // namespace
}  // namespace knnd
