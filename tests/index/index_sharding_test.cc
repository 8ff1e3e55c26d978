#include "knnd/index/index_sharding.h"

#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knnd {
namespace {

using ::testing::HasSubstr;

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

TEST(PlanShards, RowNumberIdsSplitIntoEqualRowSlices) {
  absl::StatusOr<std::vector<ShardSpec>> plan = PlanShards(Range(10), 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  // [s*n/S, (s+1)*n/S): [0,3) [3,6) [6,10).
  const int64_t bounds[] = {0, 3, 6, 10};
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ((*plan)[s].shard_id, s);
    EXPECT_EQ((*plan)[s].shard_count, 3);
    EXPECT_EQ((*plan)[s].first_id, bounds[s]);
    EXPECT_EQ((*plan)[s].end_id, bounds[s + 1]);
  }
}

TEST(PlanShards, SparseIdsSplitIntoEqualCountsAndCoverEveryId) {
  const std::vector<int64_t> ids = {5, 9, 100, 101, 102, 2000, 2001, 70000};
  absl::StatusOr<std::vector<ShardSpec>> plan = PlanShards(ids, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int> counts(4, 0);
  for (int64_t id : ids) {
    int owners = 0;
    for (const ShardSpec& s : *plan) {
      if (id >= s.first_id && id < s.end_id) {
        ++owners;
        ++counts[s.shard_id];
      }
    }
    EXPECT_EQ(owners, 1) << "id " << id;
  }
  EXPECT_THAT(counts, ::testing::ElementsAre(2, 2, 2, 2));
  EXPECT_EQ(plan->front().first_id, 0);
  EXPECT_EQ(plan->back().end_id, 70001);
}

TEST(PlanShards, RefusesCountsOutOfRangeEmptyShardsAndBadIds) {
  EXPECT_THAT(PlanShards(Range(10), 0).status().message(),
              HasSubstr("--shards=0 is outside [1, 256]"));
  EXPECT_THAT(PlanShards(Range(1000), 257).status().message(),
              HasSubstr("outside [1, 256]"));
  EXPECT_THAT(PlanShards(Range(3), 4).status().message(),
              HasSubstr("exceeds the 3 vectors"));
  EXPECT_THAT(PlanShards(std::vector<int64_t>{1, 1, 2}, 2).status().message(),
              HasSubstr("not distinct"));
  EXPECT_THAT(PlanShards(std::vector<int64_t>{-1, 2}, 2).status().message(),
              HasSubstr("not distinct and >= 0"));
  EXPECT_TRUE(PlanShards(Range(3), 3).ok());
  EXPECT_TRUE(PlanShards(Range(3), 1).ok());
}

TEST(ShardPath, NamesShardAndCount) {
  EXPECT_EQ(ShardPath("/d/index.faiss", 2, 8), "/d/index.faiss.shard-2-of-8");
}

TEST(NewBuildId, SixteenHexDigitsAndFresh) {
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    const std::string id = NewBuildId();
    EXPECT_EQ(id.size(), 16u);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos)
        << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

TEST(SetShardMetadata, RecordsEveryShardField) {
  knnd::v1::IndexMetadata metadata;
  SetShardMetadata(ShardSpec{1, 4, 250, 500}, "00ff", metadata);
  EXPECT_EQ(metadata.shard_id(), 1u);
  EXPECT_EQ(metadata.shard_count(), 4u);
  EXPECT_EQ(metadata.shard_first_id(), 250);
  EXPECT_EQ(metadata.shard_end_id(), 500);
  EXPECT_EQ(metadata.build_id(), "00ff");
}

}  // namespace
}  // namespace knnd
