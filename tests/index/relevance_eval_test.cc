#include "knnd/index/relevance_eval.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::ElementsAre;

double Gain(int rank) { return 1.0 / std::log2(rank + 1.0); }  // rank from 1

TEST(FirstDistinctTest, KeepsEachLabelAtItsBestRankAndSkipsEmptyOnes) {
  const std::vector<std::string> labels = {"p1", "p1", "",  "p2",
                                           "p1", "p3", "p4"};
  EXPECT_THAT(FirstDistinct(labels, 3), ElementsAre("p1", "p2", "p3"));
  EXPECT_THAT(FirstDistinct(labels, 10), ElementsAre("p1", "p2", "p3", "p4"));
  EXPECT_TRUE(FirstDistinct({}, 10).empty());
}

TEST(ScoreRankingsTest, ScoresOneQueryAsDefined) {
  // Relevant b and d; ranked a b c d: hits at ranks 2 and 4.
  const std::vector<std::vector<std::string>> ranked = {{"a", "b", "c", "d"}};
  const std::vector<std::vector<std::string>> relevant = {{"d", "b", "x"}};
  const RelevanceScores s = ScoreRankings(ranked, relevant, 10);
  EXPECT_EQ(s.queries, 1);
  EXPECT_DOUBLE_EQ(s.ndcg, (Gain(2) + Gain(4)) / (Gain(1) + Gain(2) + Gain(3)));
  EXPECT_DOUBLE_EQ(s.recall, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.mrr, 0.5);
}

TEST(ScoreRankingsTest, CutsAtKAndCapsTheIdealAtK) {
  // Five relevant labels, k 2: the ideal is two hits at ranks 1 and 2.
  const std::vector<std::vector<std::string>> ranked = {{"x", "a", "b"}};
  const std::vector<std::vector<std::string>> relevant = {
      {"a", "b", "c", "d", "e"}};
  const RelevanceScores s = ScoreRankings(ranked, relevant, 2);
  EXPECT_DOUBLE_EQ(s.ndcg, Gain(2) / (Gain(1) + Gain(2)));
  EXPECT_DOUBLE_EQ(s.recall, 1.0 / 5.0);  // b at rank 3 is past k
  EXPECT_DOUBLE_EQ(s.mrr, 0.5);
}

TEST(ScoreRankingsTest, AveragesOverLabelledQueriesOnly) {
  const std::vector<std::vector<std::string>> ranked = {{"a"}, {"b"}, {"c"}};
  // The second query has no labels: not scored. Repeated labels count once.
  const std::vector<std::vector<std::string>> relevant = {
      {"a", "a"}, {}, {"z"}};
  const RelevanceScores s = ScoreRankings(ranked, relevant, 10);
  EXPECT_EQ(s.queries, 2);
  EXPECT_DOUBLE_EQ(s.ndcg, 0.5);
  EXPECT_DOUBLE_EQ(s.recall, 0.5);
  EXPECT_DOUBLE_EQ(s.mrr, 0.5);
  EXPECT_EQ(ScoreRankings(ranked, {{}, {}, {}}, 10).queries, 0);
  EXPECT_EQ(ScoreRankings(ranked, {{}, {}, {}}, 10).ndcg, 0);
}

}  // namespace
}  // namespace knnd
