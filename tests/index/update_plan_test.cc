#include "knnd/index/update_plan.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace knnd {
namespace {

using ::testing::HasSubstr;
using From = RowSource::From;

TEST(PlanUpdate, KeepsBaseOrderReplacesUpsertsInPlaceAndAppendsAdditions) {
  // Base rows hold ids 10, 11, 12, 13; delete 11, upsert 13, add 20 and 5.
  const std::vector<int64_t> base = {10, 11, 12, 13};
  auto plan =
      PlanUpdate(base, {20, 13, 5}, {11, 99}, "delta.npy", "delete.npy");
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<RowSource> rows = {{From::kBase, 0},
                                       {From::kBase, 2},
                                       {From::kInput, 1},
                                       {From::kInput, 0},
                                       {From::kInput, 2}};
  EXPECT_EQ(plan->rows, rows);
  EXPECT_EQ(plan->ids, std::vector<int64_t>({10, 12, 13, 20, 5}));
  EXPECT_EQ(plan->new_row_of_base, std::vector<int64_t>({0, -1, 1, -1}));
  EXPECT_EQ(plan->new_row_of_input, std::vector<int64_t>({3, 2, 4}));
  EXPECT_EQ(plan->kept, 2);
  EXPECT_EQ(plan->upserted, 1);
  EXPECT_EQ(plan->added, 2);
  EXPECT_EQ(plan->deleted, 1);
  EXPECT_EQ(plan->deletions_absent, 1);
  EXPECT_EQ(plan->absent_deletions, std::vector<int64_t>({99}));
  EXPECT_FALSE(plan->row_ids);
}

TEST(PlanUpdate, NamesTheIdsToDeleteItDidNotFindAndRefusesNegativeOnes) {
  const std::vector<int64_t> base = {10, 11, 12};
  auto plan =
      PlanUpdate(base, {}, {500, 11, 7, 500}, "delta.npy", "delete.npy");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->deleted, 1);
  EXPECT_EQ(plan->absent_deletions, std::vector<int64_t>({7, 500}));
  auto negative = PlanUpdate(base, {}, {11, -3}, "delta.npy", "delete.npy");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(),
              HasSubstr("delete.npy: row 1 holds id -3, which is negative"));
}

TEST(PlanUpdate, RowIdsStayRowIdsUnlessADeletionRenumbers) {
  const std::vector<int64_t> base = {0, 1, 2};
  // Appending and replacing keep every id equal to its row.
  auto append =
      PlanUpdate(base, NextIds(base, 2), {}, "delta.npy", "delete.npy");
  ASSERT_TRUE(append.ok());
  EXPECT_TRUE(append->row_ids);
  EXPECT_EQ(append->ids, std::vector<int64_t>({0, 1, 2, 3, 4}));
  auto replace = PlanUpdate(base, {1}, {}, "delta.npy", "delete.npy");
  ASSERT_TRUE(replace.ok());
  EXPECT_TRUE(replace->row_ids);
  EXPECT_EQ(replace->rows[1], (RowSource{From::kInput, 0}));
  // Deleting row 1 moves row 2 to row 1: its id stays 2, in a table.
  auto remove = PlanUpdate(base, {}, {1}, "delta.npy", "delete.npy");
  ASSERT_TRUE(remove.ok());
  EXPECT_FALSE(remove->row_ids);
  EXPECT_EQ(remove->ids, std::vector<int64_t>({0, 2}));
  // Deleting the last row renumbers nothing.
  auto last = PlanUpdate(base, {}, {2}, "delta.npy", "delete.npy");
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->row_ids);
}

TEST(PlanUpdate, RefusesDuplicateNegativeAndBothDeletedAndGivenIds) {
  const std::vector<int64_t> base = {0, 1};
  EXPECT_THAT(PlanUpdate(base, {4, 4}, {}, "delta.npy", "delete.npy")
                  .status()
                  .message(),
              HasSubstr("delta.npy: id 4 is given twice (rows 0 and 1)"));
  EXPECT_THAT(
      PlanUpdate(base, {-3}, {}, "delta.npy", "delete.npy").status().message(),
      HasSubstr("delta.npy: row 0 holds id -3, which is negative"));
  EXPECT_THAT(
      PlanUpdate(base, {1}, {1}, "delta.npy", "delete.npy").status().message(),
      HasSubstr("id 1 is both deleted and given a vector"));
}

TEST(NextIds, ContinueAfterTheLargestId) {
  EXPECT_EQ(NextIds(std::vector<int64_t>{0, 7, 3}, 2),
            std::vector<int64_t>({8, 9}));
  EXPECT_EQ(NextIds({}, 1), std::vector<int64_t>({0}));
}

}  // namespace
}  // namespace knnd
